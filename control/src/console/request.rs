//! One erasure request: where it stands, its approvals, each store's progress and what each
//! keeps on disk, its derivatives and timeline, and the steps a person takes on it (approve,
//! extend, refuse, review, resume), each through the API's own action.

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use lethe_policy::ErasureState;
use lethe_policy::audit::AuditRecord;

use super::derivatives::DerivativesSection;
use super::page::{Badge, Frame, Step, deadline_badge, message, render, steps};
use super::{Posted, Session, refused, request_uri, then_to, urlencoding};
use crate::ControlState;
use crate::erasures::{
    self, ErasureView, ExtendRequest, RejectRequest, approve_as, extend_as, reject_as, view,
    visible,
};
use crate::state::{ErasureRecord, GovernedFlip, MAX_EXTENSION_MONTHS};

/// What the person looking at a `requested` erasure may do about its approval.
enum Approver {
    May,
    /// Approved it already: another person must.
    Approved,
    /// Filed it, where two others must approve.
    Filed,
}

/// A store's purge, as its row shows it.
struct StoreRow {
    target: String,
    state: String,
    before: String,
    deleted: String,
    remaining: String,
    attempts: i64,
    last_error: String,
}

/// What a store did physically, and every copy that remains.
struct Physical {
    target: String,
    lines: Vec<String>,
    remaining: Vec<Copy>,
}

/// A copy that remains: where, what, why, until when (or why no date can be given).
struct Copy {
    place: String,
    holds: String,
    why: String,
    until: String,
}

#[derive(Template)]
#[template(path = "console/request.html")]
struct RequestPage<'a> {
    frame: Frame,
    csrf: String,
    r: &'a ErasureRecord,
    uri: String,
    steps: Vec<Step>,
    subject_ref: String,
    badge: Badge,
    approvals_required: usize,
    online_latency_ms: Option<i64>,
    flips: &'a [GovernedFlip],
    extendable: bool,
    months: Vec<u32>,
    holds: Vec<String>,
    /// The step the request waits for a person to take (review, resume), with its button.
    step_form: Option<(&'static str, &'static str)>,
    approvals_missing: Option<usize>,
    approver: Approver,
    refusable: bool,
    stores: Vec<StoreRow>,
    physical: Vec<Physical>,
    public_key: String,
    derivatives: DerivativesSection,
    events: Vec<AuditRecord>,
}

/// The text of a JSON value (a string as is, anything else as JSON), empty when missing.
fn text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn store_rows(v: &ErasureView) -> Vec<StoreRow> {
    v.targets
        .iter()
        .map(|job| {
            let count = |k: &str| {
                job.result
                    .as_ref()
                    .and_then(|r| r.get(k))
                    .map_or("–".to_owned(), |n| n.to_string())
            };
            StoreRow {
                target: job.target.clone(),
                state: job.state.clone(),
                before: count("before"),
                deleted: count("deleted"),
                remaining: count("remaining"),
                attempts: job.attempts,
                last_error: job.last_error.clone().unwrap_or_default(),
            }
        })
        .collect()
}

fn physical(v: &ErasureView) -> Vec<Physical> {
    v.targets
        .iter()
        .filter_map(|job| {
            let physical = job.result.as_ref()?.get("physical")?;
            let lines = |key: &str| -> Vec<String> {
                physical[key]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|l| l.as_str().map(str::to_owned))
                    .collect()
            };
            let remaining = physical["remaining"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| Copy {
                    place: text(&c["place"]),
                    holds: text(&c["holds"]),
                    why: text(&c["why"]),
                    until: match c["until"].as_str() {
                        Some(until) => until.to_owned(),
                        None => format!("unknown: {}", text(&c["unknown"])),
                    },
                })
                .collect();
            Some(Physical {
                target: job.target.clone(),
                lines: lines("done").into_iter().chain(lines("verified")).collect(),
                remaining,
            })
        })
        .collect()
}

