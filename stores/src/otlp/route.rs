//! The OTLP/HTTP traces route: the I/O around the pure adapter in
//! `crate::otlp::adapter`. One endpoint, `POST /v1/traces`: the export request read
//! (either encoding, gzip or not, within the route's limit), every span governed, what is left
//! sent to the trace store in protobuf with the route's credential, each trace kept with content
//! recorded for its subject with what it derives from, and the exporter answered in its own
//! encoding (a partial success counts the refused spans).

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Response, StatusCode};

use lethe_policy::{Layer, Refusal, Stamp, TraceId};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;

use super::Rules;
use super::adapter::{self, Caller, DecodeError, Encoding};
use super::ids;
use crate::data::derivation::{Derivations, Writing};
use crate::data::error::DataError;
use crate::data::overtaken::{Recording, keep_unless_overtaken};
use crate::data::{Body, DataState, RequestContext, Upstream, whole};
use crate::error_shape::Code;
use crate::state::ItemRecord;

/// The lineage collection of traces: one row per trace and subject (see [`trace_item`]).
pub(crate) const TRACES: &str = "traces";

/// The lineage item of a subject's spans in a trace: `<trace id>:<subject reference>`. A row of
/// each subject's own, so that no owner's row (the first subject's of a shared trace, another
/// tenant's under the same client-chosen trace id) keeps another's from being recorded, and
/// swept at its deadline.
pub(crate) fn trace_item(trace: &str, reference: &str) -> String {
    format!("{trace}:{reference}")
}

/// The trace id of a lineage item.
pub(crate) fn trace_of(item: &str) -> &str {
    item.split_once(':').map_or(item, |(trace, _)| trace)
}
/// How long an exporter is asked to wait before retrying when the trace store is unavailable.
const RETRY_AFTER_SECONDS: u32 = 5;

pub(crate) async fn handle(
    rules: &Rules,
    limit: usize,
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
    body: Bytes,
) -> Result<Response<Body>, DataError> {
    if upstream.parts.method != Method::POST || path != "/v1/traces" {
        return Err(DataError::unknown_endpoint());
    }
    let (encoding, gzip) = how_sent(&upstream.parts.headers)?;
    if body.len() > limit {
        return Err(too_large(limit));
    }
    let mut request = adapter::decode(&body, gzip, encoding, limit).map_err(|e| match e {
        DecodeError::TooLarge(limit) => too_large(limit),
        DecodeError::Invalid(why) => {
            DataError::new(StatusCode::BAD_REQUEST, Code::InvalidRequest, why)
        }
    })?;
    let state = upstream.state;
    let tenant = ctx.tenant();
    let exporters_traces = ids::own_ids(&mut request, tenant);
    let rules = rules.for_request(ctx);
    let caller = Caller {
        tenant,
        bound: ctx.subject.as_deref(),
        fold: ctx.fold,
    };
    let subjects = adapter::subjects(&request, &rules, caller);
    let view = state
        .policy
        .view(tenant, subjects.iter().map(String::as_str))
        .await?;
    let refer = |subject: &str| lethe_policy::audit::subject_ref(&state.audit_key, tenant, subject);
    let now = crate::now();
    let mut governed = adapter::govern(request, &rules, caller, &view, now, &refer);
    ids::own_names(&mut governed.request, tenant);
    let refused = governed.refusal.take().unwrap_or_default();
    if !governed.request.resource_spans.is_empty() {
        // One row per trace and subject: a batch holds many spans of few traces.
        let mut traced: BTreeMap<String, Stamp> = BTreeMap::new();
        for (trace, stamp) in std::mem::take(&mut governed.traced) {
            let item = trace_item(&trace, &refer(&stamp.subject));
            traced.entry(item).or_insert(stamp);
        }
        let derivations = derived(
            state,
            ctx,
            &rules,
            &mut governed.request,
            &mut traced,
            &exporters_traces,
        )
        .await?;
        sent(upstream, tenant, adapter::encode(&governed.request)).await?;
        let rows = traced
            .into_iter()
            .map(|(item, stamp)| {
                let route = &upstream.route.name;
                let derives = derivations.of(&item).is_some_and(|d| !d.parents.is_empty());
                let mut row =
                    ItemRecord::stamped(route, TRACES, item, stamp, now, ctx.source.clone());
                if derives {
                    row.layer = Layer::Derived;
                }
                row
            })
            .collect();
        // The trace store took the spans, stamped: their rows go in the lineage writer's next
        // batch (a derived trace's before the answer). Those a flip overtook stay recorded for
        // its purge, which finds them by their stamp too (a trace store ingests in the
        // background: one deleted now could land after).
        let undo = |overtaken: Vec<ItemRecord>| async move { overtaken };
        let derived = Some(&derivations);
        keep_unless_overtaken(state, tenant, rows, Recording::Batched, derived, undo).await?;
    }
    let answer = adapter::answer(governed.rejected, &refused, encoding);
    let mut response = Response::new(Full::new(Bytes::from(answer)));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(encoding.content_type()),
    );
    Ok(whole(response))
}

