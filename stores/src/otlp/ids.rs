//! Each tenant's traces are its own in the trace store. A trace store keys traces, spans and
//! projects by what the exporter chose (Phoenix files a span under the trace its id names, in
//! whichever project that trace was first seen; it takes the project from `x-project-name` or
//! `openinference.project.name`), so a tenant that used another's trace id first, or named its
//! project, would pull the other's spans into its own. Every trace and span id is therefore
//! replaced by one of the tenant's own (the first bytes of SHA-256 over a label, the tenant and
//! the exporter's id: the same id of the same tenant always gives the same one, so a trace
//! exported by many services still joins up, and an operator can compute it), and every
//! project and session is named under its tenant (`<tenant>/<name>`; a tenant name has no `/`).

use std::collections::BTreeMap;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use sha2::{Digest, Sha256};

use super::adapter::text;

/// The resource attribute OpenInference names a project with (what Phoenix reads).
pub const PROJECT: &str = "openinference.project.name";
/// The headers trace stores take a project from (Phoenix's, LangSmith's), which win over
/// the resource's.
pub const PROJECT_HEADERS: [&str; 2] = ["x-project-name", "langsmith-project"];
/// The attributes naming a span's session, which Phoenix keys its sessions by over the whole
/// store, in the project of the first trace that named it: OpenInference's, and the GenAI
/// semantic conventions' conversation, which Phoenix takes for the session when a span names
/// none.
pub const SESSIONS: [&str; 2] = ["session.id", "gen_ai.conversation.id"];
/// The project of spans that name none (Phoenix's default).
const DEFAULT_PROJECT: &str = "default";

/// The tenant's id for an exporter's `id` under `label`, as long as it (16 bytes for a trace,
/// 8 for a span); an id of another length, or all zeros (invalid in OTLP), is kept as it is:
/// the span is refused (`adapter::govern`), since the store would take it and share it.
fn owned(label: &[u8], tenant: &str, id: &[u8]) -> Vec<u8> {
    if !matches!(id.len(), 8 | 16) || id.iter().all(|b| *b == 0) {
        return id.to_vec();
    }
    let digest = Sha256::new()
        .chain_update(label)
        .chain_update([0])
        .chain_update(tenant.as_bytes())
        .chain_update([0])
        .chain_update(id)
        .finalize();
    digest[..id.len()].to_vec()
}

/// The trace id the store holds `tenant`'s trace `id` under.
pub fn stored_trace(tenant: &str, id: &[u8]) -> Vec<u8> {
    owned(b"lethe trace", tenant, id)
}

/// The span id the store holds `tenant`'s span `id` under.
pub fn stored_span(tenant: &str, id: &[u8]) -> Vec<u8> {
    owned(b"lethe span", tenant, id)
}

/// The name the store holds `tenant`'s `project` (or session) under.
pub fn stored_project(tenant: &str, project: &str) -> String {
    format!("{tenant}/{project}")
}

/// Gives every trace, span, parent and linked id of `request` its tenant's own. Answers each
/// stored trace id (lowercase hex) with the exporter's own, which a request's `traceparent`
/// names.
pub fn own_ids(request: &mut ExportTraceServiceRequest, tenant: &str) -> BTreeMap<String, String> {
    let mut traces = BTreeMap::new();
    let spans = request
        .resource_spans
        .iter_mut()
        .flat_map(|r| &mut r.scope_spans)
        .flat_map(|s| &mut s.spans);
    for span in spans {
        let stored = stored_trace(tenant, &span.trace_id);
        traces.insert(hex::encode(&stored), hex::encode(&span.trace_id));
        span.trace_id = stored;
        span.span_id = stored_span(tenant, &span.span_id);
        if !span.parent_span_id.is_empty() {
            span.parent_span_id = stored_span(tenant, &span.parent_span_id);
        }
        for link in &mut span.links {
            link.trace_id = stored_trace(tenant, &link.trace_id);
            link.span_id = stored_span(tenant, &link.span_id);
        }
    }
    traces
}

