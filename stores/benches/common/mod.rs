//! What the adapters' benches share: one consented subject's policy, and prose.

use std::collections::BTreeMap;

use std::hint::black_box;

use chrono::{TimeDelta, Utc};
use criterion::Criterion;
use lethe_policy::{
    Action, ConsentGrant, PolicySnapshot, RetentionPolicy, RetentionRule, SubjectPolicy,
    SubjectState,
};

/// Subject `u1` of tenant `acme`, with `store` and `retrieve` consent for personalization /
/// preference and a 30-day rule for it.
pub fn snapshot() -> PolicySnapshot {
    let grant = ConsentGrant {
        id: "g".into(),
        tenant: "acme".into(),
        subject: "u1".into(),
        purpose: "personalization".into(),
        category: "preference".into(),
        actions: [Action::Store, Action::Retrieve].into(),
        granted_at: Utc::now() - TimeDelta::days(1),
        expires_at: None,
        revoked_at: None,
        policy_version: 1,
        source: "bench".into(),
    };
    let rule = RetentionRule {
        purpose: "personalization".into(),
        category: "preference".into(),
        layer: None,
        max_age: "30d".parse().expect("age"),
        legal_end: None,
    };
    PolicySnapshot {
        subjects: BTreeMap::from([(
            "acme".to_owned(),
            BTreeMap::from([(
                "u1".to_owned(),
                SubjectPolicy {
                    state: SubjectState::default(),
                    grants: vec![grant],
                },
            )]),
        )]),
        retention: BTreeMap::from([(
            "acme".to_owned(),
            RetentionPolicy {
                rules: vec![rule],
                purpose_ends: vec![],
            },
        )]),
        hidden: Default::default(),
    }
}

/// About `bytes` of words drawn from 100 000, one text per seed (as memories are: the quote
/// fingerprints read words).
pub fn prose(bytes: usize, seed: u64) -> String {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut text = String::with_capacity(bytes + 8);
    while text.len() < bytes {
        // xorshift64*: deterministic, no dependency.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let word = state.wrapping_mul(0x2545_f491_4f6c_dd1d) % 100_000;
        text.push_str(&format!("w{word} "));
    }
    text
}

/// The bound subject `u1`'s reads of `store`.
pub fn bound_read(store: &str) -> lethe_policy::ReadContext<'_> {
    lethe_policy::ReadContext {
        tenant: "acme",
        store,
        bound_subject: Some("u1"),
        purpose: None,
    }
}

/// A store's answer as Lethe handles it: parsed, `decide`d, serialized again.
pub fn answer_bench(
    c: &mut Criterion,
    name: &str,
    answer: &str,
    decide: impl Fn(serde_json::Value) -> serde_json::Value,
) {
    c.bench_function(name, |b| {
        b.iter(|| {
            let value: serde_json::Value = serde_json::from_str(black_box(answer)).expect("json");
            serde_json::to_vec(&decide(value)).expect("serialise")
        })
    });
}