/// What each trace kept with content derives from: the items read through Lethe under the same
/// trace, and the memories and model answers its content quotes. A trace that derives from a
/// subject under erasure goes without its content (`derived_from_erased`), as a write would be
/// refused; the others' edges are recorded before the spans leave, so that a flip from then on
/// reaches them. `exporters` gives each stored trace id the exporter's own, which the reads'
/// `traceparent` named.
async fn derived(
    state: &DataState,
    ctx: &RequestContext,
    rules: &adapter::SpanRules,
    request: &mut ExportTraceServiceRequest,
    traced: &mut BTreeMap<String, Stamp>,
    exporters: &BTreeMap<String, String>,
) -> Result<Derivations, DataError> {
    if !state.derivation.enabled() || traced.is_empty() {
        return Ok(Derivations::default());
    }
    let contents = adapter::contents(request, rules);
    let mut derivations = Derivations::default();
    for (item, stamp) in traced.iter() {
        let trace = trace_of(item);
        // The span's own trace, as a request's traceparent names the trace it belongs to.
        let mut under = ctx.clone();
        under.trace = exporters
            .get(trace)
            .and_then(|exporters| hex::decode(exporters).ok())
            .and_then(|bytes| <[u8; 16]>::try_from(bytes).ok())
            .filter(|bytes| *bytes != [0; 16])
            .map(TraceId);
        let writing = Writing {
            collection: TRACES,
            id: item,
            owner: &stamp.subject,
            text: contents.get(trace).map_or("", String::as_str),
        };
        let parents = state.derivation.parents(&under, &[writing]).await?;
        derivations = derivations.and(parents);
    }
    let tenant = ctx.tenant();
    let view = state.policy.view(tenant, derivations.owners()).await?;
    // A trace's content goes whole or not at all: every subject's of it is withheld.
    let erased: BTreeSet<String> = derivations
        .records
        .iter()
        .filter(|r| r.check(&view, tenant).is_err())
        .map(|r| trace_of(&r.item.item).to_owned())
        .collect();
    if !erased.is_empty() {
        let code = Refusal::DerivedFromErased.code();
        adapter::withhold_traces(request, &erased, rules, code);
        traced.retain(|item, _| !erased.contains(trace_of(item)));
        derivations
            .records
            .retain(|r| !erased.contains(trace_of(&r.item.item)));
    }
    let written: Vec<String> = traced.keys().cloned().collect();
    state.derivation.record(ctx, &derivations, &written).await?;
    Ok(derivations)
}

/// The encoding of the export request, and whether it is gzipped; refused (415) when OTLP has
/// neither.
fn how_sent(headers: &hyper::HeaderMap) -> Result<(Encoding, bool), DataError> {
    let unsupported = |message: &str| {
        DataError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Code::UnsupportedMediaType,
            message,
        )
    };
    let text = |name: header::HeaderName| {
        crate::data::context::single(headers, name.as_str())
            .map(|v| v.map(|v| v.to_str().unwrap_or("?")))
    };
    let content_type = text(header::CONTENT_TYPE)?.unwrap_or_default();
    let encoding = Encoding::of(content_type).ok_or_else(|| {
        unsupported("OTLP/HTTP is sent as application/x-protobuf or application/json")
    })?;
    let gzip = match text(header::CONTENT_ENCODING)? {
        None | Some("identity") => false,
        Some(coding) if coding.eq_ignore_ascii_case("gzip") => true,
        Some(_) => {
            return Err(unsupported(
                "OTLP/HTTP bodies are sent as they are or gzipped",
            ));
        }
    };
    Ok((encoding, gzip))
}

fn too_large(limit: usize) -> DataError {
    DataError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        Code::BodyTooLarge,
        format!("the export request is larger than {limit} bytes"),
    )
}

/// Sends the governed spans to the trace store, in protobuf (what every OTLP receiver takes),
/// with the client's other headers (a project's name, under the `tenant`'s). A trace store that
/// is down, overloaded or slow is `503` with `Retry-After`, which OTLP exporters retry; one
/// that refuses the spans is `upstream_invalid`.
async fn sent(upstream: &Upstream<'_>, tenant: &str, body: Vec<u8>) -> Result<(), DataError> {
    let mut headers = upstream.parts.headers.clone();
    headers.remove(header::CONTENT_ENCODING);
    for name in ids::PROJECT_HEADERS {
        let project = headers.remove(name);
        let owned = project
            .as_ref()
            .and_then(|p| p.to_str().ok())
            .and_then(|p| HeaderValue::try_from(ids::stored_project(tenant, p)).ok());
        // A name that is not text goes: the resource's (the tenant's) names the project.
        if let Some(owned) = owned {
            headers.insert(name, owned);
        }
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(Encoding::Protobuf.content_type()),
    );
    let route = upstream.route;
    let answer = upstream
        .state
        .upstreams
        .send(
            route,
            Method::POST,
            "/v1/traces",
            None,
            &headers,
            Bytes::from(body),
        )
        .await;
    let retry = |why: String| {
        DataError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            Code::UpstreamUnavailable,
            why,
        )
        .retry_after(RETRY_AFTER_SECONDS)
    };
    match answer {
        Ok(answer) if answer.is_success() => Ok(()),
        Ok(answer)
            if answer.status == StatusCode::TOO_MANY_REQUESTS
                || answer.status.is_server_error() =>
        {
            Err(retry(format!(
                "the trace store answered {}; retry",
                answer.status
            )))
        }
        Ok(answer) => {
            // The route's credential or Lethe's encoding is wrong: an operator must look.
            tracing::warn!(route = %route.name, status = %answer.status, "the trace store refused the spans");
            Err(DataError::new(
                StatusCode::BAD_GATEWAY,
                Code::UpstreamInvalid,
                format!("the trace store refused the spans ({})", answer.status),
            ))
        }
        Err(e) if e.code == Code::UpstreamUnavailable => Err(retry(e.message)),
        Err(e) => Err(e),
    }
}
