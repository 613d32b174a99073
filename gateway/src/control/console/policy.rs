//! The console's policy page: the tenant's retention rules (edited as a new version, after a
//! preview of what changes) and its legal holds (placed and released).

use std::collections::BTreeMap;

use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::response::Response;
use lethe_policy::RetentionPolicy;
use serde_json::Value;

use super::html::escape;
use super::{Session, field, posted, refused_page, signed_in, then_to};
use crate::control::ControlState;
use crate::control::error::ApiError;
use crate::control::extract::{ApiJson, ApiQuery};

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

fn rules_table(policy: &RetentionPolicy) -> String {
    let mut out = String::from(
        "<table><caption>Retention rules (purpose / category / layer)</caption><thead><tr><th scope=\"col\">Rule</th><th scope=\"col\">Keeps for</th></tr></thead><tbody>",
    );
    for (key, keeps) in rules_of(policy) {
        out.push_str(&format!(
            "<tr><td>{}</td><td>{}</td></tr>",
            escape(&key),
            escape(&keeps)
        ));
    }
    out.push_str("</tbody></table>");
    out
}

pub async fn policy(State(state): State<ControlState>, parts: Parts) -> Response {
    let session = match signed_in(&state, &parts).await {
        Ok(session) => session,
        Err(to) => return *to,
    };
    let tenant = session.caller.claims.tenant.clone();
    let current = state.store.retention(&tenant).await.ok().flatten();
    let holds = state.store.holds(&tenant, None).await.unwrap_or_default();
    let csrf = escape(&session.csrf);
    let mut body = match &current {
        Some(v) => format!(
            "<p>Version {}, set {} by {}.</p>{}",
            v.version,
            v.created_at.format("%Y-%m-%d %H:%M UTC"),
            escape(&v.created_by),
            rules_table(&v.policy)
        ),
        None => "<p>No retention rules yet: nothing can be written for this tenant.</p>".to_owned(),
    };
    let text = serde_json::to_string_pretty(&current.map(|v| v.policy).unwrap_or_default())
        .unwrap_or_default();
    body.push_str(&format!(
        "<h2>Edit as a new version</h2><form method=\"post\" action=\"/console/policy/preview\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\"><label for=\"rules\">Rules (JSON, as the API takes them)</label><textarea id=\"rules\" name=\"rules\" rows=\"12\" cols=\"80\">{}</textarea><p><button type=\"submit\">Preview the change</button></p></form>",
        escape(&text)
    ));
    body.push_str("<h2>Legal holds</h2>");
    body.push_str(&holds_section(&session, &holds, None));
    session.page("Policy", &body)
}

/// Legal holds with their release buttons, and the form placing one: the tenant's, or on a
/// subject's page (`subject`) those covering the subject and a hold on it, coming back there.
pub(super) fn holds_section(
    session: &Session,
    holds: &[crate::state::HoldRecord],
    subject: Option<&str>,
) -> String {
    let csrf = escape(&session.csrf);
    let back = subject.map_or(String::new(), |s| {
        format!(
            "<input type=\"hidden\" name=\"back\" value=\"subject\"><input type=\"hidden\" name=\"subject\" value=\"{}\">",
            escape(s)
        )
    });
    let mut out = String::from(
        "<table><thead><tr><th scope=\"col\">Covers</th><th scope=\"col\">Reason</th><th scope=\"col\">Placed</th><th scope=\"col\">State</th><th scope=\"col\"></th></tr></thead><tbody>",
    );
    for h in holds {
        let active = h.hold.is_active(crate::now());
        let covers = h
            .hold
            .subject
            .as_deref()
            .map_or("the whole tenant".to_owned(), |s| {
                format!("subject {}", escape(s))
            });
        let release = if active {
            format!(
                "<form method=\"post\" action=\"/console/holds/release\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">{back}<input type=\"hidden\" name=\"hold\" value=\"{}\"><button type=\"submit\">Release</button></form>",
                escape(&h.hold.id)
            )
        } else {
            String::new()
        };
        out.push_str(&format!(
            "<tr><td>{covers}</td><td>{}</td><td>{} by {}</td><td>{}</td><td>{release}</td></tr>",
            escape(&h.hold.reason),
            h.hold.placed_at.format("%Y-%m-%d"),
            escape(&h.placed_by),
            if active { "active" } else { "released" },
        ));
    }
    if holds.is_empty() {
        out.push_str("<tr><td colspan=\"5\">No legal holds.</td></tr>");
    }
    out.push_str("</tbody></table><h3>Place a hold</h3>");
    let covers = match subject {
        Some(_) => back.clone(),
        None => "<label for=\"hold-subject\">Subject (empty: the whole tenant)</label><input id=\"hold-subject\" name=\"subject\">".to_owned(),
    };
    out.push_str(&format!(
        "<form method=\"post\" action=\"/console/holds/place\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">{covers}<label for=\"hold-reason\">Reason</label><input id=\"hold-reason\" name=\"reason\" required><p><button type=\"submit\">Place the hold</button></p></form>"
    ));
    out
}

