//! What was made from a subject's data, in the console: a request's derivatives with the
//! erase-or-release form, and on a subject's page what derives from it and what its items derive
//! from. Content-free like the API: items by where they are kept, subjects by reference.

use askama::Template;
use askama::filters::HtmlSafe;
use axum::extract::{Path, State};
use axum::response::Response;

use super::{Posted, Session, request_uri, then_to};
use crate::ControlState;
use crate::derivatives::{DecideRequest, decide_as};
use crate::state::{Decision, Derivative, Edge};

/// A derivative, as its row shows it: where it is kept, whose it is (by reference), how it was
/// reached, what was decided.
struct Row {
    reference: String,
    store: String,
    collection: String,
    item: String,
    whose: Option<String>,
    how: String,
    undecided: bool,
    decision: String,
    erased: bool,
}

fn hows(how: &[lethe_policy::How]) -> String {
    how.iter()
        .map(|h| h.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

impl Row {
    fn of(session: &Session, tenant: &str, d: &Derivative) -> Row {
        Row {
            reference: d.reference.clone(),
            store: d.item.store.clone(),
            collection: d.item.collection.clone(),
            item: d.item.item.clone(),
            whose: d
                .subject
                .as_deref()
                .map(|s| session.caller.subject_ref(tenant, s)),
            how: hows(&d.how),
            undecided: d.decision == Decision::Undecided,
            decision: match (&d.decided_by, &d.reason) {
                (Some(by), Some(reason)) => format!("{} (by {by}: {reason})", d.decision.as_str()),
                _ => d.decision.as_str().to_owned(),
            },
            erased: d.erased_at.is_some(),
        }
    }
}

/// A request's derivatives (`None`: they could not be read), with the erase-or-release form
/// for those undecided.
#[derive(Template)]
#[template(path = "console/derivatives.html")]
pub(super) struct DerivativesSection {
    csrf: String,
    action: String,
    rows: Option<Vec<Row>>,
    undecided: bool,
}

/// A template that escapes what it places: placed whole in the page.
impl HtmlSafe for DerivativesSection {}

impl DerivativesSection {
    pub(super) fn of(
        session: &Session,
        id: &str,
        tenant: &str,
        found: Option<Vec<Derivative>>,
    ) -> DerivativesSection {
        let rows: Option<Vec<Row>> =
            found.map(|found| found.iter().map(|d| Row::of(session, tenant, d)).collect());
        DerivativesSection {
            csrf: session.csrf.clone(),
            action: format!("{}/derivatives", request_uri(id)),
            undecided: rows.iter().flatten().any(|r| r.undecided),
            rows,
        }
    }
}

/// `POST /console/requests/{id}/derivatives`: the ticked derivatives erased or released.
pub(super) async fn decide(
    State(state): State<ControlState>,
    Path(id): Path<String>,
    Posted { session, fields }: Posted,
) -> Response {
    let decision = match fields.text("decision") {
        "erase" => Decision::Erase,
        "release" => Decision::Release,
        _ => Decision::Undecided,
    };
    let req = DecideRequest {
        refs: fields.all("refs").map(str::to_owned).collect(),
        decision,
        reason: fields.text("reason").to_owned(),
    };
    then_to(
        &session,
        decide_as(&state, &session.caller, &id, req).await,
        &request_uri(&id),
        "Not decided",
    )
}

/// An edge from one of the subject's items to another subject's it derives from.
struct Borrowed {
    item: String,
    store: String,
    parent_item: String,
    parent_store: String,
    whose: Option<String>,
    how: &'static str,
}

/// On a subject's page: what other subjects' items derive from its data (found as its erasure's
/// flip would find them), and what its items derive from.
#[derive(Template)]
#[template(path = "console/subject_derivatives.html")]
pub(super) struct SubjectDerivatives {
    others: Vec<Row>,
    borrowed: Vec<Borrowed>,
}

/// A template that escapes what it places: placed whole in the page.
impl HtmlSafe for SubjectDerivatives {}

impl SubjectDerivatives {
    pub(super) fn of(
        session: &Session,
        tenant: &str,
        derived: &[Derivative],
        borrowed: &[Edge],
    ) -> SubjectDerivatives {
        SubjectDerivatives {
            others: derived
                .iter()
                .filter(|d| !d.own && d.decision != Decision::Guard)
                .map(|d| Row::of(session, tenant, d))
                .collect(),
            borrowed: borrowed
                .iter()
                .map(|e| Borrowed {
                    item: e.child.item.clone(),
                    store: e.child.store.clone(),
                    parent_item: e.parent.item.clone(),
                    parent_store: e.parent.store.clone(),
                    whose: Some(session.caller.subject_ref(tenant, &e.parent_owner)),
                    how: e.how.as_str(),
                })
                .collect(),
        }
    }
}
