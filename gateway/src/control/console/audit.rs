//! The console's audit page: the tenant's events a page at a time, the chain verified on
//! demand, and the whole tenant's log as a download (JSON lines).

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::html::escape;
use super::{html, signed_in};
use crate::control::ControlState;
use crate::state::{ChainReport, verify_audit};

/// Events on one page.
const PAGE: i64 = 100;

pub async fn audit(
    State(state): State<ControlState>,
    Query(query): Query<HashMap<String, String>>,
    parts: Parts,
) -> Response {
    let session = match signed_in(&state, &parts).await {
        Ok(session) => session,
        Err(to) => return *to,
    };
    let tenant = session.caller.claims.tenant.clone();
    let after = query
        .get("after")
        .and_then(|a| a.parse::<i64>().ok())
        .filter(|a| *a >= 0)
        .unwrap_or(0);
    let mut body = String::from(
        "<p><a href=\"/console/audit?verify\">Verify the chain</a> · <a href=\"/console/audit/export\">Export (JSON lines)</a></p>",
    );
    if query.contains_key("verify") {
        let report = verify_audit(
            state.store.as_ref(),
            &state.audit_key,
            Some(&|h| state.erasure.certifier.genuine(h)),
            Some(&tenant),
            None,
        )
        .await;
        body.push_str(&match report {
            Ok(ChainReport::Intact { head, .. }) => format!(
                "<p role=\"status\" class=\"badge ok\">The chain of {} is intact: {} events, head {}.</p>",
                escape(&tenant),
                head.seq,
                escape(&head.hash)
            ),
            Ok(ChainReport::Broken { first_bad_seq, message, .. }) => format!(
                "<p role=\"alert\" class=\"badge late\">The chain is broken at event {first_bad_seq}: {}</p>",
                escape(&message)
            ),
            Err(_) => "<p role=\"alert\" class=\"error\">The state store cannot be read.</p>".to_owned(),
        });
    }
    let events = match state.store.audit_page(after, PAGE, Some(&tenant)).await {
        Ok(events) => events,
        Err(_) => {
            return html(
                StatusCode::SERVICE_UNAVAILABLE,
                super::page(
                    "Audit",
                    Some(&session.nav()),
                    "<p class=\"error\">The state store cannot be read.</p>",
                ),
            );
        }
    };
    body.push_str("<table><caption>Events, oldest first (content-free: no key, no text)</caption><thead><tr><th scope=\"col\">#</th><th scope=\"col\">At</th><th scope=\"col\">Actor</th><th scope=\"col\">Action</th><th scope=\"col\">Target</th><th scope=\"col\">Subject reference</th><th scope=\"col\">Result</th></tr></thead><tbody>");
    for e in &events {
        let subject: String = e
            .entry
            .subject_ref
            .as_deref()
            .unwrap_or("")
            .chars()
            .take(12)
            .collect();
        body.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} <span class=\"id\">{}</span></td><td><code>{}</code></td><td>{}</td></tr>",
            e.seq,
            e.entry.at.format("<time>%Y-%m-%d</time> <time>%H:%M:%S</time>"),
            escape(&e.entry.actor),
            escape(&e.entry.action),
            escape(&e.entry.target),
            escape(e.entry.target_ref.as_deref().unwrap_or("")),
            escape(&subject),
            escape(&e.entry.result),
        ));
    }
    body.push_str("</tbody></table>");
    if let (true, Some(last)) = (events.len() as i64 == PAGE, events.last()) {
        body.push_str(&format!(
            "<p><a href=\"/console/audit?after={}\">Next page</a></p>",
            last.seq
        ));
    }
    session.page("Audit", &body)
}

/// The tenant's whole log, one JSON event per line, as stored (hashes included, so that it can
/// be verified elsewhere).
pub async fn export(State(state): State<ControlState>, parts: Parts) -> Response {
    let session = match signed_in(&state, &parts).await {
        Ok(session) => session,
        Err(to) => return *to,
    };
    let tenant = session.caller.claims.tenant.clone();
    let mut out = String::new();
    let mut after = 0;
    loop {
        let Ok(events) = state.store.audit_page(after, 1000, Some(&tenant)).await else {
            return StatusCode::SERVICE_UNAVAILABLE.into_response();
        };
        for e in &events {
            out.push_str(&serde_json::to_string(e).unwrap_or_default());
            out.push('\n');
        }
        match events.last() {
            Some(last) if events.len() == 1000 => after = last.seq,
            _ => break,
        }
    }
    (
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"lethe-audit.jsonl\"",
            ),
        ],
        out,
    )
        .into_response()
}
