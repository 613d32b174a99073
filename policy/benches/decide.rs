//! The cost of one decision, on a snapshot shaped like a real tenant's: a subject with several
//! grants, a dozen retention rules, and a few thousand other subjects in the snapshot.

use std::collections::BTreeMap;
use std::hint::black_box;

use chrono::{DateTime, TimeZone, Utc};
use criterion::{Criterion, criterion_group, criterion_main};
use lethe_policy::audit::{AuditEntry, Links, subject_ref};
use lethe_policy::derivation::QuoteKey;
use lethe_policy::retention::PurposeEnd;
use lethe_policy::{
    Action, ConsentGrant, Layer, PolicySnapshot, ReadContext, RetentionPolicy, RetentionRule,
    Stamp, SubjectPolicy, SubjectState, WriteFacts, decide_read, decide_write,
};

const PURPOSES: [&str; 4] = [
    "personalization",
    "continuity",
    "quality_analysis",
    "training",
];
const CATEGORIES: [&str; 3] = ["preference", "profile", "conversation"];

fn at(day: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 6, day, 0, 0, 0)
        .single()
        .unwrap_or_default()
}

fn snapshot() -> PolicySnapshot {
    let grants = |subject: &str| -> Vec<ConsentGrant> {
        PURPOSES
            .iter()
            .take(3)
            .flat_map(|p| CATEGORIES.iter().map(move |c| (p, c)))
            .map(|(p, c)| ConsentGrant {
                id: format!("{subject}-{p}-{c}"),
                tenant: "acme".into(),
                subject: subject.into(),
                purpose: (*p).into(),
                category: (*c).into(),
                actions: [Action::Store, Action::Retrieve, Action::Embed].into(),
                granted_at: at(1),
                expires_at: Some(at(28)),
                revoked_at: None,
                policy_version: 1,
                source: "bench".into(),
            })
            .collect()
    };
    let subjects = (0..5000)
        .map(|i| format!("user-{i}"))
        .map(|s| {
            let policy = SubjectPolicy {
                state: SubjectState::default(),
                grants: grants(&s),
            };
            (s, policy)
        })
        .collect();
    let rules = PURPOSES
        .iter()
        .flat_map(|p| CATEGORIES.iter().map(move |c| (p, c)))
        .map(|(p, c)| RetentionRule {
            purpose: (*p).into(),
            category: (*c).into(),
            layer: None,
            max_age: "365d".parse().unwrap_or_else(|_| unreachable!()),
            legal_end: None,
        })
        .collect();
    let retention = RetentionPolicy {
        rules,
        purpose_ends: vec![PurposeEnd {
            purpose: "training".into(),
            ends_at: at(20),
        }],
    };
    PolicySnapshot {
        subjects: BTreeMap::from([("acme".to_owned(), subjects)]),
        retention: BTreeMap::from([("acme".to_owned(), retention)]),
        hidden: Default::default(),
    }
}

fn decisions(c: &mut Criterion) {
    let view = snapshot();
    let now = at(10);
    let facts = WriteFacts {
        tenant: "acme",
        subject: "user-2500",
        purpose: "continuity",
        category: "conversation",
        layer: Layer::Raw,
        action: Action::Store,
        authorised_epoch: Some(0),
        requested_expires_at: None,
    };
    c.bench_function("decide_write (allowed)", |b| {
        b.iter(|| decide_write(black_box(&view), black_box(&facts), now))
    });
    let refused = WriteFacts {
        purpose: "training",
        ..facts
    };
    c.bench_function("decide_write (refused: no consent)", |b| {
        b.iter(|| decide_write(black_box(&view), black_box(&refused), now))
    });

    let stamp = Stamp {
        tenant: "acme".into(),
        subject: "user-2500".into(),
        purpose: "continuity".into(),
        category: "conversation".into(),
        layer: Layer::Raw,
        expires_at: at(27),
        epoch: 0,
    };
    let ctx = ReadContext {
        tenant: "acme",
        store: "chroma",
        bound_subject: Some("user-2500"),
        purpose: None,
    };
    c.bench_function("decide_read (allowed)", |b| {
        b.iter(|| {
            decide_read(
                black_box(&view),
                black_box(&ctx),
                Some(black_box(&stamp)),
                now,
            )
        })
    });

    let entry = AuditEntry {
        at: now,
        tenant: Some("acme".into()),
        actor: "dpo@acme".into(),
        action: "consent.grant".into(),
        request_id: "2f1c7b2e-8f8e-4e0a-9d55-0b1b2f3c4d5e".into(),
        subject_ref: Some(subject_ref(b"key", "acme", "user-2500")),
        target: "consent".into(),
        target_ref: Some("cg_0123456789abcdef".into()),
        result: "ok".into(),
        attempt: 1,
    };
    let prev = "0".repeat(64);
    c.bench_function("audit chain_hash", |b| {
        b.iter(|| Links::Keyed(b"audit key").chain_hash(black_box(&prev), 42, black_box(&entry)))
    });
    c.bench_function("audit subject_ref", |b| {
        b.iter(|| subject_ref(b"key", black_box("acme"), black_box("user-2500")))
    });
}

/// About 2 KB of prose, as a memory or a summary is: 330 words of 600 distinct ones.
fn prose(seed: u32) -> String {
    let mut words = Vec::new();
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    for _ in 0..330 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let word = format!("word{}", x % 600);
        words.push(if x.is_multiple_of(7) {
            word.to_uppercase()
        } else {
            word
        });
    }
    words.join(" ")
}

fn fingerprints(c: &mut Criterion) {
    let key = QuoteKey::of_tenant(b"audit-key", "acme");
    let text = prose(1);
    c.bench_function("fingerprints of 2 KB (12-word runs)", |b| {
        b.iter(|| key.fingerprints(black_box(&text), 12))
    });
    let accented = text.replace("word", "wörd");
    c.bench_function("fingerprints of 2 KB, not ASCII (NFKC)", |b| {
        b.iter(|| key.fingerprints(black_box(&accented), 12))
    });
    // Matching: a 2 KB write looked up among the runs of 1 000 served texts.
    let served: std::collections::HashSet<u64> = (0..1000)
        .flat_map(|i| key.fingerprints(&prose(i + 10), 12).runs)
        .collect();
    let write = format!("{} {}", prose(5), &prose(500)[..400]);
    c.bench_function(
        "quote match of a 2 KB write against 1 000 served texts",
        |b| {
            b.iter(|| {
                key.fingerprints(black_box(&write), 12)
                    .runs
                    .iter()
                    .filter(|r| served.contains(r))
                    .count()
            })
        },
    );
}

criterion_group!(benches, decisions, fingerprints);
criterion_main!(benches);
