//! LangSmith's REST API for the trace connector (`/api/v1` on the host of the route's OTLP
//! upstream, with the route's credential, its `x-api-key`). LangSmith makes a run of each span
//! and keeps, of the span's own attributes, only `langsmith.metadata.<key>` (as the run's metadata
//! `<key>`): the route writes Lethe's stamp there too (`lethe_tenant`, `lethe_subject_ref`, ...,
//! and `lethe_trace`, the span's OpenTelemetry trace id, since LangSmith names traces its own way).
//!
//! Runs are found with `POST /runs/query` in every project (`GET /sessions`), by metadata
//! (`and(eq(metadata_key, ..), eq(metadata_value, ..))`) or, for the probe, by text (`search(..)`);
//! traces are deleted with `POST /runs/delete {trace_ids, session_id}`, which LangSmith queues and
//! carries out later with no confirmation: the connector reads again until they are gone. It
//! deletes whole traces only; a trace shared with another owner goes to a person.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use hyper::{Method, StatusCode, Uri};
use serde_json::{Value, json};

use super::adapter::TRACE;
use super::connector::{HeldSpan, TraceApi};
use crate::data::forward::{Route, Upstreams};
use crate::http::StoreHttp;
use crate::purge::{ConnectorError, Copy, Physical};

/// Where LangSmith keeps span attributes as run metadata.
pub(crate) const METADATA: &str = "langsmith.metadata.";
/// LangSmith's largest page of runs (`runs/query`) and of projects (`sessions`).
const PAGE: usize = 100;
const MAX_PAGES: usize = 10_000;
/// Traces per `runs/delete`, LangSmith's limit.
const DELETE_BATCH: usize = 1_000;
/// How long deleted runs may still be read before LangSmith's queued delete has run.
const QUEUED_DELETES: Duration = Duration::from_secs(60);

pub(crate) struct LangSmith {
    http: StoreHttp,
}

impl LangSmith {
    /// The REST API on the host of the route's OTLP upstream (`https://api.smith.langchain.com/otel`
    /// -> `https://api.smith.langchain.com/api/v1/...`).
    pub fn new(mut route: Route, upstreams: Arc<Upstreams>) -> Self {
        let mut parts = route.upstream.clone().into_parts();
        parts.path_and_query = Some(hyper::http::uri::PathAndQuery::from_static("/"));
        if let Ok(origin) = Uri::from_parts(parts) {
            route.upstream = origin;
        }
        LangSmith {
            http: StoreHttp::new(route, upstreams),
        }
    }

    /// The id of every project.
    async fn sessions(&self) -> Result<Vec<String>, ConnectorError> {
        let mut ids = Vec::new();
        for page in 0..MAX_PAGES {
            let query = format!("limit={PAGE}&offset={}", page * PAGE);
            let (_, listed) = self
                .http
                .call(Method::GET, "/api/v1/sessions", Some(&query), None)
                .await?;
            let listed = listed.as_array().cloned().unwrap_or_default();
            ids.extend(
                listed
                    .iter()
                    .filter_map(|s| s.get("id")?.as_str().map(str::to_owned)),
            );
            if listed.len() < PAGE {
                return Ok(ids);
            }
        }
        Err(self.too_many("/api/v1/sessions"))
    }

    /// Every run of every project that `filter` (LangSmith's query language) selects.
    async fn runs(&self, filter: &str) -> Result<Vec<Value>, ConnectorError> {
        let mut runs = Vec::new();
        for session in self.sessions().await? {
            let mut cursor = Value::Null;
            let mut pages = 0;
            loop {
                let body = json!({"session": [session], "filter": filter, "limit": PAGE,
                    "cursor": cursor, "select": ["id", "trace_id", "session_id", "extra"]});
                let (status, page) = self
                    .http
                    .call(Method::POST, "/api/v1/runs/query", None, Some(body))
                    .await?;
                if status == StatusCode::NOT_FOUND {
                    break;
                }
                runs.extend(
                    page.get("runs")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .cloned(),
                );
                cursor = page
                    .pointer("/cursors/next")
                    .cloned()
                    .unwrap_or(Value::Null);
                pages += 1;
                if cursor.is_null() {
                    break;
                }
                if pages == MAX_PAGES {
                    return Err(self.too_many("/api/v1/runs/query"));
                }
            }
        }
        Ok(runs)
    }

    fn too_many(&self, path: &str) -> ConnectorError {
        format!(
            "{} ({path}): more than {} results; purge stopped for review",
            self.name(),
            PAGE * MAX_PAGES
        )
        .into()
    }

