//! Erasure requests: file, approve, follow. Approval flips the subject (unreadable and unwritable
//! on every replica) before the answer is sent; purging the stores follows.

use crate::error_shape::Code;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use lethe_policy::{ErasureEvent, ErasureState};
use serde::{Deserialize, Serialize};

use super::error::{ApiError, not_found_as};
use super::extract::{ApiJson, Caller};
use super::{ControlState, Problems};
use crate::erasure::certificate::render_html;
use crate::erasure::inventory::StoreCount;
use crate::state::{DeadlineExtension, ErasureRecord, MAX_EXTENSION_MONTHS, PurgeJob, Rejection};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRequest {
    pub(crate) tenant: Option<String>,
    pub(crate) subject: String,
    #[serde(default)]
    pub(crate) aliases: Vec<String>,
    /// The data subject request's ticket, for the record.
    pub(crate) ticket: String,
    pub(crate) reason: String,
}

#[derive(Debug, Serialize)]
pub struct ErasureView {
    #[serde(flatten)]
    pub(crate) record: ErasureRecord,
    pub(crate) approvals_required: usize,
    /// From the request to the flip: how long the subject stayed readable.
    pub(crate) online_latency_ms: Option<i64>,
    pub(crate) targets: Vec<PurgeJob>,
    /// What the closure of the subject reached beyond its own items, by decision (`undecided`
    /// ones wait for a person: `GET .../derivatives`).
    pub(crate) derivatives: std::collections::BTreeMap<&'static str, usize>,
    /// Each governed database with the policy changes it has yet to take.
    governed: Vec<GovernedLag>,
    /// Each governed database the flip must hold in, and since when it does: until every one
    /// does, the request is `propagating`, never `suppressed`.
    pub(crate) flip: Vec<crate::state::GovernedFlip>,
}

#[derive(Debug, Serialize)]
struct GovernedLag {
    database: String,
    pending_changes: u64,
}

pub(crate) async fn view(
    state: &ControlState,
    record: ErasureRecord,
) -> Result<ErasureView, ApiError> {
    let targets = state.store.purge_jobs(&record.id).await?;
    let mut derivatives = std::collections::BTreeMap::new();
    for d in state.store.derivatives(&record.id).await? {
        *derivatives.entry(d.decision.as_str()).or_default() += 1;
    }
    let online_latency_ms = record
        .suppressed_at
        .map(|at| (at - record.requested_at).num_milliseconds());
    let flip = state.store.governed_flips(&record.id).await?;
    Ok(ErasureView {
        flip,
        record,
        approvals_required: state.erasure.approvals_required,
        online_latency_ms,
        targets,
        derivatives,
        governed: state
            .governed
            .pending()
            .into_iter()
            .map(|(database, pending_changes)| GovernedLag {
                database: database.to_owned(),
                pending_changes,
            })
            .collect(),
    })
}

pub async fn file(
    State(state): State<ControlState>,
    caller: Caller,
    ApiJson(req): ApiJson<FileRequest>,
) -> Result<(StatusCode, Json<ErasureView>), ApiError> {
    let record = file_as(&state, &caller, req).await?;
    Ok((StatusCode::CREATED, Json(view(&state, record).await?)))
}

