use std::io::Write;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::{Event, Link};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
use prost::Message;

use super::*;
use crate::kit::fixtures::{now, view};

/// `sent` governed by the route's rules (unattributed spans withheld) for a caller of acme.
fn governed_as(sent: ExportTraceServiceRequest, bound: Option<&'static str>) -> Governed {
    govern(sent, &rules(false), caller(bound), &view(), now(), &refer)
}

fn names(names: &[&str]) -> Vec<Name> {
    names.iter().map(|n| Name::of(n).unwrap()).collect()
}

fn rules(keep_unattributed: bool) -> SpanRules {
    SpanRules {
        subject_attributes: vec!["user.id".into(), "enduser.id".into()],
        content_attributes: names(&["input.value", "output.value", "llm.input_messages.*"]),
        content_events: names(&["gen_ai.*"]),
        structural_attributes: names(&[
            "llm.model_name",
            "llm.token_count.*",
            "exception.type",
            "service.name",
            "gen_ai.response.finish_reasons",
        ]),
        purpose: "personalization".into(),
        category: "preference".into(),
        pseudonymise: true,
        keep_unattributed,
        metadata_prefix: None,
    }
}

fn refer(subject: &str) -> String {
    format!("ref-{subject}")
}

fn attributes(pairs: &[(&str, &str)]) -> Vec<KeyValue> {
    pairs.iter().map(|(k, v)| text(k, v)).collect()
}