    fn held(&self, runs: &[Value]) -> Result<Vec<HeldSpan>, ConnectorError> {
        runs.iter()
            .map(|run| {
                held(run).ok_or_else(|| {
                    ConnectorError::Unavailable(format!(
                        "{} answered a run without its ids",
                        self.name()
                    ))
                })
            })
            .collect()
    }
}

/// A filter string's quoted value (JSON's quoting, which LangSmith's language reads).
fn quoted(value: &str) -> String {
    Value::from(value).to_string()
}

/// The metadata key LangSmith keeps a stamp attribute under (`lethe.subject_ref` ->
/// `lethe_subject_ref`).
fn metadata_key(attribute: &str) -> String {
    attribute.replacen('.', "_", 1)
}

/// A run as a span: its OpenTelemetry trace (from Lethe's stamp; LangSmith's own trace id for a
/// run Lethe did not stamp), the run's id, the stamp in its metadata.
fn held(run: &Value) -> Option<HeldSpan> {
    let metadata = run.pointer("/extra/metadata");
    let attribute = |key: &str| {
        metadata
            .and_then(|m| m.get(metadata_key(key)))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let trace = attribute(TRACE).or_else(|| run.get("trace_id")?.as_str().map(str::to_owned))?;
    let id = run.get("id")?.as_str()?.to_owned();
    Some(HeldSpan::new(trace, id, attribute))
}

#[async_trait]
impl TraceApi for LangSmith {
    fn name(&self) -> &str {
        &self.http.route().name
    }

    /// Stamp attributes are read in the runs' metadata.
    async fn spans_with(&self, key: &str, value: &str) -> Result<Vec<HeldSpan>, ConnectorError> {
        let filter = format!(
            "and(eq(metadata_key, {}), eq(metadata_value, {}))",
            quoted(&metadata_key(key)),
            quoted(value)
        );
        self.held(&self.runs(&filter).await?)
    }

    /// LangSmith does not keep a span's subject attributes: each name is searched for as text,
    /// anywhere in a run (in the query's body, not its URL).
    async fn spans_naming(
        &self,
        _attributes: &[String],
        names: &BTreeSet<String>,
    ) -> Result<Vec<HeldSpan>, ConnectorError> {
        let mut spans = Vec::new();
        for name in names {
            spans.extend(self.held(&self.runs(&format!("search({})", quoted(name))).await?)?);
        }
        Ok(spans)
    }

    async fn trace(&self, trace_id: &str) -> Result<Vec<HeldSpan>, ConnectorError> {
        self.spans_with(TRACE, trace_id).await
    }

    /// Every LangSmith trace holding a run of this OpenTelemetry trace, by project.
    async fn delete_trace(&self, trace_id: &str) -> Result<(), ConnectorError> {
        let filter = format!(
            "and(eq(metadata_key, {}), eq(metadata_value, {}))",
            quoted(&metadata_key(TRACE)),
            quoted(trace_id)
        );
        let mut by_session: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for run in self.runs(&filter).await? {
            let session = run.get("session_id").and_then(Value::as_str);
            let trace = run.get("trace_id").and_then(Value::as_str);
            if let (Some(session), Some(trace)) = (session, trace) {
                by_session
                    .entry(session.to_owned())
                    .or_default()
                    .insert(trace.to_owned());
            }
        }
        for (session, traces) in by_session {
            let traces: Vec<String> = traces.into_iter().collect();
            for batch in traces.chunks(DELETE_BATCH) {
                let body = json!({"trace_ids": batch, "session_id": session});
                self.http
                    .call(Method::POST, "/api/v1/runs/delete", None, Some(body))
                    .await?;
            }
        }
        Ok(())
    }

    async fn delete_span(&self, span: &HeldSpan) -> Result<(), ConnectorError> {
        Err(ConnectorError::Misconfigured(format!(
            "{}: LangSmith deletes whole traces only, and trace {} holds runs of other owners: a person decides",
            self.name(),
            span.trace_id
        )))
    }

    fn deletes_within(&self) -> Duration {
        QUEUED_DELETES
    }

    fn physical(&self) -> Physical {
        Physical::default().with(Copy::unknown(
            "LangSmith's storage and daily backups",
            "the deleted traces' runs: inputs, outputs, metadata with the subject's reference",
            "LangSmith carries out deletes off-peak with no confirmation, keeps daily backups, and keeps some trace metadata indefinitely for analytics and billing",
            "LangSmith publishes no retention for its backups",
        ))
    }
}
