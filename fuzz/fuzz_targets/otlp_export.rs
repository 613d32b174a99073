//! An OTLP/HTTP export request as an exporter sends it, protobuf or JSON, gzipped or not (the
//! first byte says): decoded within the limit or refused, then governed for a caller of tenant
//! acme (alice consented, carol under erasure), its ids and names made acme's, and what would be
//! forwarded encodes and decodes again. No span forwarded names carol, each carries one stamp,
//! acme's, under a trace id of acme's making, and every project and session forwarded is acme's.
#![no_main]

use std::collections::BTreeMap;

use chrono::{TimeZone, Utc};
use lethe_stores::otlp::adapter::{
    self, Caller, Encoding, Name, SUBJECT_REF, SpanRules, TENANT,
};
use lethe_stores::otlp::ids;
use lethe_policy::{
    Action, ConsentGrant, PolicySnapshot, RetentionPolicy, RetentionRule, SubjectPolicy,
    SubjectState, SubjectStatus,
};
use libfuzzer_sys::fuzz_target;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};

const LIMIT: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Some((&how, body)) = data.split_first() else {
        return;
    };
    let encoding = if how & 1 == 0 {
        Encoding::Protobuf
    } else {
        Encoding::Json
    };
    let Ok(mut request) = adapter::decode(body, how & 2 != 0, encoding, LIMIT) else {
        return;
    };
    let exporters = ids::own_ids(&mut request, "acme");
    let rules = rules();
    let caller = Caller {
        tenant: "acme",
        bound: (how & 4 != 0).then_some("alice"),
        fold: how & 8 != 0,
    };
    let _ = adapter::subjects(&request, &rules, caller);
    let now = Utc
        .timestamp_opt(1_800_000_000, 0)
        .single()
        .expect("a time");
    let refer = |subject: &str| format!("ref-{subject}");
    let mut governed = adapter::govern(request, &rules, caller, &view(), now, &refer);
    ids::own_names(&mut governed.request, "acme");
    let _ = adapter::contents(&governed.request, &rules);
    let sent = adapter::encode(&governed.request);
    let again = adapter::decode(&sent, false, Encoding::Protobuf, usize::MAX).expect("re-decoded");
    let acmes = |kv: &KeyValue| {
        matches!(kv.value.as_ref().and_then(|v| v.value.as_ref()),
            Some(any_value::Value::StringValue(name)) if name.starts_with("acme/"))
    };
    for resource in &again.resource_spans {
        let projects: Vec<_> = resource
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .filter(|kv| kv.key == ids::PROJECT)
            .collect();
        assert!(projects.len() == 1 && acmes(projects[0]), "one project, acme's");
    }
    for span in again
        .resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .flat_map(|s| &s.spans)
    {
        assert!(
            exporters.contains_key(&hex::encode(&span.trace_id)),
            "a trace id of acme's making"
        );
        let sessions = span
            .attributes
            .iter()
            .filter(|kv| ids::SESSIONS.contains(&kv.key.as_str()));
        assert!(sessions.clone().all(acmes), "sessions are acme's");
        let stamps: Vec<_> = span
            .attributes
            .iter()
            .filter(|kv| kv.key == TENANT)
            .collect();
        assert_eq!(stamps.len(), 1);
        let carols = span.attributes.iter().any(|kv| {
            kv.key == SUBJECT_REF
                && kv.value.as_ref().and_then(|v| v.value.as_ref())
                    == Some(&any_value::Value::StringValue("ref-carol".into()))
        });
        assert!(!carols, "a span of a subject under erasure was forwarded");
    }
});

fn rules() -> SpanRules {
    let names = |names: &[&str]| names.iter().map(|n| Name::of(n).expect("a name")).collect();
    SpanRules {
        subject_attributes: vec!["user.id".into(), "enduser.id".into()],
        content_attributes: names(&["input.value", "output.value", "llm.input_messages.*"]),
        content_events: names(&["gen_ai.*"]),
        structural_attributes: names(&["llm.model_name", "llm.token_count.*", "service.name"]),
        purpose: "personalization".into(),
        category: "preference".into(),
        pseudonymise: true,
        keep_unattributed: false,
        metadata_prefix: None,
    }
}

fn view() -> PolicySnapshot {
    let policy = |status| SubjectPolicy {
        state: SubjectState { status, epoch: 0 },
        grants: vec![ConsentGrant {
            id: "g".into(),
            tenant: "acme".into(),
            subject: "any".into(),
            purpose: "personalization".into(),
            category: "preference".into(),
            actions: [Action::Store, Action::Retrieve].into_iter().collect(),
            granted_at: Utc
                .timestamp_opt(1_700_000_000, 0)
                .single()
                .expect("a time"),
            expires_at: None,
            revoked_at: None,
            policy_version: 1,
            source: "fuzz".into(),
        }],
    };
    let subjects = BTreeMap::from([
        ("alice".to_owned(), policy(SubjectStatus::Active)),
        ("carol".to_owned(), policy(SubjectStatus::Suppressed)),
    ]);
    let retention = RetentionPolicy {
        rules: vec![RetentionRule {
            purpose: "personalization".into(),
            category: "preference".into(),
            layer: None,
            max_age: "30d".parse().expect("a duration"),
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