/// A span with content in its attributes, a content event, and content in another event and
/// in a link.
fn span(trace: u8, pairs: &[(&str, &str)]) -> Span {
    let mut all = vec![
        ("input.value", "my card is 4111"),
        ("llm.input_messages.0.message.content", "hello"),
        ("llm.model_name", "gpt"),
    ];
    all.extend_from_slice(pairs);
    Span {
        trace_id: vec![trace; 16],
        span_id: vec![trace; 8],
        name: "chat".into(),
        attributes: attributes(&all),
        events: vec![
            Event {
                name: "gen_ai.user.message".into(),
                attributes: attributes(&[("content", "hello")]),
                ..Default::default()
            },
            Event {
                name: "exception".into(),
                attributes: attributes(&[("input.value", "hello"), ("exception.type", "E")]),
                ..Default::default()
            },
        ],
        links: vec![Link {
            trace_id: vec![9; 16],
            span_id: vec![9; 8],
            attributes: attributes(&[("output.value", "bye")]),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn request(resource: &[(&str, &str)], spans: Vec<Span>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: attributes(resource),
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

fn caller(bound: Option<&'static str>) -> Caller<'static> {
    Caller {
        tenant: "acme",
        bound,
        fold: false,
    }
}

fn get(attributes: &[KeyValue], key: &str) -> Option<String> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(string_of)
}

fn spans(request: &ExportTraceServiceRequest) -> Vec<&Span> {
    request
        .resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .flat_map(|s| &s.spans)
        .collect()
}

/// What became of a span: refused, or kept with its content or without it (and why).
#[derive(Debug, PartialEq, Eq)]
enum Became {
    Refused,
    WithContent {
        subject_ref: String,
    },
    Withheld {
        subject_ref: Option<String>,
        why: String,
    },
}

fn became(bound: Option<&'static str>, resource: &[(&str, &str)], own: &[(&str, &str)]) -> Became {
    let governed = governed_as(request(resource, vec![span(7, own)]), bound);
    let Some(span) = spans(&governed.request).first().copied() else {
        assert_eq!(governed.rejected, 1);
        assert!(governed.traced.is_empty());
        return Became::Refused;
    };
    assert_eq!(get(&span.attributes, TENANT).as_deref(), Some("acme"));
    let subject_ref = get(&span.attributes, SUBJECT_REF);
    let content = get(&span.attributes, "input.value").is_some();
    // Content goes whole or not at all: attributes, the content event, other events', links'.
    assert_eq!(
        get(&span.attributes, "llm.input_messages.0.message.content").is_some(),
        content
    );
    assert_eq!(
        span.events.iter().any(|e| e.name.starts_with("gen_ai.")),
        content
    );
    assert_eq!(
        get(&span.events.last().unwrap().attributes, "input.value").is_some(),
        content
    );
    assert_eq!(
        get(&span.links[0].attributes, "output.value").is_some(),
        content
    );
    assert_eq!(
        get(&span.attributes, "llm.model_name").as_deref(),
        Some("gpt"),
        "no content: kept"
    );
    match get(&span.attributes, WITHHELD) {
        None => {
            assert!(content);
            assert!(get(&span.attributes, EXPIRES_AT).is_some());
            assert_eq!(governed.traced.len(), 1);
            assert_eq!(governed.traced[0].0, "07".repeat(16));
            Became::WithContent {
                subject_ref: subject_ref.unwrap_or_default(),
            }
        }
        Some(why) => {
            assert!(!content && governed.traced.is_empty());
            assert!(get(&span.attributes, EXPIRES_AT).is_none());
            Became::Withheld { subject_ref, why }
        }
    }
}

/// Attributes, as (key, text) pairs.
type Pairs = &'static [(&'static str, &'static str)];

fn with_content(subject: &str) -> Became {
    Became::WithContent {
        subject_ref: refer(subject),
    }
}

fn withheld(subject: Option<&str>, why: &str) -> Became {
    Became::Withheld {
        subject_ref: subject.map(refer),
        why: why.into(),
    }
}

#[test]
fn each_span_is_decided_on_its_subject() {
    let cases: &[(&str, Option<&'static str>, Pairs, Pairs, Became)] = &[
        (
            "consented, named by the span",
            None,
            &[],
            &[("user.id", "alice")],
            with_content("alice"),
        ),
        (
            "named by the resource",
            None,
            &[("enduser.id", "alice")],
            &[],
            with_content("alice"),
        ),
        (
            "the span's own name wins",
            None,
            &[("user.id", "alice")],
            &[("user.id", "bob")],
            with_content("bob"),
        ),
        (
            "subject attributes that agree",
            None,
            &[],
            &[("enduser.id", "alice"), ("user.id", "alice")],
            with_content("alice"),
        ),
        (
            "subject attributes that disagree",
            None,
            &[],
            &[("enduser.id", "bob"), ("user.id", "alice")],
            Became::Refused,
        ),
        (
            "a resource naming two subjects",
            None,
            &[("enduser.id", "bob"), ("user.id", "alice")],
            &[("user.id", "alice")],
            Became::Refused,
        ),
        (
            "the bound subject",
            Some("alice"),
            &[],
            &[],
            with_content("alice"),
        ),
        (
            "the bound subject, named",
            Some("alice"),
            &[],
            &[("user.id", "alice")],
            with_content("alice"),
        ),
        (
            "another subject than the bound one",
            Some("alice"),
            &[],
            &[("user.id", "bob")],
            Became::Refused,
        ),
        (
            "another, by the resource",
            Some("alice"),
            &[("user.id", "bob")],
            &[],
            Became::Refused,
        ),
        (
            "suppressed",
            None,
            &[],
            &[("user.id", "carol")],
            // Nothing new is kept of a subject under erasure, as a late write is refused.
            Became::Refused,
        ),
        (
            "suppressed, by the resource",
            None,
            &[("user.id", "carol")],
            &[],
            Became::Refused,
        ),
        (
            "no consent",
            None,
            &[],
            &[("user.id", "erin")],
            withheld(Some("erin"), "consent_required"),
        ),
        ("no subject", None, &[], &[], withheld(None, "unattributed")),
        (
            "a subject not in its one spelling",
            None,
            &[],
            &[("user.id", "a/b")],
            Became::Refused,
        ),
        (
            "another tenant's stamp, on the span",
            None,
            &[],
            &[("user.id", "alice"), ("lethe.tenant", "globex")],
            Became::Refused,
        ),
        (
            "another tenant's stamp, on the resource",
            None,
            &[("lethe.tenant", "globex")],
            &[("user.id", "alice")],
            Became::Refused,
        ),
        (
            "the caller's own tenant, restamped",
            None,
            &[("lethe.tenant", "acme")],
            &[("user.id", "alice")],
            with_content("alice"),
        ),
        (
            "a forged stamp is replaced",
            None,
            &[],
            &[
                ("user.id", "alice"),
                ("lethe.subject_ref", "ref-bob"),
                ("lethe.expires_at", "2999-01-01T00:00:00Z"),
            ],
            with_content("alice"),
        ),
        (
            "a forged withholding is dropped",
            None,
            &[],
            &[("user.id", "alice"), ("lethe.content_withheld", "no")],
            with_content("alice"),
        ),
    ];
    for (what, bound, resource, own, expected) in cases {
        assert_eq!(&became(*bound, resource, own), expected, "{what}");
    }
}

#[test]
fn subject_attributes_carry_the_reference_and_the_stamp_is_lethes_alone() {
    let governed = governed_as(
        request(
            &[
                ("user.id", "alice"),
                ("service.name", "agent"),
                ("input.value", "shared"),
            ],
            vec![span(
                1,
                &[
                    ("user.id", "alice"),
                    ("lethe.expires_at", "2999-01-01T00:00:00Z"),
                ],
            )],
        ),
        None,
    );
    let resource = governed.request.resource_spans[0]
        .resource
        .as_ref()
        .unwrap();
    assert_eq!(
        get(&resource.attributes, "user.id").as_deref(),
        Some("ref-alice")
    );
    assert_eq!(
        get(&resource.attributes, "service.name").as_deref(),
        Some("agent")
    );
    assert!(
        get(&resource.attributes, "input.value").is_none(),
        "no content on a resource, even one whose spans may keep theirs"
    );
    let first = spans(&governed.request)[0];
    assert_eq!(
        get(&first.attributes, "user.id").as_deref(),
        Some("ref-alice")
    );
    let stamped: Vec<&KeyValue> = first
        .attributes
        .iter()
        .filter(|kv| kv.key == EXPIRES_AT)
        .collect();
    assert_eq!(stamped.len(), 1, "one deadline, Lethe's");
    let deadline = governed.traced[0].1.expires_at;
    assert_eq!(
        string_of(stamped[0]),
        Some(deadline.to_rfc3339_opts(SecondsFormat::Millis, true))
    );
    assert!(deadline > now() && deadline <= now() + chrono::TimeDelta::days(30));
    assert_eq!(
        get(&first.attributes, PURPOSE).as_deref(),
        Some("personalization")
    );

    let mut kept = rules(false);
    kept.pseudonymise = false;
    let governed = govern(
        request(&[], vec![span(1, &[("user.id", "alice")])]),
        &kept,
        caller(None),
        &view(),
        now(),
        &refer,
    );
    assert_eq!(
        get(&spans(&governed.request)[0].attributes, "user.id").as_deref(),
        Some("alice")
    );
}

#[test]
fn the_subjects_whose_policy_is_needed_are_every_one_named_or_bound() {
    let mut sent = request(
        &[("user.id", "carol")],
        vec![span(1, &[("enduser.id", "bob")]), span(2, &[])],
    );
    sent.resource_spans.push(
        request(&[], vec![span(3, &[("user.id", "a/b")])])
            .resource_spans
            .remove(0),
    );
    assert_eq!(
        subjects(&sent, &rules(false), caller(Some("alice"))),
        ["alice", "bob", "carol"]
    );
}

#[test]
fn unattributed_spans_keep_their_content_only_when_the_route_says_so() {
    let governed = govern(
        request(&[], vec![span(1, &[])]),
        &rules(true),
        caller(None),
        &view(),
        now(),
        &refer,
    );
    let span = spans(&governed.request)[0];
    assert!(
        get(&span.attributes, "input.value").is_some() && get(&span.attributes, WITHHELD).is_none()
    );
    assert!(governed.traced.is_empty(), "no subject, nothing to record");
}

#[test]
fn a_traces_content_is_read_for_lineage_and_withheld_when_it_derives_from_an_erasure() {
    let mut governed = governed_as(
        request(
            &[],
            vec![
                span(1, &[("user.id", "alice")]),
                span(1, &[("user.id", "alice"), ("output.value", "the answer")]),
                span(2, &[("user.id", "alice")]),
                span(3, &[("user.id", "erin")]),
            ],
        ),
        None,
    );
    let rules = rules(false);
    let contents = contents(&governed.request, &rules);
    let one = hex::encode([1u8; 16]);
    let two = hex::encode([2u8; 16]);
    assert_eq!(contents.keys().collect::<Vec<_>>(), [&one, &two]);
    // Attributes, the content event's attributes, other events' and links' content attributes.
    for text in ["my card is 4111", "the answer", "bye"] {
        assert!(
            contents[&one].contains(text),
            "{text} in {:?}",
            contents[&one]
        );
    }
    assert!(
        !contents[&one].contains("gpt"),
        "not content: the model's name"
    );
    assert_eq!(
        contents[&one].matches("my card is 4111").count(),
        1,
        "a text the trace carries twice is read once"
    );

    adapter_withhold(&mut governed.request, &one, &rules);
    let after = spans(&governed.request);
    for span in after.iter().filter(|s| s.trace_id == vec![1u8; 16]) {
        assert_eq!(
            get(&span.attributes, WITHHELD).as_deref(),
            Some("derived_from_erased")
        );
        assert!(
            get(&span.attributes, "input.value").is_none()
                && get(&span.attributes, EXPIRES_AT).is_none()
        );
        assert!(
            get(&span.attributes, SUBJECT_REF).is_some(),
            "still the subject's, by its stamp"
        );
    }
    let kept = after.iter().find(|s| s.trace_id == vec![2u8; 16]).unwrap();
    assert!(
        get(&kept.attributes, "input.value").is_some()
            && get(&kept.attributes, EXPIRES_AT).is_some()
    );
    // Erin gave no consent: no content, nothing read, and its own reason stays.
    let erins = after.iter().find(|s| s.trace_id == vec![3u8; 16]).unwrap();
    assert_eq!(
        get(&erins.attributes, WITHHELD).as_deref(),
        Some("consent_required")
    );
}

fn adapter_withhold(request: &mut ExportTraceServiceRequest, trace: &str, rules: &SpanRules) {
    let traces = std::collections::BTreeSet::from([trace.to_owned()]);
    withhold_traces(request, &traces, rules, "derived_from_erased");
}

#[test]
fn a_subject_under_erasure_is_named_nowhere_in_what_is_forwarded() {
    let governed = governed_as(
        request(
            &[("user.id", "carol"), ("service.name", "agent")],
            vec![
                span(1, &[]),
                span(2, &[("enduser.id", "carol")]),
                span(3, &[("user.id", "alice")]),
            ],
        ),
        None,
    );
    assert_eq!(governed.rejected, 2, "carol's spans are refused");
    assert!(
        governed
            .refusal
            .as_deref()
            .is_some_and(|r| r.starts_with("subject_suppressed"))
    );
    let resource = governed.request.resource_spans[0]
        .resource
        .as_ref()
        .unwrap();
    assert_eq!(get(&resource.attributes, "user.id"), None);
    assert_eq!(
        get(&resource.attributes, "service.name").as_deref(),
        Some("agent")
    );
    let kept = spans(&governed.request);
    assert_eq!(kept.len(), 1);
    assert_eq!(
        get(&kept[0].attributes, SUBJECT_REF).as_deref(),
        Some("ref-alice")
    );
}

fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn nested(pairs: &[(&str, any_value::Value)]) -> any_value::Value {
    any_value::Value::KvlistValue(opentelemetry_proto::tonic::common::v1::KeyValueList {
        values: pairs.iter().map(|(k, v)| kv(k, v.clone())).collect(),
    })
}

fn list(values: &[any_value::Value]) -> any_value::Value {
    any_value::Value::ArrayValue(opentelemetry_proto::tonic::common::v1::ArrayValue {
        values: values
            .iter()
            .map(|v| AnyValue {
                value: Some(v.clone()),
            })
            .collect(),
    })
}

fn string(text: &str) -> any_value::Value {
    any_value::Value::StringValue(text.into())
}

/// Content sent the ways the outside attack sent it (row 9): nested maps, arrays, a GenAI map,
/// a long text under a structural name, a status message. A span that may not keep content keeps
/// only the structural scalars, whatever the nesting.
fn nested_content_span(subject: &str) -> Span {
    let mut span = span(5, &[("user.id", subject)]);
    span.attributes.extend([
        kv("input", nested(&[("value", string("my card is 4111"))])),
        kv(
            "llm",
            nested(&[(
                "output_messages",
                list(&[nested(&[("content", string("the answer"))])]),
            )]),
        ),
        kv(
            "llm.input_messages",
            list(&[string("hello"), string("again")]),
        ),
        kv("gen_ai", nested(&[("prompt", string("secret prompt"))])),
        kv("retrieval.documents", list(&[string("a document")])),
        kv(
            "llm.token_count.prompt",
            string(&"x".repeat(STRUCTURAL_TEXT + 1)),
        ),
        kv("llm.token_count.total", any_value::Value::IntValue(12)),
        kv("gen_ai.response.finish_reasons", list(&[string("stop")])),
    ]);
    span.status = Some(opentelemetry_proto::tonic::trace::v1::Status {
        message: "failed on my card is 4111".into(),
        code: 2,
    });
    span
}

#[test]
fn without_consent_a_span_keeps_only_its_structural_scalars_at_any_depth() {
    let governed = governed_as(request(&[], vec![nested_content_span("erin")]), None);
    let span = spans(&governed.request)[0];
    let mut keys: Vec<&str> = span.attributes.iter().map(|kv| kv.key.as_str()).collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "gen_ai.response.finish_reasons",
            TENANT,
            WITHHELD,
            PURPOSE,
            SUBJECT_REF,
            "llm.model_name",
            "llm.token_count.total",
            "user.id",
        ]
        .iter()
        .copied()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect::<Vec<_>>(),
        "{:?}",
        span.attributes
    );
    assert_eq!(
        get(&span.attributes, "llm.model_name").as_deref(),
        Some("gpt")
    );
    assert_eq!(
        get(&span.attributes, "user.id").as_deref(),
        Some("ref-erin")
    );
    let status = span.status.as_ref().unwrap();
    assert_eq!((status.code, status.message.as_str()), (2, ""));
    let encoded = format!("{span:?}");
    for text in ["4111", "the answer", "hello", "secret prompt", "a document"] {
        assert!(!encoded.contains(text), "{text} passed");
    }
    // With consent, the same span keeps it all.
    let governed = governed_as(request(&[], vec![nested_content_span("alice")]), None);
    assert!(format!("{:?}", spans(&governed.request)[0]).contains("secret prompt"));
}

#[test]
fn a_map_that_names_a_session_of_its_own_is_dropped_and_other_maps_are_content() {
    let mut sent = span(7, &[("user.id", "alice")]);
    sent.attributes.extend([
        kv(
            "gen_ai",
            nested(&[(
                "conversation",
                nested(&[("id", string("conv-of-another-tenant"))]),
            )]),
        ),
        kv("gen_ai.conversation", nested(&[("id", string("conv-2"))])),
        kv("session", nested(&[("id", string("conv-3"))])),
        kv("session.id.x", string("conv-4")),
        kv("gen_ai.conversation.id.x", string("conv-5")),
        kv("gen_ai", nested(&[("prompt", string("kept with consent"))])),
    ]);
    let governed = governed_as(request(&[], vec![sent]), None);
    let held = format!("{:?}", spans(&governed.request)[0]);
    for name in [
        "conv-of-another-tenant",
        "conv-2",
        "conv-3",
        "conv-4",
        "conv-5",
    ] {
        assert!(!held.contains(name), "{name} passed: {held}");
    }
    assert!(held.contains("kept with consent"), "{held}");
}

#[test]
fn client_attributes_that_would_shadow_the_stamp_or_a_subject_attribute_are_dropped() {
    let mut forged = span(6, &[("user.id", "alice")]);
    forged.attributes.extend([
        kv(
            "lethe",
            nested(&[
                ("tenant", string("globex")),
                ("subject_ref", string("ref-bob")),
                ("expires_at", string("2999-01-01T00:00:00Z")),
            ]),
        ),
        kv("user", nested(&[("id", string("bob"))])),
        kv("user.id.x", string("bob")),
        kv("enduser", nested(&[("id", string("bob"))])),
        kv("user.name", string("kept: it shadows nothing")),
    ]);
    let governed = governed_as(request(&[("lethe", "globex")], vec![forged]), None);
    assert_eq!(governed.rejected, 0);
    let span = spans(&governed.request)[0];
    for key in ["lethe", "user", "user.id.x", "enduser"] {
        assert_eq!(
            span.attributes.iter().filter(|kv| kv.key == key).count(),
            0,
            "{key}"
        );
    }
    assert!(get(&span.attributes, "user.name").is_some());
    assert_eq!(get(&span.attributes, TENANT).as_deref(), Some("acme"));
    assert_eq!(
        get(&span.attributes, SUBJECT_REF).as_deref(),
        Some("ref-alice")
    );
    let resource = governed.request.resource_spans[0]
        .resource
        .as_ref()
        .unwrap();
    assert!(resource.attributes.iter().all(|kv| kv.key != "lethe"));
}

#[test]
fn every_value_naming_the_subject_carries_the_reference_instead() {
    let mut named = span(8, &[("user.id", "alice"), ("session.user", "alice")]);
    named.attributes.push(kv(
        "metadata",
        nested(&[
            ("who", string("alice")),
            ("list", list(&[string("alice"), string("other")])),
        ]),
    ));
    named.events[1].attributes.push(text("by", "alice"));
    let governed = governed_as(request(&[], vec![named]), None);
    let encoded = format!("{:?}", spans(&governed.request)[0]);
    assert!(!encoded.contains("\"alice\""), "{encoded}");
    assert_eq!(encoded.matches("ref-alice").count(), 6, "{encoded}");
}

#[test]
fn a_store_that_keeps_metadata_only_under_a_prefix_gets_the_stamp_there_too() {
    let mut langsmith = rules(false);
    langsmith.metadata_prefix = Some("langsmith.metadata.".into());
    let sent = request(
        &[],
        vec![
            span(
                1,
                &[
                    ("user.id", "alice"),
                    ("langsmith.metadata.lethe_subject_ref", "forged"),
                    ("langsmith.metadata.team", "a"),
                ],
            ),
            span(
                2,
                &[
                    ("user.id", "bob"),
                    ("langsmith.metadata.lethe_tenant", "globex"),
                ],
            ),
        ],
    );
    let mut governed = govern(sent, &langsmith, caller(None), &view(), now(), &refer);
    assert_eq!(
        governed.rejected, 1,
        "another tenant claimed in the store's metadata"
    );
    let one = hex::encode([1u8; 16]);
    let span = spans(&governed.request)[0];
    let metadata = |key: &str| get(&span.attributes, &format!("langsmith.metadata.{key}"));
    assert_eq!(metadata("lethe_subject_ref"), Some(refer("alice")));
    assert_eq!(metadata("lethe_tenant").as_deref(), Some("acme"));
    assert_eq!(metadata("lethe_trace"), Some(one.clone()));
    assert!(metadata("lethe_expires_at").is_some() && metadata("lethe_purpose").is_some());
    assert_eq!(
        metadata("team").as_deref(),
        Some("a"),
        "the app's own metadata stays"
    );
    let stamps = span
        .attributes
        .iter()
        .filter(|kv| kv.key.ends_with("lethe_subject_ref"))
        .count();
    assert_eq!(stamps, 1, "the forged one is gone");

    let traces = std::collections::BTreeSet::from([one]);
    withhold_traces(
        &mut governed.request,
        &traces,
        &langsmith,
        "derived_from_erased",
    );
    let span = spans(&governed.request)[0];
    let metadata = |key: &str| get(&span.attributes, &format!("langsmith.metadata.{key}"));
    assert_eq!(metadata("lethe_expires_at"), None);
    assert_eq!(
        metadata("lethe_content_withheld").as_deref(),
        Some("derived_from_erased")
    );
}

#[test]
fn refused_spans_are_counted_and_the_rest_pass_without_empty_shells() {
    let mut two = request(
        &[],
        vec![
            span(1, &[("user.id", "alice")]),
            span(2, &[("user.id", "bob")]),
        ],
    );
    two.resource_spans.push(
        request(&[("user.id", "bob")], vec![span(3, &[])])
            .resource_spans
            .remove(0),
    );
    let governed = governed_as(two, Some("alice"));
    assert_eq!(governed.rejected, 2);
    assert!(governed.refusal.unwrap().starts_with("scope_violation"));
    assert_eq!(
        governed.request.resource_spans.len(),
        1,
        "the resource left with no span is gone"
    );
    assert_eq!(spans(&governed.request).len(), 1);
    assert_eq!(spans(&governed.request)[0].trace_id, vec![1; 16]);
}

#[test]
fn both_encodings_and_gzip_are_read_within_the_limit() {
    let sent = request(&[("user.id", "alice")], vec![span(9, &[])]);
    let protobuf = encode(&sent);
    assert_eq!(
        decode(&protobuf, false, Encoding::Protobuf, 1 << 20).unwrap(),
        sent
    );
    let json = serde_json::to_vec(&sent).unwrap();
    assert_eq!(decode(&json, false, Encoding::Json, 1 << 20).unwrap(), sent);
    // OTLP/JSON as exporters write it: hex ids, camelCase, enums as numbers.
    let written = br#"{"resourceSpans":[{"resource":{"attributes":[{"key":"user.id","value":{"stringValue":"alice"}}]},
        "scopeSpans":[{"spans":[{"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174",
        "name":"chat","kind":1,"startTimeUnixNano":"1544712660000000000","endTimeUnixNano":"1544712661000000000",
        "attributes":[{"key":"input.value","value":{"stringValue":"hi"}}]}]}]}]}"#;
    let read = decode(written, false, Encoding::Json, 1 << 20).unwrap();
    assert_eq!(
        hex::encode(&spans(&read)[0].trace_id),
        "5b8efff798038103d269b633813fc60c"
    );

    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&protobuf).unwrap();
    let gzipped = gz.finish().unwrap();
    assert_eq!(
        decode(&gzipped, true, Encoding::Protobuf, 1 << 20).unwrap(),
        sent
    );
    assert!(matches!(
        decode(&gzipped, true, Encoding::Protobuf, protobuf.len() - 1),
        Err(DecodeError::TooLarge(_))
    ));
    // A small body that inflates far: refused before it is all inflated.
    let mut bomb = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    bomb.write_all(&vec![0u8; 50 << 20]).unwrap();
    let bomb = bomb.finish().unwrap();
    assert!(bomb.len() < 100 << 10);
    assert!(matches!(
        decode(&bomb, true, Encoding::Protobuf, 1 << 20),
        Err(DecodeError::TooLarge(_))
    ));

    for (body, gzip, encoding) in [
        (&b"\xff\xff\xff"[..], false, Encoding::Protobuf),
        (b"{\"resourceSpans\": 3}", false, Encoding::Json),
        (b"not gzip", true, Encoding::Protobuf),
    ] {
        assert!(
            matches!(
                decode(body, gzip, encoding, 1 << 20),
                Err(DecodeError::Invalid(_))
            ),
            "{body:?}"
        );
    }
}

