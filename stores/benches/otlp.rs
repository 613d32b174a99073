//! The OTLP adapter's cost per export request, as an instrumented agent sends them: a batch of 50
//! OpenInference LLM spans (model, token counts, ~1 KB of prompt and answer each) of one
//! consented subject, read (protobuf), governed span by span (subject, consent, content,
//! pseudonym, stamp) and written again for the trace store. The criterion figure is per batch;
//! divided by 50, per span.

use std::hint::black_box;

use chrono::Utc;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use lethe_stores::otlp::adapter::{
    Caller, Encoding, Name, SpanRules, decode, encode, govern, subjects,
};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

// Not every bench uses all of it.
#[allow(dead_code)]
mod common;
use common::{prose, snapshot};

const SPANS: usize = 50;

fn text(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        ..Default::default()
    }
}

fn int(key: &str, value: i64) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::IntValue(value)),
        }),
        ..Default::default()
    }
}

/// One LLM span as OpenInference's OpenAI instrumentation writes it.
fn llm_span(i: usize) -> Span {
    let prompt = prose(500, i as u64 * 2);
    let answer = prose(500, i as u64 * 2 + 1);
    Span {
        trace_id: vec![(i % 5) as u8 + 1; 16],
        span_id: (i as u64 + 1).to_be_bytes().to_vec(),
        name: "ChatCompletion".into(),
        start_time_unix_nano: 1_800_000_000_000_000_000,
        end_time_unix_nano: 1_800_000_001_000_000_000,
        attributes: vec![
            text("openinference.span.kind", "LLM"),
            text("user.id", "u1"),
            text("llm.model_name", "gpt-4o-mini"),
            text("llm.provider", "openai"),
            text(
                "llm.invocation_parameters",
                r#"{"model": "gpt-4o-mini", "temperature": 0}"#,
            ),
            text("input.mime_type", "application/json"),
            text("input.value", &prompt),
            text("llm.input_messages.0.message.role", "user"),
            text("llm.input_messages.0.message.content", &prompt),
            text("output.mime_type", "application/json"),
            text("output.value", &answer),
            text("llm.output_messages.0.message.role", "assistant"),
            text("llm.output_messages.0.message.content", &answer),
            int("llm.token_count.prompt", 120),
            int("llm.token_count.completion", 130),
            int("llm.token_count.total", 250),
        ],
        ..Default::default()
    }
}

fn batch() -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    text("service.name", "agent"),
                    text("openinference.project.name", "agents"),
                ],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans: (0..SPANS).map(llm_span).collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

fn names(names: &[&str]) -> Vec<Name> {
    names.iter().map(|n| Name::of(n).expect("name")).collect()
}

fn adapter(c: &mut Criterion) {
    let view = snapshot();
    let now = Utc::now();
    let rules = SpanRules {
        subject_attributes: vec!["user.id".into(), "enduser.id".into()],
        content_attributes: names(&[
            "input.value",
            "output.value",
            "llm.input_messages.*",
            "llm.output_messages.*",
            "gen_ai.prompt*",
            "gen_ai.completion*",
        ]),
        content_events: names(&["gen_ai.*"]),
        structural_attributes: names(&["llm.model_name", "llm.token_count.*", "service.name"]),
        purpose: "personalization".into(),
        category: "preference".into(),
        pseudonymise: true,
        keep_unattributed: false,
        metadata_prefix: None,
    };
    let caller = Caller {
        tenant: "acme",
        bound: None,
        fold: false,
    };
    // As the route refers to subjects: an HMAC per span.
    let key = b"a 32-byte audit key for benching";
    let refer = |s: &str| lethe_policy::audit::subject_ref(key, "acme", s);
    let body = encode(&batch());
    let mut group = c.benchmark_group("otlp export");
    group.throughput(Throughput::Elements(SPANS as u64));
    group.bench_function(
        "decode + govern + encode (50 OpenInference LLM spans, ~2 KB of content each)",
        |b| {
            b.iter(|| {
                let request =
                    decode(black_box(&body), false, Encoding::Protobuf, 16 << 20).expect("decode");
                let named = subjects(&request, &rules, caller);
                let governed = govern(request, &rules, caller, &view, now, &refer);
                assert_eq!((named.len(), governed.rejected), (1, 0));
                encode(&governed.request)
            })
        },
    );
    group.finish();
}

criterion_group!(benches, adapter);
criterion_main!(benches);
