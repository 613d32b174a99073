//! Arize Phoenix's REST API (`/v1`) for the trace connector: spans found by attribute and by
//! trace in every project (`GET /v1/projects`, `GET /v1/projects/{id}/spans`, cursor paging),
//! traces deleted by their OpenTelemetry id (`DELETE /v1/traces/{id}`) and spans by Phoenix's own
//! id (`DELETE /v1/spans/{id}`: an OpenTelemetry span id is not unique across traces, and
//! Phoenix would delete every span that has it).

use std::collections::BTreeSet;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use hyper::{Method, StatusCode};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use serde_json::Value;

use super::connector::{HeldSpan, TraceApi};
use super::{adapter, ids};
use crate::http::StoreHttp;
use crate::purge::{ConnectorError, Copy, Physical};

/// Spans and projects are read in pages of this many (Phoenix's largest), at most this many
/// pages per search.
const PAGE: usize = 1_000;
const MAX_PAGES: usize = 1_000;

/// The project of Lethe's markers ([`TraceApi::landed`]).
const MARKERS: &str = "lethe.landed";
/// How long a marker may take to land before the purge or the sweep is tried again later, and
/// how often it is looked for.
const LANDS_WITHIN: Duration = Duration::from_secs(30);
const LANDED_POLL: Duration = Duration::from_millis(50);

pub(crate) struct Phoenix {
    http: StoreHttp,
}

impl Phoenix {
    pub fn new(http: StoreHttp) -> Self {
        Phoenix { http }
    }

    /// What `keep` makes of every item of a paged listing at `path` with `query` (Phoenix's
    /// `data` and `next_cursor`), read a page at a time; too many stop the purge for review
    /// rather than leave some unread.
    async fn select<T>(
        &self,
        path: &str,
        query: &[(&str, &str)],
        mut keep: impl FnMut(&Value) -> Result<Option<T>, ConnectorError> + Send,
    ) -> Result<Vec<T>, ConnectorError> {
        let mut kept = Vec::new();
        let mut cursor: Option<String> = None;
        let limit = PAGE.to_string();
        for _ in 0..MAX_PAGES {
            let query = {
                let mut form = form_urlencoded::Serializer::new(String::new());
                form.extend_pairs(query.iter().copied());
                form.append_pair("limit", &limit);
                if let Some(cursor) = &cursor {
                    form.append_pair("cursor", cursor);
                }
                form.finish()
            };
            let (status, page) = self
                .http
                .call(Method::GET, path, Some(&query), None)
                .await?;
            if status == StatusCode::NOT_FOUND {
                // A project deleted while it was being read holds nothing any more.
                return Ok(kept);
            }
            let items = page.get("data").and_then(Value::as_array);
            for item in items.into_iter().flatten() {
                kept.extend(keep(item)?);
            }
            match page.get("next_cursor").and_then(Value::as_str) {
                Some(next) if !next.is_empty() => cursor = Some(next.to_owned()),
                _ => return Ok(kept),
            }
        }
        Err(format!(
            "{} ({path}): more than {} results; purge stopped for review",
            self.name(),
            PAGE * MAX_PAGES
        )
        .into())
    }

    /// The id of every project, experiments' and evaluators' included.
    async fn projects(&self) -> Result<Vec<String>, ConnectorError> {
        let every = [
            ("include_experiment_projects", "true"),
            ("include_dataset_evaluator_projects", "true"),
        ];
        self.select("/v1/projects", &every, |project| {
            Ok(project.get("id").and_then(Value::as_str).map(str::to_owned))
        })
        .await
    }

    /// Every span of every project that `query` selects and `wanted` takes.
    async fn spans(
        &self,
        query: &[(&str, &str)],
        wanted: impl Fn(&Value) -> bool + Send + Sync,
    ) -> Result<Vec<HeldSpan>, ConnectorError> {
        let mut spans = Vec::new();
        for project in self.projects().await? {
            let path = format!("/v1/projects/{project}/spans");
            let of_project = self.select(&path, query, |span| match wanted(span) {
                false => Ok(None),
                true => held(span).map(Some).ok_or_else(|| {
                    ConnectorError::Unavailable(format!(
                        "{} answered a span without its ids",
                        self.name()
                    ))
                }),
            });
            spans.extend(of_project.await?);
        }
        Ok(spans)
    }

    /// A delete by id: gone now or gone before are both done.
    async fn delete(&self, path: &str) -> Result<(), ConnectorError> {
        self.http
            .call(Method::DELETE, path, None, None)
            .await
            .map(|_| ())
    }
}

/// An export of one marker span, in a trace of its own, to [`MARKERS`]; and its trace id (hex).
fn marker_export() -> (Bytes, String) {
    let trace = uuid::Uuid::new_v4().into_bytes();
    let now = u64::try_from(crate::now().timestamp_nanos_opt().unwrap_or(0)).unwrap_or(0);
    let span = Span {
        trace_id: trace.to_vec(),
        span_id: uuid::Uuid::new_v4().into_bytes()[..8].to_vec(),
        name: "lethe.landed".into(),
        start_time_unix_nano: now,
        end_time_unix_nano: now,
        ..Span::default()
    };
    let request = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![adapter::text(ids::PROJECT, MARKERS)],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans: vec![span],
                ..ScopeSpans::default()
            }],
            ..ResourceSpans::default()
        }],
    };
    (Bytes::from(adapter::encode(&request)), hex::encode(trace))
}