#[test]
fn the_answer_counts_refused_spans_in_the_exporters_encoding() {
    assert!(
        answer(0, "", Encoding::Protobuf).is_empty(),
        "full success: an empty message"
    );
    let protobuf =
        ExportTraceServiceResponse::decode(&answer(2, "scope_violation", Encoding::Protobuf)[..])
            .unwrap();
    assert_eq!(protobuf.partial_success.unwrap().rejected_spans, 2);
    let json: serde_json::Value =
        serde_json::from_slice(&answer(2, "why", Encoding::Json)).unwrap();
    assert_eq!(json["partialSuccess"]["errorMessage"], "why");
    assert_eq!(
        Encoding::of("application/json; charset=utf-8"),
        Some(Encoding::Json)
    );
    assert_eq!(
        Encoding::of("Application/X-Protobuf"),
        Some(Encoding::Protobuf)
    );
    assert_eq!(Encoding::of("text/plain"), None);
}

#[test]
fn names_are_exact_or_a_beginning() {
    let prefix = Name::of("gen_ai.prompt*").unwrap();
    assert!(prefix.matches("gen_ai.prompt") && prefix.matches("gen_ai.prompt.0.content"));
    assert!(!prefix.matches("gen_ai.completion"));
    let exact = Name::of("input.value").unwrap();
    assert!(exact.matches("input.value") && !exact.matches("input.value.x"));
    for bad in ["", "*", "a*b*", "*x"] {
        assert!(Name::of(bad).is_err(), "{bad}");
    }
}

