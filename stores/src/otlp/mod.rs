//! OpenTelemetry traces (`adapter = "otlp"`): what agents export to their trace store over
//! OTLP/HTTP, governed span by span (`adapter.rs`, `route.rs`); a subject's traces deleted from
//! the trace store on erasure and past their deadline (`connector.rs`, with one file per trace
//! store's API: `phoenix.rs`, `langsmith.rs`).

pub mod adapter;
pub(crate) mod connector;
pub mod ids;
mod langsmith;
mod phoenix;
pub(crate) mod route;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use hyper::Response;
use serde::Deserialize;

use super::{Kind, Settings};
use crate::config::ErasureConfig;
use crate::data::error::DataError;
use crate::data::forward::{Route, Upstreams};
use crate::data::route::{HttpRoute, RouteStore, Serving};
use crate::data::{Body, RequestContext, Upstream};
use crate::purge::Connector;
use adapter::Name;

pub const KIND: Kind = Kind::of::<OtlpSettings>("otlp");

/// The subject attributes of OpenInference (`user.id`) and of OpenTelemetry's conventions
/// (`enduser.id`).
const SUBJECT_ATTRIBUTES: &[&str] = &["user.id", "enduser.id"];
/// What OpenInference and OpenTelemetry's GenAI conventions put the prompt and the answer in.
const CONTENT_ATTRIBUTES: &[&str] = &[
    "input.value",
    "output.value",
    "llm.input_messages.*",
    "llm.output_messages.*",
    "llm.prompts.*",
    "llm.prompt_template.variables",
    "retrieval.documents.*",
    "embedding.embeddings.*",
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.prompt*",
    "gen_ai.completion*",
];
/// What a span keeps without `store` consent: the names of OpenInference's, OpenTelemetry's
/// GenAI and general conventions' structural attributes (kinds, models, token counts, status,
/// operations) and a resource's (service, SDK, host, deployment). Only a scalar (or a short
/// list of them) of at most `adapter::STRUCTURAL_TEXT` characters is kept under them.
const STRUCTURAL_ATTRIBUTES: &[&str] = &[
    "openinference.span.kind",
    "llm.model_name",
    "llm.provider",
    "llm.system",
    "llm.token_count.*",
    "embedding.model_name",
    "reranker.model_name",
    "tool.name",
    "gen_ai.system",
    "gen_ai.provider.name",
    "gen_ai.operation.name",
    "gen_ai.request.model",
    "gen_ai.request.temperature",
    "gen_ai.request.top_p",
    "gen_ai.request.top_k",
    "gen_ai.request.max_tokens",
    "gen_ai.response.model",
    "gen_ai.response.id",
    "gen_ai.response.finish_reasons",
    "gen_ai.usage.*",
    "gen_ai.agent.name",
    "gen_ai.tool.name",
    "error.type",
    "exception.type",
    "http.request.method",
    "http.response.status_code",
    "http.route",
    "rpc.system",
    "rpc.service",
    "rpc.method",
    "db.system",
    "server.address",
    "server.port",
    "otel.status_code",
    "otel.scope.name",
    "otel.scope.version",
    "service.name",
    "service.namespace",
    "service.version",
    "service.instance.id",
    "telemetry.sdk.*",
    "deployment.environment*",
    "host.name",
    "host.arch",
    "os.type",
    "process.runtime.*",
    "openinference.project.name",
];
/// OpenTelemetry's GenAI events carry the messages.
const CONTENT_EVENTS: &[&str] = &["gen_ai.*"];
/// The purpose and category of spans when neither the request nor the route names one.
const PURPOSE: &str = "observability";
const CATEGORY: &str = "trace";

/// The trace stores whose API the erasure speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceStore {
    /// Arize Phoenix (REST API `/v1`).
    Phoenix,
    /// LangSmith (OTLP at `<upstream>/v1/traces`, its REST API `/api/v1` on the same host).
    Langsmith,
}

impl TraceStore {
    /// Where the store keeps span attributes it can search by, if only under a prefix.
    fn metadata_prefix(self) -> Option<String> {
        match self {
            TraceStore::Phoenix => None,
            TraceStore::Langsmith => Some(langsmith::METADATA.to_owned()),
        }
    }
}

