//! Policy and requests the adapters' tests share: four subjects of tenant `acme`.

use std::collections::BTreeMap;

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use lethe_policy::{
    Action, ConsentGrant, PolicySnapshot, RetentionPolicy, RetentionRule, SubjectPolicy,
    SubjectState, SubjectStatus,
};
use proptest::prelude::*;
use serde_json::{Value, json};

use crate::data::records::{AdapterError, Scope};

pub fn now() -> DateTime<Utc> {
    Utc.timestamp_opt(1_800_000_000, 0).unwrap()
}

/// The stamp of a record of `subject` (tenant acme, personalization / preference, epoch 0).
pub fn stamp(subject: &str, expires_at: DateTime<Utc>) -> lethe_policy::Stamp {
    lethe_policy::Stamp {
        tenant: "acme".into(),
        subject: subject.into(),
        purpose: "personalization".into(),
        category: "preference".into(),
        layer: lethe_policy::Layer::Raw,
        expires_at,
        epoch: 0,
    }
}

pub fn policy(status: SubjectStatus, actions: &[Action]) -> SubjectPolicy {
    SubjectPolicy {
        state: SubjectState { status, epoch: 0 },
        grants: vec![ConsentGrant {
            id: "g".into(),
            tenant: "acme".into(),
            subject: "any".into(),
            purpose: "personalization".into(),
            category: "preference".into(),
            actions: actions.iter().copied().collect(),
            granted_at: now() - TimeDelta::days(1),
            expires_at: None,
            revoked_at: None,
            policy_version: 1,
            source: "test".into(),
        }],
    }
}

/// alice and bob consented; carol is suppressed; dave may store but not retrieve.
pub fn view() -> PolicySnapshot {
    let all = [Action::Store, Action::Retrieve];
    let subjects = BTreeMap::from([
        ("alice".to_owned(), policy(SubjectStatus::Active, &all)),
        ("bob".to_owned(), policy(SubjectStatus::Active, &all)),
        ("carol".to_owned(), policy(SubjectStatus::Suppressed, &all)),
        (
            "dave".to_owned(),
            policy(SubjectStatus::Active, &[Action::Store]),
        ),
    ]);
    let retention = RetentionPolicy {
        rules: vec![RetentionRule {
            purpose: "personalization".into(),
            category: "preference".into(),
            layer: None,
            max_age: "30d".parse().unwrap(),
            legal_end: None,
        }],
        purpose_ends: vec![],
    };
    PolicySnapshot {
        subjects: BTreeMap::from([("acme".to_owned(), subjects)]),
        retention: BTreeMap::from([("acme".to_owned(), retention)]),
        hidden: Default::default(),
    }
}

/// An adapter error as its stable code (`invalid` for a bad request), to compare in tests.
pub fn code(e: AdapterError) -> &'static str {
    match e {
        AdapterError::Refused(r) => r.first().map_or("refused", |r| r.refusal.code()),
        AdapterError::Invalid(_) => "invalid",
        AdapterError::MissingScope { .. } => "missing_scope",
        AdapterError::UpstreamInvalid(_) => "upstream_invalid",
    }
}

pub fn scope(subject: Option<&'static str>) -> Scope<'static> {
    Scope {
        tenant: "acme",
        subject,
        bound: subject.is_some(),
        purpose: Some("personalization"),
        category: Some("preference"),
        fold: false,
    }
}

/// Arbitrary JSON whose objects use `keys`, and whose strings are the fixtures' names.
pub fn arb_json(keys: Vec<&'static str>) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        proptest::sample::select(vec![
            "alice",
            "carol",
            "acme",
            "personalization",
            "preference",
            "x"
        ])
        .prop_map(|s| json!(s)),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(proptest::sample::select(keys.clone()), inner, 0..6)
                .prop_map(|m| Value::Object(
                    m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
                )),
        ]
    })
}
