//! The Qdrant adapter's cost per request, as `loadtests/bench` sends them: planning, deciding
//! and stamping an upsert of one ~2 KB point over what Qdrant holds, narrowing a `points/query`,
//! and deciding its answer (5 points with ~2 KB payloads).

use std::hint::black_box;

use chrono::Utc;
use criterion::{Criterion, criterion_group, criterion_main};
use lethe_data::records::Scope;
use lethe_stores::qdrant::adapter::read::{
    SearchKind, SearchShape, decide_answer, narrow_search_body,
};
use lethe_stores::qdrant::adapter::{apply_upsert, held_stamps, plan_upsert};
use serde_json::json;

mod common;
use common::{answer_bench, bound_read, prose, snapshot};

fn adapter(c: &mut Criterion) {
    let view = snapshot();
    let now = Utc::now();
    let vector = vec![0.1f32; 16];
    let id = "5c56c793-69f3-4fbf-87e6-c4bf54c28c26";
    let upsert = json!({"points": [{"id": id, "vector": vector, "payload": {"text": prose(1650, 1), "n": 1}}]})
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
    let nothing_held = json!({"result": {"points": [], "next_page_offset": null}}).to_string();
    c.bench_function(
        "qdrant upsert: plan + read held stamps + decide + stamp (1 x 2 KB)",
        |b| {
            b.iter(|| {
                let planned = plan_upsert(black_box(&upsert), &scope, None).expect("plan");
                let held = held_stamps(black_box(nothing_held.as_bytes())).expect("held");
                apply_upsert(planned, "acme", &view, &held, now).expect("allowed")
            })
        },
    );

    let shape = SearchShape {
        kind: SearchKind::Query,
        groups: false,
    };
    let query = json!({"query": vector, "limit": 5, "with_payload": true})
        .to_string()
        .into_bytes();
    c.bench_function("qdrant query: narrow", |b| {
        b.iter(|| {
            narrow_search_body(black_box(&query), shape, "acme", Some("u1"), now).expect("narrow")
        })
    });

    let (_, plan) = narrow_search_body(&query, shape, "acme", Some("u1"), now).expect("narrow");
    let points: Vec<_> = (0..5)
        .map(|i| {
            json!({"id": format!("5c56c793-69f3-4fbf-87e6-c4bf54c28c2{i}"), "version": 1, "score": 0.9,
                "payload": {"text": prose(1650, i + 2), "n": i, "lethe_subject": "u1", "lethe_tenant": "acme",
                    "lethe_purpose": "personalization", "lethe_category": "preference",
                    "lethe_expires_at": now.timestamp() + 3600, "lethe_epoch": 0}})
        })
        .collect();
    let answer = json!({"result": {"points": points}, "status": "ok", "time": 0.001}).to_string();
    let ctx = bound_read("qdrant");
    answer_bench(
        c,
        "qdrant query answer: parse + decide + serialise (5 x 2 KB)",
        &answer,
        |value| decide_answer(value, &plan, &view, &ctx, now).expect("decide"),
    );
}

criterion_group!(benches, adapter);
criterion_main!(benches);