/// A span as Phoenix answers it: flat dotted attributes.
fn held(span: &Value) -> Option<HeldSpan> {
    let context = span.get("context")?;
    let attributes = span.get("attributes");
    Some(HeldSpan::new(
        context.get("trace_id")?.as_str()?.to_ascii_lowercase(),
        span.get("id")?.as_str()?.to_owned(),
        |key| {
            attributes
                .and_then(|a| a.get(key))
                .and_then(Value::as_str)
                .map(str::to_owned)
        },
    ))
}

/// Whether one of the span's `attributes` (flat dotted keys, as Phoenix answers them), or
/// one of its events', is one of `names`, as text or as the number an exporter may have sent.
fn names_one_of(span: &Value, attributes: &[String], names: &BTreeSet<String>) -> bool {
    let events = span.get("events").and_then(Value::as_array);
    let held = span.get("attributes").into_iter().chain(
        events
            .into_iter()
            .flatten()
            .filter_map(|e| e.get("attributes")),
    );
    held.flat_map(|held| attributes.iter().filter_map(|key| held.get(key)))
        .any(|value| match value {
            Value::String(text) => names.contains(text),
            Value::Number(number) => names.contains(&number.to_string()),
            _ => false,
        })
}

/// Only ids Lethe read or recorded reach a path: lowercase hex trace ids, Phoenix's base64 ids.
fn path_safe(id: &str) -> Result<&str, ConnectorError> {
    if !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'=') {
        Ok(id)
    } else {
        Err(ConnectorError::Misconfigured(format!(
            "{id:?} is not a trace or span id"
        )))
    }
}

#[async_trait]
impl TraceApi for Phoenix {
    fn name(&self) -> &str {
        &self.http.route().name
    }

    async fn spans_with(&self, key: &str, value: &str) -> Result<Vec<HeldSpan>, ConnectorError> {
        // JSON-quoted: Phoenix reads an unquoted value as a number or a boolean when it can.
        let filter = format!("{key}:{}", Value::from(value));
        self.spans(&[("attribute", &filter)], |_| true).await
    }

    /// Phoenix filters only in its URL: every span is read and matched here.
    async fn spans_naming(
        &self,
        attributes: &[String],
        names: &BTreeSet<String>,
    ) -> Result<Vec<HeldSpan>, ConnectorError> {
        self.spans(&[], |span| names_one_of(span, attributes, names))
            .await
    }

    async fn trace(&self, trace_id: &str) -> Result<Vec<HeldSpan>, ConnectorError> {
        self.spans(&[("trace_id", path_safe(trace_id)?)], |_| true)
            .await
    }

    async fn delete_trace(&self, trace_id: &str) -> Result<(), ConnectorError> {
        self.delete(&format!("/v1/traces/{}", path_safe(trace_id)?))
            .await
    }

    async fn delete_span(&self, span: &HeldSpan) -> Result<(), ConnectorError> {
        self.delete(&format!("/v1/spans/{}", path_safe(&span.span_id)?))
            .await
    }

    /// Phoenix answers an export before it ingests it: its spans are decoded in the background
    /// and queued, and its inserter writes the queue in order a batch at a time. A marker span
    /// of Lethe's own, sent now to a project no tenant's can be named (theirs are
    /// `<tenant>/<name>`), lands behind every span already queued; it is read until it has,
    /// then deleted.
    async fn landed(&self) -> Result<(), ConnectorError> {
        let (marker, trace_id) = marker_export();
        self.http
            .post("/v1/traces", "application/x-protobuf", marker)
            .await?;
        let path = format!("/v1/projects/{MARKERS}/spans");
        let query = format!("trace_id={trace_id}&limit=1");
        let until = tokio::time::Instant::now() + LANDS_WITHIN;
        loop {
            let (_, page) = self
                .http
                .call(Method::GET, &path, Some(&query), None)
                .await?;
            let found = page.get("data").and_then(Value::as_array);
            if found.is_some_and(|spans| !spans.is_empty()) {
                return self.delete_trace(&trace_id).await;
            }
            if tokio::time::Instant::now() >= until {
                return Err(ConnectorError::Unavailable(format!(
                    "{}: a span sent {} s ago has not landed yet; spans it took before may not have either",
                    self.name(),
                    LANDS_WITHIN.as_secs()
                )));
            }
            tokio::time::sleep(LANDED_POLL).await;
        }
    }

    fn physical(&self) -> Physical {
        Physical::default().with(Copy::unknown(
            "Phoenix's database (phoenix.db and phoenix.db-wal in its working directory on SQLite; its tables and WAL on PostgreSQL)",
            "the deleted spans' attributes and events: their text where it was kept, the subject's reference",
            "Phoenix deletes rows without secure_delete and never vacuums: their bytes stay in free pages and in the write-ahead log until reused",
            "no setting of Phoenix's removes them; only its operator can (VACUUM, a checkpoint, a new database)",
        ))
    }
}