/// Where a hold's form goes back to: the subject's page it came from, or the policy page.
fn back_to(fields: &[(String, String)]) -> String {
    match (field(fields, "back"), field(fields, "subject")) {
        (Some("subject"), Some(subject)) => super::subject_uri(subject),
        _ => "/console/policy".to_owned(),
    }
}

fn parsed(session: &Session, text: &str) -> Result<RetentionPolicy, Box<Response>> {
    let policy: RetentionPolicy = serde_json::from_str(text).map_err(|e| {
        Box::new(refused_page(
            session,
            "Not changed",
            &ApiError::invalid(format!("the rules are not valid JSON rules: {e}")),
        ))
    })?;
    policy.validate().map_err(|problems| {
        Box::new(refused_page(
            session,
            "Not changed",
            &ApiError::validation(problems),
        ))
    })?;
    Ok(policy)
}

/// What the new version changes, rule by rule, and the form that saves it.
pub async fn preview(State(state): State<ControlState>, request: Request) -> Response {
    let (session, fields) = match posted(&state, request).await {
        Ok(posted) => posted,
        Err(refused) => return *refused,
    };
    let text = field(&fields, "rules").unwrap_or("");
    let next = match parsed(&session, text) {
        Ok(policy) => policy,
        Err(refused) => return *refused,
    };
    let tenant = session.caller.claims.tenant.clone();
    let current = state.store.retention(&tenant).await.ok().flatten();
    let before = current
        .as_ref()
        .map(|v| rules_of(&v.policy))
        .unwrap_or_default();
    let after = rules_of(&next);
    let mut rows = String::new();
    for key in before
        .keys()
        .chain(after.keys().filter(|k| !before.contains_key(*k)))
    {
        let (was, will) = (before.get(key), after.get(key));
        let change = match (was, will) {
            (Some(a), Some(b)) if a == b => continue,
            (Some(_), Some(_)) => "changed",
            (None, Some(_)) => "added",
            (Some(_), None) => "removed",
            (None, None) => continue,
        };
        rows.push_str(&format!(
            "<tr><td>{change}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(key),
            escape(was.map_or("", String::as_str)),
            escape(will.map_or("", String::as_str)),
        ));
    }
    let version = current.map_or(0, |v| v.version) + 1;
    let body = format!(
        "<table><caption>What version {version} changes</caption><thead><tr><th scope=\"col\">Change</th><th scope=\"col\">Rule</th><th scope=\"col\">Now</th><th scope=\"col\">Then</th></tr></thead><tbody>{}</tbody></table><form method=\"post\" action=\"/console/policy\"><input type=\"hidden\" name=\"csrf\" value=\"{}\"><input type=\"hidden\" name=\"rules\" value=\"{}\"><p><button type=\"submit\">Save as version {version}</button></p></form><p><a href=\"/console/policy\">Back, without saving</a></p>",
        if rows.is_empty() {
            "<tr><td colspan=\"4\">No rule changes.</td></tr>".to_owned()
        } else {
            rows
        },
        escape(&session.csrf),
        escape(text),
    );
    session.page("Preview of the new rules", &body)
}

pub async fn save(State(state): State<ControlState>, request: Request) -> Response {
    let (session, fields) = match posted(&state, request).await {
        Ok(posted) => posted,
        Err(refused) => return *refused,
    };
    let policy = match parsed(&session, field(&fields, "rules").unwrap_or("")) {
        Ok(policy) => policy,
        Err(refused) => return *refused,
    };
    let saved = crate::control::retention::replace(
        State(state.clone()),
        session.caller.clone(),
        ApiQuery(crate::control::retention::TenantQuery { tenant: None }),
        ApiJson(policy),
    )
    .await;
    then_to(&session, saved, "/console/policy", "Not changed")
}

pub async fn place_hold(State(state): State<ControlState>, request: Request) -> Response {
    let (session, fields) = match posted(&state, request).await {
        Ok(posted) => posted,
        Err(refused) => return *refused,
    };
    let subject = field(&fields, "subject")
        .map(str::trim)
        .filter(|s| !s.is_empty());
    let placed = crate::control::holds::place(
        State(state.clone()),
        session.caller.clone(),
        ApiJson(crate::control::holds::PlaceRequest {
            tenant: None,
            subject: subject.map(str::to_owned),
            reason: field(&fields, "reason").unwrap_or("").to_owned(),
        }),
    )
    .await;
    then_to(&session, placed, &back_to(&fields), "No hold placed")
}

pub async fn release_hold(State(state): State<ControlState>, request: Request) -> Response {
    let (session, fields) = match posted(&state, request).await {
        Ok(posted) => posted,
        Err(refused) => return *refused,
    };
    let id = field(&fields, "hold").unwrap_or("").to_owned();
    let released = crate::control::holds::release(
        State(state.clone()),
        session.caller.clone(),
        axum::extract::Path(id),
    )
    .await;
    then_to(&session, released, &back_to(&fields), "Not released")
}