/// Whom a request names, each in its one spelling (written back): the caller's tenant (or the
/// one it asks for), a subject, aliases other than the subject. Problems are added to `problems`.
fn whom(
    state: &ControlState,
    caller: &Caller,
    problems: &mut Problems,
    tenant: Option<&str>,
    subject: &mut String,
    aliases: &mut [String],
) -> Result<String, ApiError> {
    let mut tenant = caller.tenant(tenant)?.to_owned();
    problems.name("tenant", &mut tenant);
    let fold = state.folding.folds(&tenant);
    problems.key("subject", subject, fold);
    for (i, alias) in aliases.iter_mut().enumerate() {
        problems.key(&format!("aliases[{i}]"), alias, fold);
    }
    let subject = &*subject;
    problems.check(!aliases.iter().any(|a| a == subject), || {
        "aliases: must not repeat the subject".into()
    });
    Ok(tenant)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DryRunRequest {
    pub(crate) tenant: Option<String>,
    pub(crate) subject: String,
    #[serde(default)]
    pub(crate) aliases: Vec<String>,
}

/// What an erasure of the subject would cover, per store, before it is filed.
#[derive(Debug, Serialize)]
pub struct DryRun {
    pub(crate) tenant: String,
    pub(crate) subject_ref: String,
    pub(crate) stores: Vec<StoreCount>,
    /// What its flip would hide beyond the subject's own items: derived from them, per store.
    pub(crate) derivatives: Vec<DerivativeCount>,
}

/// A store's derivatives of a subject, before the request is filed.
#[derive(Debug, Default, Serialize)]
pub struct DerivativeCount {
    pub(crate) store: String,
    /// Stamped to the subject: purged with its items.
    pub(crate) own: u64,
    /// Stamped to other subjects: erased or released by a person (or erased, by policy).
    pub(crate) other: u64,
    /// Holding nothing (a model's answer not kept, an item deleted) or out of every purge's reach.
    pub(crate) guarded: u64,
}

pub async fn dry_run(
    State(state): State<ControlState>,
    caller: Caller,
    ApiJson(req): ApiJson<DryRunRequest>,
) -> Result<Json<DryRun>, ApiError> {
    Ok(Json(dry_run_as(&state, &caller, req).await?))
}

/// Counts the subject in lineage and in every store (the API's and the console's); audited,
/// since it reads every store for a person.
pub(crate) async fn dry_run_as(
    state: &ControlState,
    caller: &Caller,
    mut req: DryRunRequest,
) -> Result<DryRun, ApiError> {
    let mut problems = Problems::default();
    let tenant = whom(
        state,
        caller,
        &mut problems,
        req.tenant.as_deref(),
        &mut req.subject,
        &mut req.aliases,
    )?;
    problems.into_result()?;
    let keys: Vec<String> = std::iter::once(req.subject.clone())
        .chain(req.aliases)
        .collect();
    let closure = state
        .store
        .closure_of(&tenant, &keys, &state.erasure.targets)
        .await?;
    let mut derivatives: std::collections::BTreeMap<&str, DerivativeCount> = Default::default();
    for d in &closure {
        let count = derivatives
            .entry(&d.item.store)
            .or_insert_with(|| DerivativeCount {
                store: d.item.store.clone(),
                ..DerivativeCount::default()
            });
        match d.decision {
            crate::state::Decision::Guard => count.guarded += 1,
            _ if d.own => count.own += 1,
            _ => count.other += 1,
        }
    }
    let derivatives: Vec<DerivativeCount> = derivatives.into_values().collect();
    let stores = state.erasure.inventory.count(&tenant, keys).await?;
    state
        .store
        .append_audit(caller.audit(
            &tenant,
            "erasure.dry_run",
            Some(&req.subject),
            "erasure",
            None,
        ))
        .await?;
    Ok(DryRun {
        subject_ref: caller.subject_ref(&tenant, &req.subject),
        tenant,
        stores,
        derivatives,
    })
}

/// A request the caller files (the API's and the console's).
pub(crate) async fn file_as(
    state: &ControlState,
    caller: &Caller,
    mut req: FileRequest,
) -> Result<ErasureRecord, ApiError> {
    let mut problems = Problems::default();
    let tenant = whom(
        state,
        caller,
        &mut problems,
        req.tenant.as_deref(),
        &mut req.subject,
        &mut req.aliases,
    )?;
    problems.text("ticket", &req.ticket);
    problems.text("reason", &req.reason);
    problems.into_result()?;
    let now = crate::now();
    let record = ErasureRecord {
        id: format!("er_{}", uuid::Uuid::new_v4().simple()),
        tenant,
        subject: req.subject,
        aliases: req.aliases,
        ticket: req.ticket,
        reason: req.reason,
        state: ErasureState::Requested,
        requested_by: caller.claims.sub.clone(),
        requested_at: now,
        deadline: crate::state::deadline(now, state.erasure.deadline_months),
        approvals: Vec::new(),
        suppressed_at: None,
        completed_at: None,
        updated_at: now,
        extension: None,
        rejection: None,
    };
    let audit = caller.erasure_audit(&record, "erasure.request");
    state
        .store
        .create_erasure(&record, &state.erasure.targets, audit)
        .await?;
    Ok(record)
}

pub(crate) async fn visible(
    state: &ControlState,
    caller: &Caller,
    id: &str,
) -> Result<ErasureRecord, ApiError> {
    let record = state
        .store
        .erasure(id)
        .await
        .map_err(not_found_as("erasure request"))?;
    if caller.can_see(&record.tenant) {
        Ok(record)
    } else {
        Err(ApiError::not_found("erasure request"))
    }
}

pub async fn approve(
    State(state): State<ControlState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<ErasureView>, ApiError> {
    let approved = approve_as(&state, &caller, &id).await?;
    Ok(Json(view(&state, approved).await?))
}

/// The caller's approval of a request of its tenant (the API's and the console's).
pub(crate) async fn approve_as(
    state: &ControlState,
    caller: &Caller,
    id: &str,
) -> Result<ErasureRecord, ApiError> {
    caller.second_factor(state)?;
    let record = visible(state, caller, id).await?;
    let audit = caller.erasure_audit(&record, "erasure.approve");
    let required = state.erasure.approvals_required;
    let approved = state
        .store
        .approve_erasure(id, &caller.claims.sub, required, crate::now(), audit)
        .await?;
    flip_held(state, approved).await
}

/// How long an approval waits for its flip to hold in every governed database before it answers
/// `propagating`, naming the databases that lag.
const FLIP_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The request once its flip holds everywhere, or as it stands after [`FLIP_WAIT`].
async fn flip_held(state: &ControlState, record: ErasureRecord) -> Result<ErasureRecord, ApiError> {
    let deadline = tokio::time::Instant::now() + FLIP_WAIT;
    let mut record = record;
    let mut pause = std::time::Duration::from_millis(5);
    while record.state == ErasureState::Propagating
        && record.suppressed_at.is_none()
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_millis(100));
        record = state.store.erasure(&record.id).await?;
    }
    Ok(record)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtendRequest {
    pub(crate) months: u32,
    /// Why the request needs longer (its complexity, the number of requests): told to the data
    /// subject within the first deadline.
    pub(crate) reason: String,
}

pub async fn extend(
    State(state): State<ControlState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<ExtendRequest>,
) -> Result<Json<ErasureView>, ApiError> {
    let extended = extend_as(&state, &caller, &id, req).await?;
    Ok(Json(view(&state, extended).await?))
}

/// Extends an open request's deadline once, before it passes, by at most
/// [`MAX_EXTENSION_MONTHS`] (the API's and the console's).
pub(crate) async fn extend_as(
    state: &ControlState,
    caller: &Caller,
    id: &str,
    req: ExtendRequest,
) -> Result<ErasureRecord, ApiError> {
    let record = visible(state, caller, id).await?;
    let mut problems = Problems::default();
    problems.check((1..=MAX_EXTENSION_MONTHS).contains(&req.months), || {
        format!("months: must be 1 to {MAX_EXTENSION_MONTHS}")
    });
    problems.text("reason", &req.reason);
    problems.into_result()?;
    let now = crate::now();
    let refused = |why: String| ApiError::new(StatusCode::CONFLICT, Code::NotExtendable, why);
    if record.state.is_final() {
        return Err(refused(format!("the erasure is {}", record.state)));
    }
    if record.extension.is_some() {
        return Err(refused("the deadline was extended already".into()));
    }
    let due = record.deadline;
    if due <= now {
        // An extension is made, and told to the subject, within the first deadline.
        return Err(refused(format!(
            "the deadline passed on {}",
            due.format("%Y-%m-%d")
        )));
    }
    let extension = DeadlineExtension {
        months: req.months,
        reason: req.reason,
        by: caller.claims.sub.clone(),
        at: now,
    };
    let audit = caller.erasure_audit(&record, "erasure.extend_deadline");
    Ok(state.store.extend_erasure(id, &extension, audit).await?)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RejectRequest {
    /// Why (identity not confirmed, an exemption of art. 17(3)), as the data subject is told.
    pub(crate) reason: String,
}

pub async fn reject(
    State(state): State<ControlState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<RejectRequest>,
) -> Result<Json<ErasureView>, ApiError> {
    let rejected = reject_as(&state, &caller, &id, req).await?;
    Ok(Json(view(&state, rejected).await?))
}

/// Refuses a request not flipped yet, with the reason (the API's and the console's).
pub(crate) async fn reject_as(
    state: &ControlState,
    caller: &Caller,
    id: &str,
    req: RejectRequest,
) -> Result<ErasureRecord, ApiError> {
    let record = visible(state, caller, id).await?;
    let mut problems = Problems::default();
    problems.text("reason", &req.reason);
    problems.into_result()?;
    let rejection = Rejection {
        reason: req.reason,
        by: caller.claims.sub.clone(),
        at: crate::now(),
    };
    let audit = caller.erasure_audit(&record, "erasure.reject");
    Ok(state.store.reject_erasure(id, &rejection, audit).await?)
}

/// `exception` -> `manual_review`: a person has taken the request.
pub async fn review(
    state: State<ControlState>,
    caller: Caller,
    id: Path<String>,
) -> Result<Json<ErasureView>, ApiError> {
    step_by_person(state, caller, id, ErasureEvent::Escalate, "erasure.review").await
}

/// `manual_review` -> `propagating`: the cause is dealt with; the failed stores are purged again.
pub async fn resume(
    state: State<ControlState>,
    caller: Caller,
    id: Path<String>,
) -> Result<Json<ErasureView>, ApiError> {
    step_by_person(state, caller, id, ErasureEvent::Resume, "erasure.resume").await
}

async fn step_by_person(
    State(state): State<ControlState>,
    caller: Caller,
    Path(id): Path<String>,
    event: ErasureEvent,
    action: &str,
) -> Result<Json<ErasureView>, ApiError> {
    if event == ErasureEvent::Resume {
        caller.second_factor(&state)?;
    }
    let record = visible(&state, &caller, &id).await?;
    let audit = caller.erasure_audit(&record, action);
    let record = state
        .store
        .review_erasure(&id, event, crate::now(), audit)
        .await?;
    Ok(Json(view(&state, record).await?))
}

pub async fn status(
    State(state): State<ControlState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<ErasureView>, ApiError> {
    let record = visible(&state, &caller, &id).await?;
    Ok(Json(view(&state, record).await?))
}

/// The signed certificate of a completed erasure: the canonical JSON document, or with
/// `Accept: text/html` a page for people.
pub async fn certificate(
    State(state): State<ControlState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: axum::http::HeaderMap,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let record = visible(&state, &caller, &id).await?;
    if record.state != ErasureState::Completed {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            Code::NotCompleted,
            format!(
                "the erasure is {}; a certificate comes with completion",
                record.state
            ),
        ));
    }
    let document = state
        .erasure
        .certifier
        .certificate(state.store.as_ref(), &record)
        .await?;
    let wants_html = headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/html"));
    Ok(if wants_html {
        axum::response::Html(render_html(document.as_bytes())).into_response()
    } else {
        (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            document,
        )
            .into_response()
    })
}
