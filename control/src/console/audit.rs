//! The console's audit page: the tenant's events a page at a time, the chain verified on
//! demand, and the whole tenant's log as a download (JSON lines).

use std::collections::HashMap;

use askama::Template;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use lethe_policy::audit::AuditRecord;

use super::Session;
use super::page::{Frame, message, render};
use crate::ControlState;
use crate::state::{ChainReport, verify_audit};

/// Events on one page.
const PAGE: i64 = 100;

/// What verifying the tenant's chain found.
enum Verified {
    Intact { events: i64, head: String },
    Broken { at: i64, why: String },
    Unreadable,
}

#[derive(Template)]
#[template(path = "console/audit.html")]
struct AuditPage {
    frame: Frame,
    tenant: String,
    verified: Option<Verified>,
    events: Vec<AuditRecord>,
    /// Where the next page starts, when this one is full.
    next: Option<i64>,
}

pub async fn audit(
    State(state): State<ControlState>,
    Query(query): Query<HashMap<String, String>>,
    session: Session,
) -> Response {
    let tenant = session.caller.claims.tenant.clone();
    let after = query
        .get("after")
        .and_then(|a| a.parse::<i64>().ok())
        .filter(|a| *a >= 0)
        .unwrap_or(0);
    let verified = if query.contains_key("verify") {
        let report = verify_audit(
            state.store.as_ref(),
            &state.audit_key,
            Some(&|h| state.erasure.certifier.genuine(h)),
            Some(&tenant),
            None,
        )
        .await;
        Some(match report {
            Ok(ChainReport::Intact { head, .. }) => Verified::Intact {
                events: head.seq,
                head: head.hash,
            },
            Ok(ChainReport::Broken {
                first_bad_seq,
                message,
                ..
            }) => Verified::Broken {
                at: first_bad_seq,
                why: message,
            },
            Err(_) => Verified::Unreadable,
        })
    } else {
        None
    };
    let Ok(events) = state.store.audit_page(after, PAGE, Some(&tenant)).await else {
        return message(
            StatusCode::SERVICE_UNAVAILABLE,
            session.frame("Audit"),
            "The state store cannot be read.",
            true,
        );
    };
    let next = events
        .last()
        .filter(|_| events.len() as i64 == PAGE)
        .map(|last| last.seq);
    let page = AuditPage {
        frame: session.frame("Audit"),
        tenant,
        verified,
        events,
        next,
    };
    render(StatusCode::OK, &page)
}

/// The tenant's whole log, one JSON event per line, as stored (hashes included, so that it can
/// be verified elsewhere).
pub async fn export(State(state): State<ControlState>, session: Session) -> Response {
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
