//! The console's policy page: the tenant's retention rules (edited as a new version, after a
//! preview of what changes) and its legal holds (placed and released).

use std::collections::BTreeMap;

use askama::Template;
use askama::filters::HtmlSafe;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Utc};
use lethe_policy::RetentionPolicy;
use serde_json::Value;

use super::page::{Frame, render};
use super::{Fields, Posted, Session, refused, subject_uri, then_to};
use crate::ControlState;
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiQuery};
use crate::state::{HoldRecord, RetentionVersion};
use crate::{holds, retention};

/// A rule's key and what it keeps, as the page shows them.
fn rules_of(policy: &RetentionPolicy) -> BTreeMap<String, String> {
    policy
        .rules
        .iter()
        .map(|rule| {
            let v = serde_json::to_value(rule).unwrap_or(Value::Null);
            let key = format!(
                "{} / {} / {}",
                rule.purpose,
                rule.category,
                v["layer"].as_str().unwrap_or("any layer")
            );
            let keeps = format!(
                "{}{}",
                v["max_age"].as_str().unwrap_or(""),
                v["legal_end"]
                    .as_str()
                    .map(|e| format!(", legal end {e}"))
                    .unwrap_or_default()
            );
            (key, keeps)
        })
        .collect()
}

#[derive(Template)]
#[template(path = "console/policy.html")]
struct PolicyPage {
    frame: Frame,
    csrf: String,
    current: Option<RetentionVersion>,
    rules: BTreeMap<String, String>,
    /// The rules as JSON, to edit.
    text: String,
    holds: HoldsSection,
}

pub async fn policy(State(state): State<ControlState>, session: Session) -> Response {
    let tenant = session.caller.claims.tenant.clone();
    let current = state.store.retention(&tenant).await.ok().flatten();
    let holds = state.store.holds(&tenant, None).await.unwrap_or_default();
    let policy = current
        .as_ref()
        .map(|v| v.policy.clone())
        .unwrap_or_default();
    let page = PolicyPage {
        frame: session.frame("Policy"),
        csrf: session.csrf.clone(),
        rules: rules_of(&policy),
        text: serde_json::to_string_pretty(&policy).unwrap_or_default(),
        current,
        holds: HoldsSection::of(&session, holds, None),
    };
    render(StatusCode::OK, &page)
}

/// Legal holds with their release buttons, and the form placing one: the tenant's, or on a
/// subject's page (`subject`) those covering the subject and a hold on it, coming back there.
#[derive(Template)]
#[template(path = "console/holds.html")]
pub(super) struct HoldsSection {
    csrf: String,
    holds: Vec<HoldRecord>,
    subject: Option<String>,
    now: DateTime<Utc>,
}

/// A template that escapes what it places: placed whole in the page.
impl HtmlSafe for HoldsSection {}

impl HoldsSection {
    pub(super) fn of(
        session: &Session,
        holds: Vec<HoldRecord>,
        subject: Option<&str>,
    ) -> HoldsSection {
        HoldsSection {
            csrf: session.csrf.clone(),
            holds,
            subject: subject.map(str::to_owned),
            now: crate::now(),
        }
    }
}

/// Where a hold's form goes back to: the subject's page it came from, or the policy page.
fn back_to(fields: &Fields) -> String {
    match (fields.get("back"), fields.get("subject")) {
        (Some("subject"), Some(subject)) => subject_uri(subject),
        _ => "/console/policy".to_owned(),
    }
}

/// The rules a form sent, checked as the API checks them.
fn parsed(text: &str) -> Result<RetentionPolicy, ApiError> {
    let policy: RetentionPolicy = serde_json::from_str(text)
        .map_err(|e| ApiError::invalid(format!("the rules are not valid JSON rules: {e}")))?;
    policy.validate().map_err(ApiError::validation)?;
    Ok(policy)
}

/// A rule the new version adds, changes or removes.
struct Change {
    change: &'static str,
    rule: String,
    was: String,
    will: String,
}

#[derive(Template)]
#[template(path = "console/preview.html")]
struct PreviewPage {
    frame: Frame,
    csrf: String,
    version: i64,
    changes: Vec<Change>,
    /// The rules as sent, saved as they are.
    text: String,
}

/// What the new version changes, rule by rule, and the form that saves it.
pub async fn preview(
    State(state): State<ControlState>,
    Posted { session, fields }: Posted,
) -> Response {
    let text = fields.text("rules");
    let next = match parsed(text) {
        Ok(policy) => policy,
        Err(e) => return refused(&session, "Not changed", &e),
    };
    let tenant = session.caller.claims.tenant.clone();
    let current = state.store.retention(&tenant).await.ok().flatten();
    let before = current
        .as_ref()
        .map(|v| rules_of(&v.policy))
        .unwrap_or_default();
    let after = rules_of(&next);
    let changes = before
        .keys()
        .chain(after.keys().filter(|k| !before.contains_key(*k)))
        .filter_map(|key| {
            let (was, will) = (before.get(key), after.get(key));
            let change = match (was, will) {
                (Some(a), Some(b)) if a == b => return None,
                (Some(_), Some(_)) => "changed",
                (None, Some(_)) => "added",
                (Some(_), None) => "removed",
                (None, None) => return None,
            };
            Some(Change {
                change,
                rule: key.clone(),
                was: was.cloned().unwrap_or_default(),
                will: will.cloned().unwrap_or_default(),
            })
        })
        .collect();
    let page = PreviewPage {
        frame: session.frame("Preview of the new rules"),
        csrf: session.csrf.clone(),
        version: current.map_or(0, |v| v.version) + 1,
        changes,
        text: text.to_owned(),
    };
    render(StatusCode::OK, &page)
}

pub async fn save(
    State(state): State<ControlState>,
    Posted { session, fields }: Posted,
) -> Response {
    let policy = match parsed(fields.text("rules")) {
        Ok(policy) => policy,
        Err(e) => return refused(&session, "Not changed", &e),
    };
    let saved = retention::replace(
        State(state.clone()),
        session.caller.clone(),
        ApiQuery(retention::TenantQuery { tenant: None }),
        ApiJson(policy),
    )
    .await;
    then_to(&session, saved, "/console/policy", "Not changed")
}

pub async fn place_hold(
    State(state): State<ControlState>,
    Posted { session, fields }: Posted,
) -> Response {
    let subject = Some(fields.text("subject").trim()).filter(|s| !s.is_empty());
    let placed = holds::place(
        State(state.clone()),
        session.caller.clone(),
        ApiJson(holds::PlaceRequest {
            tenant: None,
            subject: subject.map(str::to_owned),
            reason: fields.text("reason").to_owned(),
        }),
    )
    .await;
    then_to(&session, placed, &back_to(&fields), "No hold placed")
}

pub async fn release_hold(
    State(state): State<ControlState>,
    Posted { session, fields }: Posted,
) -> Response {
    let released = holds::release(
        State(state.clone()),
        session.caller.clone(),
        Path(fields.text("hold").to_owned()),
    )
    .await;
    then_to(&session, released, &back_to(&fields), "Not released")
}