/// What a span without a subject keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unattributed {
    /// Forwarded without its content.
    #[default]
    Withhold,
    /// Forwarded whole: no subject's data is in it (the route's operator says so).
    Keep,
}

/// An OTLP route's own settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtlpSettings {
    /// The trace store behind the route, whose API deletes traces on erasure.
    pub trace_store: TraceStore,
    /// The attributes naming a span's subject (span, else resource). Default `user.id`,
    /// `enduser.id`.
    pub subject_attributes: Option<Vec<String>>,
    /// The attributes carrying content, a name or a name's beginning and `*`. Default the
    /// OpenInference and GenAI conventions' prompt and answer attributes.
    pub content_attributes: Option<Vec<String>>,
    /// The events carrying content, by name. Default `gen_ai.*`.
    pub content_events: Option<Vec<String>>,
    /// The attributes a span (its events, links and resource) keeps without `store` consent,
    /// a name or a name's beginning and `*`: everything else is withheld. Default the
    /// conventions' structural attributes (models, token counts, status, service).
    pub structural_attributes: Option<Vec<String>>,
    /// Whether subject attributes are replaced by the subject's reference. Default true.
    pub pseudonymise: Option<bool>,
    /// What a span naming no subject keeps. Default `withhold`.
    pub unattributed: Option<Unattributed>,
    /// The largest export request taken, inflated. Default the data plane's `max_body_bytes`.
    pub max_body_bytes: Option<usize>,
}

/// Names as written, or every problem with them.
fn names_of(
    key: &str,
    given: Option<Vec<String>>,
    default: &[&str],
) -> Result<Vec<Name>, Vec<String>> {
    let given = given.unwrap_or_else(|| default.iter().map(|n| (*n).to_owned()).collect());
    let (names, problems): (Vec<_>, Vec<_>) = given
        .iter()
        .map(|n| Name::of(n).map_err(|e| format!("{key}: {e}")))
        .partition(Result::is_ok);
    match problems.is_empty() {
        true => Ok(names.into_iter().flatten().collect()),
        false => Err(problems.into_iter().filter_map(Result::err).collect()),
    }
}

impl Settings for OtlpSettings {
    fn store(self) -> Result<Arc<dyn RouteStore>, Vec<String>> {
        let mut problems = Vec::new();
        let subject_attributes = self
            .subject_attributes
            .unwrap_or_else(|| SUBJECT_ATTRIBUTES.iter().map(|n| (*n).to_owned()).collect());
        if subject_attributes.is_empty() || subject_attributes.iter().any(String::is_empty) {
            problems.push("subject_attributes: at least one, none empty".to_owned());
        }
        if subject_attributes.iter().any(|a| a.starts_with("lethe.")) {
            problems.push("subject_attributes: lethe.* attributes are Lethe's stamp".to_owned());
        }
        let attributes = names_of(
            "content_attributes",
            self.content_attributes,
            CONTENT_ATTRIBUTES,
        );
        let events = names_of("content_events", self.content_events, CONTENT_EVENTS);
        let structural = names_of(
            "structural_attributes",
            self.structural_attributes,
            STRUCTURAL_ATTRIBUTES,
        );
        if self.max_body_bytes == Some(0) {
            problems.push("max_body_bytes: more than 0".to_owned());
        }
        let (content_attributes, content_events, structural_attributes) =
            match (attributes, events, structural) {
                (Ok(a), Ok(e), Ok(s)) if problems.is_empty() => (a, e, s),
                (a, e, s) => {
                    problems.extend(a.err().into_iter().flatten());
                    problems.extend(e.err().into_iter().flatten());
                    problems.extend(s.err().into_iter().flatten());
                    return Err(problems);
                }
            };
        Ok(Arc::new(Otlp {
            trace_store: self.trace_store,
            rules: Rules {
                subject_attributes,
                content_attributes,
                content_events,
                structural_attributes,
                pseudonymise: self.pseudonymise.unwrap_or(true),
                keep_unattributed: self.unattributed.unwrap_or_default() == Unattributed::Keep,
                metadata_prefix: self.trace_store.metadata_prefix(),
            },
            max_body_bytes: self.max_body_bytes,
        }))
    }
}

