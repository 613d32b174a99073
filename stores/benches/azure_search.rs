//! The Azure AI Search adapter's cost per request: planning, deciding and stamping an indexing
//! batch (one ~2 KB document, and the 1 000 actions a batch holds at most), narrowing a search
//! with a client's filter (parsed and written again), and deciding its answer (5 documents of
//! ~2 KB).

use std::collections::BTreeMap;
use std::hint::black_box;

use chrono::Utc;
use criterion::{Criterion, criterion_group, criterion_main};
use lethe_data::records::Scope;
use lethe_stores::azure_search::adapter::read::{Kind, plan_read};
use lethe_stores::azure_search::adapter::write::{decide_batch, plan_batch};
use lethe_stores::azure_search::adapter::{Reader, date_time};
use serde_json::json;

mod common;
use common::{answer_bench, bound_read, prose, snapshot};

fn adapter(c: &mut Criterion) {
    let view = snapshot();
    let now = Utc::now();
    let scope = Scope {
        tenant: "acme",
        subject: Some("u1"),
        bound: true,
        purpose: Some("personalization"),
        category: Some("preference"),
        fold: false,
    };
    let document = |i: u64| {
        json!({"@search.action": "mergeOrUpload", "id": format!("ep-{i}"), "user_id": "u1",
        "text": prose(1650, i), "vec": vec![0.1f32; 16]})
    };
    let nothing_held = BTreeMap::new();
    for (name, n) in [("1 x 2 KB", 1), ("1 000 x 2 KB", 1000)] {
        let batch = json!({ "value": (0..n).map(document).collect::<Vec<_>>() })
            .to_string()
            .into_bytes();
        c.bench_function(
            &format!("azure_search batch: plan + decide + stamp ({name})"),
            |b| {
                b.iter(|| {
                    let planned =
                        plan_batch(black_box(&batch), "id", &scope, Some("user_id")).expect("plan");
                    decide_batch(planned, &scope, &view, &nothing_held, now).expect("allowed")
                })
            },
        );
    }

    let reader = Reader {
        tenant: "acme",
        subject: Some("u1"),
        purpose: None,
    };
    let search = json!({"search": "trip", "filter": "mood eq 'calm' and (n gt 3 or tags/any(t: t eq 'travel'))",
        "select": "id,text", "top": 5, "vectorQueries": [{"kind": "vector", "vector": vec![0.1f32; 16], "fields": "vec", "k": 5}]});
    let serde_json::Value::Object(search) = search else {
        return;
    };
    c.bench_function("azure_search search: parse filter + narrow", |b| {
        b.iter(|| {
            let plan =
                plan_read(Kind::Search, black_box(search.clone()), reader, now).expect("narrow");
            plan.body("id", plan.filter())
        })
    });

    let plan = plan_read(Kind::Search, search, reader, now).expect("narrow");
    let docs: Vec<_> = (0..5u32)
        .map(|i| {
            json!({"@search.score": 1.0 - f64::from(i) / 10.0, "id": format!("ep-{i}"), "text": prose(1650, u64::from(i) + 2),
                "lethe_subject": "u1", "lethe_tenant": "acme", "lethe_purpose": "personalization",
                "lethe_category": "preference", "lethe_layer": "raw",
                "lethe_expires_at": date_time(now + chrono::TimeDelta::hours(1)), "lethe_epoch": 0})
        })
        .collect();
    let answer = json!({ "value": docs }).to_string();
    let ctx = bound_read("azure_search");
    answer_bench(
        c,
        "azure_search search answer: parse + decide + serialise (5 x 2 KB)",
        &answer,
        |value| {
            plan.decide(value, "episodes", "id", &view, &ctx, now)
                .expect("decide")
        },
    );
}

criterion_group!(benches, adapter);
criterion_main!(benches);
