//! The Chroma adapter's cost per request: planning and stamping an `add`, narrowing a `query`,
//! and filtering its answer (10 records of about 2 KB each).

use std::hint::black_box;

use chrono::Utc;
use criterion::{Criterion, criterion_group, criterion_main};
use lethe_data::records::Scope;
use lethe_stores::chroma::adapter::{
    ReadPlan, WriteKind, apply_write, filter_read, held_stamps, narrow_read, plan_write,
};
use serde_json::json;

mod common;
use common::{answer_bench, bound_read, prose, snapshot};

fn adapter(c: &mut Criterion) {
    let view = snapshot();
    let now = Utc::now();
    let text = prose(2000, 1);
    let ids: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
    let add = json!({
        "ids": ids,
        "embeddings": (0..10).map(|_| vec![0.1f32; 16]).collect::<Vec<_>>(),
        "documents": (0..10).map(|_| text.clone()).collect::<Vec<_>>(),
        "metadatas": (0..10).map(|i| json!({"n": i})).collect::<Vec<_>>(),
    })
    .to_string()
    .into_bytes();
    let scope = Scope {
        tenant: "acme",
        subject: Some("u1"),
        bound: true,
        purpose: Some("personalization"),
        category: Some("preference"),
        fold: false,
    };
    let free = held_stamps(br#"{"ids": [], "metadatas": []}"#).expect("held");
    c.bench_function("chroma add: plan + decide + stamp (10 x 2 KB)", |b| {
        b.iter(|| {
            let planned = plan_write(black_box(&add), &scope).expect("plan");
            apply_write(planned, "acme", &view, &free, WriteKind::Add, now).expect("allowed")
        })
    });
    let own = json!({"lethe_subject": "u1", "lethe_tenant": "acme", "lethe_purpose": "personalization",
        "lethe_category": "preference", "lethe_expires_at": now.timestamp() + 3600, "lethe_epoch": 0});
    let held = json!({"ids": ids, "metadatas": (0..10).map(|_| own.clone()).collect::<Vec<_>>()})
        .to_string();
    c.bench_function(
        "chroma upsert over held records: plan + read held stamps + decide + stamp (10 x 2 KB)",
        |b| {
            b.iter(|| {
                let planned = plan_write(black_box(&add), &scope).expect("plan");
                let held = held_stamps(black_box(held.as_bytes())).expect("held");
                apply_write(planned, "acme", &view, &held, WriteKind::Upsert, now).expect("allowed")
            })
        },
    );

    let query = json!({"query_embeddings": [vec![0.1f32; 16]], "n_results": 10, "include": ["documents", "metadatas", "distances"]})
        .to_string()
        .into_bytes();
    c.bench_function("chroma query: narrow", |b| {
        b.iter(|| {
            narrow_read(black_box(&query), "c1", true, "acme", Some("u1"), now).expect("narrow")
        })
    });

    let stamp = json!({"lethe_subject": "u1", "lethe_tenant": "acme", "lethe_purpose": "personalization",
        "lethe_category": "preference", "lethe_expires_at": now.timestamp() + 3600, "lethe_epoch": 0});
    let answer = json!({
        "ids": [ids],
        "documents": [(0..10).map(|_| text.clone()).collect::<Vec<_>>()],
        "metadatas": [(0..10).map(|_| stamp.clone()).collect::<Vec<_>>()],
        "distances": [(0..10).map(|i| i as f64 / 10.0).collect::<Vec<_>>()],
        "embeddings": null,
    })
    .to_string();
    let ctx = bound_read("chroma");
    let plan = ReadPlan {
        nested: true,
        ..ReadPlan::default()
    };
    answer_bench(
        c,
        "chroma query answer: parse + decide + filter + serialise (10 x 2 KB)",
        &answer,
        |value| filter_read(value, &plan, &view, &ctx, now).expect("filter"),
    );
}

criterion_group!(benches, adapter);
criterion_main!(benches);