/// A route's span rules but the purpose and category, which each request names.
#[derive(Debug, Clone)]
pub(crate) struct Rules {
    subject_attributes: Vec<String>,
    content_attributes: Vec<Name>,
    content_events: Vec<Name>,
    structural_attributes: Vec<Name>,
    pseudonymise: bool,
    keep_unattributed: bool,
    metadata_prefix: Option<String>,
}

impl Rules {
    /// The span rules of a request of this purpose and category.
    pub(crate) fn for_request(&self, ctx: &RequestContext) -> adapter::SpanRules {
        adapter::SpanRules {
            subject_attributes: self.subject_attributes.clone(),
            content_attributes: self.content_attributes.clone(),
            content_events: self.content_events.clone(),
            structural_attributes: self.structural_attributes.clone(),
            purpose: ctx.purpose.clone().unwrap_or_else(|| PURPOSE.to_owned()),
            category: ctx.category.clone().unwrap_or_else(|| CATEGORY.to_owned()),
            pseudonymise: self.pseudonymise,
            keep_unattributed: self.keep_unattributed,
            metadata_prefix: self.metadata_prefix.clone(),
        }
    }
}

#[derive(Debug)]
pub struct Otlp {
    trace_store: TraceStore,
    rules: Rules,
    max_body_bytes: Option<usize>,
}

impl RouteStore for Otlp {
    fn kind(&self) -> &'static str {
        KIND.name
    }

    fn serving(&self) -> Serving<'_> {
        Serving::Http(self)
    }

    fn connector(
        &self,
        route: Route,
        upstreams: Arc<Upstreams>,
        _erasure: &ErasureConfig,
        audit_key: &Arc<[u8]>,
    ) -> Arc<dyn Connector> {
        let attributes = self.rules.subject_attributes.clone();
        let key = Arc::clone(audit_key);
        match self.trace_store {
            TraceStore::Phoenix => {
                let http = crate::http::StoreHttp::new(route, upstreams);
                let api = phoenix::Phoenix::new(http);
                Arc::new(connector::TraceConnector::new(api, attributes, key))
            }
            TraceStore::Langsmith => {
                let api = langsmith::LangSmith::new(route, upstreams);
                Arc::new(connector::TraceConnector::new(api, attributes, key))
            }
        }
    }
}

#[async_trait]
impl HttpRoute for Otlp {
    async fn handle(
        &self,
        upstream: &Upstream<'_>,
        ctx: &RequestContext,
        path: &str,
        body: Bytes,
    ) -> Result<Response<Body>, DataError> {
        let limit = self.max_body_bytes.unwrap_or(upstream.state.max_body_bytes);
        route::handle(&self.rules, limit, upstream, ctx, path, body).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(keys: &str) -> Result<Arc<dyn RouteStore>, Vec<String>> {
        (KIND.settings)(toml::from_str(keys).unwrap())
    }

    #[test]
    fn a_route_names_its_trace_store_and_every_problem_is_said_at_once() {
        let store = read(r#"trace_store = "phoenix""#).unwrap();
        assert_eq!(store.kind(), "otlp");
        assert!(read(r#"trace_store = "langsmith""#).is_ok());
        let problems = read(
            r#"trace_store = "phoenix"
            subject_attributes = ["lethe.subject"]
            content_attributes = ["input.*.value"]
            content_events = ["*"]
            structural_attributes = ["*x"]
            max_body_bytes = 0"#,
        )
        .unwrap_err();
        assert_eq!(problems.len(), 5, "{problems:?}");
        assert!(read("").is_err(), "the trace store is required");
        assert!(read(r#"trace_store = "jaeger""#).is_err());
        assert!(read("trace_store = \"phoenix\"\nsampling = 1").is_err());
        assert!(read("trace_store = \"phoenix\"\nsubject_attributes = []").is_err());
    }
}