/// Attributes a client may put on a resource or a span: subjects (of the tenant's people, one
/// suppressed, one unknown, one badly spelled), forged stamps, another tenant's.
fn arb_attributes() -> impl proptest::strategy::Strategy<Value = Vec<(&'static str, &'static str)>>
{
    use proptest::prelude::*;
    let key = prop::sample::select(vec![
        "user.id",
        "enduser.id",
        "lethe.tenant",
        "lethe.subject_ref",
        "lethe.expires_at",
    ]);
    let value = prop::sample::select(vec![
        "alice", "bob", "carol", "erin", "a/b", "acme", "globex",
    ]);
    prop::collection::vec((key, value), 0..4)
}

proptest::proptest! {
    /// Whatever a client sends: every span is forwarded or counted refused; a forwarded span
    /// carries one stamp, the caller's tenant's, and content only when its subject may have it
    /// stored; nothing of another tenant passes, nor another subject of a bound token.
    #[test]
    fn no_span_passes_with_content_it_may_not_keep(
        resources in proptest::collection::vec(
            (arb_attributes(), proptest::collection::vec(arb_attributes(), 0..4)), 1..4),
        bound in proptest::sample::select(vec![None, Some("alice"), Some("carol")]),
    ) {
        let mut sent = ExportTraceServiceRequest::default();
        let mut total = 0;
        for (resource, own) in &resources {
            let spans_of = own.iter().enumerate().map(|(i, pairs)| span(i as u8, pairs)).collect::<Vec<_>>();
            total += spans_of.len() as i64;
            sent.resource_spans.push(request(resource, spans_of).resource_spans.remove(0));
        }
        let governed = governed_as(sent, bound);
        let forwarded = spans(&governed.request);
        proptest::prop_assert_eq!(forwarded.len() as i64 + governed.rejected, total);
        for span in forwarded {
            let tenants: Vec<_> = span.attributes.iter().filter(|kv| kv.key == TENANT).collect();
            proptest::prop_assert_eq!(tenants.len(), 1);
            proptest::prop_assert_eq!(string_of(tenants[0]), Some("acme".to_owned()));
            let reference = get(&span.attributes, SUBJECT_REF);
            // A bound subject's reference, unless it is under erasure: then none at all.
            match bound {
                Some("carol") => proptest::prop_assert_eq!(reference.clone(), None),
                Some(bound) => proptest::prop_assert_eq!(reference.clone(), Some(refer(bound))),
                None => proptest::prop_assert_ne!(reference.as_deref(), Some("ref-carol")),
            }
            let content = get(&span.attributes, "input.value").is_some();
            let may_keep = matches!(reference.as_deref(), Some("ref-alice" | "ref-bob"));
            proptest::prop_assert_eq!(content, may_keep, "{:?}", span.attributes);
            for kv in span.attributes.iter().filter(|kv| rules(false).subject_attributes.contains(&kv.key)) {
                proptest::prop_assert!(string_of(kv).is_some_and(|v| v.starts_with("ref-")));
            }
        }
    }
}