/// `GET /console/requests/{id}`.
pub(super) async fn request(
    State(state): State<ControlState>,
    Path(id): Path<String>,
    session: Session,
) -> Response {
    let found = match visible(&state, &session.caller, &id).await {
        Ok(record) => view(&state, record).await,
        Err(e) => Err(e),
    };
    let Ok(v) = found else {
        return message(
            StatusCode::NOT_FOUND,
            session.frame("Not found"),
            "No such erasure request.",
            false,
        );
    };
    let r = &v.record;
    let holds = if r.state == ErasureState::Held {
        state
            .store
            .holds(&r.tenant, Some(&r.subject))
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|h| h.hold.is_active(crate::now()))
            .map(|h| h.hold.reason)
            .collect()
    } else {
        Vec::new()
    };
    let mut refs: Vec<String> = v.targets.iter().map(|j| j.id.clone()).collect();
    refs.push(r.id.clone());
    let events = state
        .store
        .audit_of(&r.tenant, &refs, 500)
        .await
        .unwrap_or_default();
    // Never "nothing was found" for a list that could not be read.
    let derivatives = DerivativesSection::of(
        &session,
        &r.id,
        &r.tenant,
        state.store.derivatives(&r.id).await.ok(),
    );
    let now = crate::now();
    let me = &session.caller.claims.sub;
    let confusable = |other: &String| lethe_policy::names::confusable(other, me);
    let approver = if r.approvals.iter().any(confusable) {
        Approver::Approved
    } else if v.approvals_required >= 2 && confusable(&r.requested_by) {
        Approver::Filed
    } else {
        Approver::May
    };
    let page = RequestPage {
        frame: session.frame(&format!("Erasure request {}", r.id)),
        csrf: session.csrf.clone(),
        uri: request_uri(&r.id),
        steps: steps(r.state, r.suppressed_at.is_some()),
        subject_ref: session.caller.subject_ref(&r.tenant, &r.subject),
        badge: deadline_badge(r.deadline, now, r.state.is_final()),
        approvals_required: v.approvals_required,
        online_latency_ms: v.online_latency_ms,
        flips: &v.flip,
        extendable: !r.state.is_final() && r.deadline > now,
        months: (1..=MAX_EXTENSION_MONTHS).collect(),
        holds,
        step_form: match r.state {
            ErasureState::Exception => Some(("review", "Take it for review")),
            ErasureState::ManualReview => Some(("resume", "Resume: purge the failed stores again")),
            _ => None,
        },
        approvals_missing: (r.state == ErasureState::Requested)
            .then(|| v.approvals_required.saturating_sub(r.approvals.len())),
        approver,
        refusable: matches!(r.state, ErasureState::Requested | ErasureState::Held),
        stores: store_rows(&v),
        physical: physical(&v),
        public_key: state.erasure.certifier.public_key_hex(),
        derivatives,
        events,
        r,
    };
    render(StatusCode::OK, &page)
}

pub(super) async fn approve(
    State(state): State<ControlState>,
    Path(id): Path<String>,
    Posted { session, .. }: Posted,
) -> Response {
    let done = approve_as(&state, &session.caller, &id).await;
    then_to(&session, done, &request_uri(&id), "Not done")
}

pub(super) async fn extend(
    State(state): State<ControlState>,
    Path(id): Path<String>,
    Posted { session, fields }: Posted,
) -> Response {
    let req = ExtendRequest {
        months: fields.text("months").parse().unwrap_or(0),
        reason: fields.text("reason").to_owned(),
    };
    let done = extend_as(&state, &session.caller, &id, req).await;
    then_to(&session, done, &request_uri(&id), "Not extended")
}

pub(super) async fn reject(
    State(state): State<ControlState>,
    Path(id): Path<String>,
    Posted { session, fields }: Posted,
) -> Response {
    let req = RejectRequest {
        reason: fields.text("reason").to_owned(),
    };
    let done = reject_as(&state, &session.caller, &id, req).await;
    then_to(&session, done, &request_uri(&id), "Not refused")
}

/// Takes an `exception` for review, through the API's own handler.
pub(super) async fn review(
    state: State<ControlState>,
    id: Path<String>,
    posted: Posted,
) -> Response {
    by_person(state, id, posted, erasures::review).await
}

/// Purges a request's failed stores again, through the API's own handler.
pub(super) async fn resume(
    state: State<ControlState>,
    id: Path<String>,
    posted: Posted,
) -> Response {
    by_person(state, id, posted, erasures::resume).await
}

/// A step a person takes on a request, through the API's handler `step`.
async fn by_person<F, Fut>(
    State(state): State<ControlState>,
    Path(id): Path<String>,
    Posted { session, .. }: Posted,
    step: F,
) -> Response
where
    F: FnOnce(State<ControlState>, crate::extract::Caller, Path<String>) -> Fut,
    Fut: Future<Output = Result<axum::Json<ErasureView>, crate::error::ApiError>>,
{
    let done = step(
        State(state.clone()),
        session.caller.clone(),
        Path(id.clone()),
    )
    .await;
    then_to(&session, done, &request_uri(&id), "Not done")
}

/// The signed certificate, as the JSON document to keep (and verify with `lethe certificate
/// verify`), or with `?page` as a page.
pub(super) async fn certificate(
    State(state): State<ControlState>,
    Path(id): Path<String>,
    Query(query): Query<std::collections::HashMap<String, String>>,
    session: Session,
) -> Response {
    let as_page = query.contains_key("page");
    let mut accept = HeaderMap::new();
    if as_page {
        accept.insert(header::ACCEPT, HeaderValue::from_static("text/html"));
    }
    let answer = erasures::certificate(
        State(state.clone()),
        session.caller.clone(),
        Path(id.clone()),
        accept,
    )
    .await;
    match answer {
        Ok(response) if as_page => response,
        Ok(mut response) => {
            let name = format!(
                "attachment; filename=\"lethe-certificate-{}.json\"",
                urlencoding(&id)
            );
            if let Ok(value) = HeaderValue::from_str(&name) {
                response
                    .headers_mut()
                    .insert(header::CONTENT_DISPOSITION, value);
            }
            response
        }
        Err(e) => refused(&session, "No certificate", &e),
    }
}
