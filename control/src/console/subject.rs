//! A subject: its state, grants (grant, revoke), inventory per store, what derives from its data,
//! its legal holds, processors, and the form that files its erasure below the inventory it would
//! cover. Read through the API's own subject view.

use askama::Template;
use askama::filters::HtmlSafe;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use lethe_policy::{Action, ConsentStatus};

use super::derivatives::SubjectDerivatives;
use super::page::{Frame, render};
use super::policy::HoldsSection;
use super::{Posted, Session, StartForm, refused, subject_uri, then_to};
use crate::ControlState;
use crate::consents::{GrantRequest, grant_as, revoke_as};
use crate::error::ApiError;
use crate::subjects::{Processor, view_as};

/// A consent grant, as its row shows it.
struct Grant {
    id: String,
    purpose: String,
    category: String,
    actions: String,
    status: &'static str,
    /// Active now: it can be revoked.
    revocable: bool,
}

/// What Lethe knows of the subject, as the page shows it.
struct Known {
    state: &'static str,
    epoch: i64,
    subject_ref: String,
    held: bool,
    grants: Vec<Grant>,
    inventory: Vec<(String, i64)>,
    items: i64,
    /// `None`: the state store could not be read.
    derived: Option<SubjectDerivatives>,
    holds: HoldsSection,
    processors: Vec<Processor>,
    start: StartForm,
}

/// What the lookup found.
enum Found {
    /// Nothing was asked yet.
    Nothing,
    /// The key cannot be a subject key (why).
    BadKey(String),
    /// Lethe has no grant and no item of it.
    Unknown,
    Known(Box<Known>),
}

/// A checkbox for each consent action of the policy crate.
#[derive(Template)]
#[template(path = "console/actions.html")]
pub(crate) struct ActionBoxes {
    actions: &'static [Action],
}

impl Default for ActionBoxes {
    fn default() -> Self {
        ActionBoxes {
            actions: Action::ALL,
        }
    }
}

/// A template that escapes what it places: placed whole in the page.
impl HtmlSafe for ActionBoxes {}

#[derive(Template)]
#[template(path = "console/subject.html")]
struct SubjectPage {
    frame: Frame,
    csrf: String,
    /// The key looked up, in its one spelling once it is known.
    asked: String,
    found: Found,
    /// Whether the grant form is shown (a key that can be a subject's was asked).
    grantable: bool,
    actions: ActionBoxes,
}

/// `GET /console/subjects?subject=`.
pub(super) async fn subject(
    State(state): State<ControlState>,
    Query(query): Query<std::collections::HashMap<String, String>>,
    session: Session,
) -> Response {
    let asked = query.get("subject").map(|s| s.trim()).unwrap_or("");
    let tenant = session.caller.claims.tenant.clone();
    let (asked, found) = if asked.is_empty() {
        (String::new(), Found::Nothing)
    } else {
        // The key in its one spelling (case folded where the tenant's keys are), as every
        // store holds it.
        match state.folding.subject(&tenant, asked) {
            Err(e) => (asked.to_owned(), Found::BadKey(e.to_string())),
            Ok(key) => {
                let key = key.into_owned();
                match known(&state, &session, &tenant, &key).await {
                    Ok(found) => (key, found),
                    Err(e) => return refused(&session, "Subject", &e),
                }
            }
        }
    };
    let page = SubjectPage {
        frame: session.frame("Subjects"),
        csrf: session.csrf.clone(),
        grantable: matches!(found, Found::Unknown | Found::Known(_)),
        asked,
        found,
        actions: ActionBoxes::default(),
    };
    render(StatusCode::OK, &page)
}

/// What Lethe knows of `subject`, read through the API's subject view.
async fn known(
    state: &ControlState,
    session: &Session,
    tenant: &str,
    subject: &str,
) -> Result<Found, ApiError> {
    let v = match view_as(state, &session.caller, tenant, subject).await {
        Ok(v) => v,
        Err(e) if e.status == StatusCode::NOT_FOUND => return Ok(Found::Unknown),
        Err(e) => return Err(e),
    };
    let keys = [subject.to_owned()];
    let derived = state
        .store
        .closure_of(tenant, &keys, &state.erasure.targets)
        .await;
    let borrowed = state.store.borrowed(tenant, subject).await;
    let derived = match (derived, borrowed) {
        (Ok(derived), Ok(borrowed)) => {
            Some(SubjectDerivatives::of(session, tenant, &derived, &borrowed))
        }
        _ => None,
    };
    let grants = v
        .grants
        .iter()
        .map(|g| Grant {
            id: g.grant.id.clone(),
            purpose: g.grant.purpose.clone(),
            category: g.grant.category.clone(),
            actions: g
                .grant
                .actions
                .iter()
                .map(|a| a.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            status: g.status.as_str(),
            revocable: g.status == ConsentStatus::Active,
        })
        .collect();
    let holds = v.legal_holds.into_iter().map(|h| h.record).collect();
    Ok(Found::Known(Box::new(Known {
        state: v.state.as_str(),
        epoch: v.epoch,
        subject_ref: v.subject_ref,
        held: v.held,
        grants,
        items: v.inventory.values().sum(),
        inventory: v.inventory.into_iter().collect(),
        derived,
        holds: HoldsSection::of(session, holds, Some(subject)),
        processors: v.processors,
        start: StartForm::of(session, Some(subject)),
    })))
}

pub(super) async fn grant(
    State(state): State<ControlState>,
    Posted { session, fields }: Posted,
) -> Response {
    let subject = fields.text("subject").to_owned();
    let actions: Result<std::collections::BTreeSet<Action>, _> = fields
        .all("actions")
        .map(|a| serde_json::from_value(serde_json::Value::String(a.to_owned())))
        .collect();
    let Ok(actions) = actions else {
        return refused(
            &session,
            "Not granted",
            &ApiError::invalid("actions: unknown action"),
        );
    };
    let req = GrantRequest {
        tenant: None,
        subject: subject.clone(),
        purpose: fields.text("purpose").to_owned(),
        category: fields.text("category").to_owned(),
        actions,
        expires_at: None,
        source: fields.text("source").to_owned(),
        policy_version: 1,
    };
    let done = grant_as(&state, &session.caller, req).await;
    then_to(&session, done, &subject_uri(&subject), "Not granted")
}

pub(super) async fn revoke(
    State(state): State<ControlState>,
    Posted { session, fields }: Posted,
) -> Response {
    let done = revoke_as(&state, &session.caller, fields.text("grant")).await;
    then_to(
        &session,
        done,
        &subject_uri(fields.text("subject")),
        "Not revoked",
    )
}