/// The outside attack's second round: a key the trace store reads as another (Phoenix strips
/// each dotted segment), an id that is not OTLP's (left unmapped, it would be shared between
/// tenants), a subject named in an event or a link only.
#[test]
fn a_span_is_refused_when_a_key_reads_otherwise_to_the_store_or_its_ids_are_not_otlps() {
    let refused = |span: Span, resource: &[(&str, &str)]| {
        let governed = governed_as(request(resource, vec![span]), None);
        (governed.rejected, governed.refusal.unwrap_or_default())
    };
    for key in [
        " user.id",
        "user.id ",
        "user. id",
        "\u{a0}lethe.tenant",
        "lethe..tenant",
        "a.\u{1}b",
        ".x",
    ] {
        let (rejected, why) = refused(span(1, &[(key, "bob")]), &[]);
        assert_eq!(
            (rejected, why.starts_with("invalid_request")),
            (1, true),
            "{key:?}"
        );
        assert_eq!(
            refused(span(1, &[]), &[(key, "bob")]).0,
            1,
            "{key:?} on the resource"
        );
    }
    let mut deep = span(1, &[("user.id", "alice")]);
    deep.attributes.push(kv(
        "meta",
        nested(&[(" lethe", nested(&[("tenant", string("globex"))]))]),
    ));
    assert_eq!(refused(deep, &[]).0, 1, "at any depth");
    let mut in_event = span(1, &[]);
    in_event.events[0].attributes.push(text("user.id ", "bob"));
    assert_eq!(refused(in_event, &[]).0, 1, "in an event");
    assert_eq!(
        refused(span(1, &[("my key", "x"), ("a.b_c", "y")]), &[]).0,
        0,
        "inner spaces read the same"
    );

    let ids: [(Vec<u8>, Vec<u8>); 4] = [
        (vec![0; 16], vec![1; 8]),
        (vec![1; 15], vec![1; 8]),
        (vec![1; 16], vec![0; 8]),
        (vec![1; 16], vec![1; 7]),
    ];
    for (trace_id, span_id) in ids {
        let odd = Span {
            trace_id,
            span_id,
            ..span(1, &[])
        };
        assert_eq!(refused(odd, &[]).0, 1);
    }
    let mut parent = span(1, &[]);
    parent.parent_span_id = vec![0; 8];
    assert_eq!(refused(parent, &[]).0, 1);
    let mut link = span(1, &[]);
    link.links[0].trace_id = vec![0; 16];
    assert_eq!(refused(link, &[]).0, 1);
}