/// Names every resource's project under `tenant` (the default one when it names none, or
/// names it with anything but text), and every span's session (each attribute that names one).
/// After the spans are governed:
/// the names Lethe gives are not the client's to lose to a length limit.
pub fn own_names(request: &mut ExportTraceServiceRequest, tenant: &str) {
    for resource_spans in &mut request.resource_spans {
        let spans = resource_spans
            .scope_spans
            .iter_mut()
            .flat_map(|s| &mut s.spans);
        for span in spans {
            let sessions = span
                .attributes
                .iter_mut()
                .filter(|kv| SESSIONS.contains(&kv.key.as_str()));
            for kv in sessions {
                let session = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(any_value::Value::StringValue(text)) => text.clone(),
                    Some(any_value::Value::IntValue(n)) => n.to_string(),
                    _ => String::new(),
                };
                let key = std::mem::take(&mut kv.key);
                *kv = text(&key, &stored_project(tenant, &session));
            }
        }
        let resource = resource_spans.resource.get_or_insert_with(Default::default);
        let named = resource
            .attributes
            .iter()
            .find(|kv| kv.key == PROJECT)
            .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                any_value::Value::StringValue(name) => Some(name.clone()),
                _ => None,
            });
        resource.attributes.retain(|kv| kv.key != PROJECT);
        let project = stored_project(tenant, named.as_deref().unwrap_or(DEFAULT_PROJECT));
        resource.attributes.push(text(PROJECT, &project));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, span::Link};

    fn request(
        project: Option<&str>,
        trace: [u8; 16],
        span: [u8; 8],
        parent: Vec<u8>,
    ) -> ExportTraceServiceRequest {
        let attributes = project.map(|p| text(PROJECT, p)).into_iter().collect();
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes,
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans: vec![Span {
                        trace_id: trace.to_vec(),
                        span_id: span.to_vec(),
                        parent_span_id: parent,
                        links: vec![Link {
                            trace_id: trace.to_vec(),
                            span_id: span.to_vec(),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    fn project_of(request: &ExportTraceServiceRequest) -> Vec<String> {
        request.resource_spans[0]
            .resource
            .as_ref()
            .unwrap()
            .attributes
            .iter()
            .filter(|kv| kv.key == PROJECT)
            .map(|kv| format!("{:?}", kv.value.as_ref().unwrap().value.as_ref().unwrap()))
            .collect()
    }

    #[test]
    fn the_same_ids_of_two_tenants_are_two_traces_and_of_one_tenant_one() {
        let (trace, span, parent) = ([7; 16], [3; 8], vec![5; 8]);
        let mut acme = request(Some("prod"), trace, span, parent.clone());
        let mut globex = request(Some("prod"), trace, span, parent.clone());
        let mut again = request(None, trace, span, parent.clone());
        let acmes = own_ids(&mut acme, "acme");
        own_ids(&mut globex, "globex");
        own_ids(&mut again, "acme");
        own_names(&mut acme, "acme");
        own_names(&mut globex, "globex");
        own_names(&mut again, "acme");
        let spans =
            |r: &ExportTraceServiceRequest| r.resource_spans[0].scope_spans[0].spans[0].clone();
        let (a, g, b) = (spans(&acme), spans(&globex), spans(&again));
        assert_ne!(a.trace_id, g.trace_id);
        assert_ne!(a.span_id, g.span_id);
        assert_eq!(
            (&a.trace_id, &a.span_id, &a.parent_span_id),
            (&b.trace_id, &b.span_id, &b.parent_span_id)
        );
        assert_eq!(a.trace_id, stored_trace("acme", &trace));
        assert_eq!(a.parent_span_id, stored_span("acme", &parent));
        assert_eq!(
            (&a.links[0].trace_id, &a.links[0].span_id),
            (&a.trace_id, &a.span_id)
        );
        assert_eq!(
            acmes,
            BTreeMap::from([(hex::encode(&a.trace_id), hex::encode(trace))])
        );
        assert_eq!(project_of(&acme), [r#"StringValue("acme/prod")"#]);
        assert_eq!(project_of(&globex), [r#"StringValue("globex/prod")"#]);
        assert_eq!(project_of(&again), [r#"StringValue("acme/default")"#]);
    }

    #[test]
    fn a_root_span_stays_a_root_and_an_invalid_id_is_left_as_it_is() {
        let mut root = request(None, [0; 16], [1; 8], Vec::new());
        own_ids(&mut root, "acme");
        let span = &root.resource_spans[0].scope_spans[0].spans[0];
        assert!(span.parent_span_id.is_empty());
        assert_eq!(span.trace_id, [0; 16]);
        assert_eq!(stored_trace("acme", &[1, 2, 3]), [1, 2, 3]);
    }

    #[test]
    fn every_attribute_a_store_takes_for_a_session_is_named_under_the_tenant() {
        let mut sent = request(None, [7; 16], [3; 8], Vec::new());
        sent.resource_spans[0].scope_spans[0].spans[0].attributes = vec![
            text("session.id", "conv-1"),
            text("gen_ai.conversation.id", "conv-1"),
            text("gen_ai.request.model", "gpt"),
        ];
        own_names(&mut sent, "globex");
        let held: Vec<(String, String)> = sent.resource_spans[0].scope_spans[0].spans[0]
            .attributes
            .iter()
            .map(|kv| {
                let value = kv.value.as_ref().unwrap().value.as_ref().unwrap();
                (kv.key.clone(), format!("{value:?}"))
            })
            .collect();
        assert_eq!(
            held,
            [
                (
                    "session.id".into(),
                    r#"StringValue("globex/conv-1")"#.into()
                ),
                (
                    "gen_ai.conversation.id".into(),
                    r#"StringValue("globex/conv-1")"#.into()
                ),
                (
                    "gen_ai.request.model".into(),
                    r#"StringValue("gpt")"#.into()
                ),
            ]
        );
    }
}