#[test]
fn a_subject_named_in_an_event_or_a_link_only_is_the_spans() {
    let named_in = |where_: &str, subject: &str| {
        let mut unattributed = span(1, &[]);
        match where_ {
            "event" => unattributed.events[1]
                .attributes
                .push(text("user.id", subject)),
            _ => unattributed.links[0]
                .attributes
                .push(text("enduser.id", subject)),
        }
        governed_as(request(&[], vec![unattributed]), None)
    };
    for where_ in ["event", "link"] {
        let suppressed = named_in(where_, "carol");
        assert_eq!(suppressed.rejected, 1, "carol is under erasure ({where_})");
        let governed = named_in(where_, "alice");
        let span = spans(&governed.request)[0];
        assert_eq!(
            get(&span.attributes, SUBJECT_REF),
            Some(refer("alice")),
            "{where_}"
        );
        let mut values = span
            .events
            .iter()
            .map(|e| &e.attributes)
            .chain(span.links.iter().map(|l| &l.attributes));
        assert!(
            values.all(|a| a.iter().all(|kv| string_of(kv).as_deref() != Some("alice"))),
            "pseudonymised"
        );
        assert_eq!(governed.traced.len(), 1, "kept with her consent");
    }
    let mut two = span(1, &[("user.id", "alice")]);
    two.events[1].attributes.push(text("user.id", "bob"));
    assert_eq!(
        governed_as(request(&[], vec![two]), None).rejected,
        1,
        "a span is one subject's"
    );
}
