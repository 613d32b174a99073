//! Filing an erasure: whom it names, then the dry run (what lineage and every store hold of the
//! subject now), then the ticket and reason, and only then the request.

use askama::Template;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};

use super::page::{Frame, render};
use super::{Fields, Posted, Session, refused, request_uri};
use crate::ControlState;
use crate::erasures::{DryRun, DryRunRequest, FileRequest, dry_run_as, file_as};

/// Whom a request names, as the forms carry it: the tenant (the caller's when empty), the
/// subject, and aliases separated by commas.
struct Whom {
    tenant: Option<String>,
    subject: String,
    aliases: Vec<String>,
}

impl Whom {
    fn of(fields: &Fields) -> Whom {
        Whom {
            tenant: Some(fields.text("tenant").trim())
                .filter(|t| !t.is_empty())
                .map(str::to_owned),
            subject: fields.text("subject").trim().to_owned(),
            aliases: fields
                .text("aliases")
                .split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(str::to_owned)
                .collect(),
        }
    }
}

/// The first step of filing: whom the erasure is for, the caller's tenant filled in. `subject`
/// is set when the person comes from that subject's page.
pub struct StartForm {
    pub(super) tenant: String,
    pub(super) subject: Option<String>,
}

impl StartForm {
    pub(super) fn of(session: &Session, subject: Option<&str>) -> StartForm {
        StartForm {
            tenant: session.caller.claims.tenant.clone(),
            subject: subject.map(str::to_owned),
        }
    }
}

#[derive(Template)]
#[template(path = "console/dry_run.html")]
struct DryRunPage {
    frame: Frame,
    csrf: String,
    whom: Whom,
    run: DryRun,
    held: u64,
    unknown: usize,
}

/// The dry run, then the form that files the request.
pub(super) async fn dry_run(
    State(state): State<ControlState>,
    Posted { session, fields }: Posted,
) -> Response {
    let whom = Whom::of(&fields);
    let req = DryRunRequest {
        tenant: whom.tenant.clone(),
        subject: whom.subject.clone(),
        aliases: whom.aliases.clone(),
    };
    match dry_run_as(&state, &session.caller, req).await {
        Ok(run) => render(
            StatusCode::OK,
            &DryRunPage {
                frame: session.frame("File an erasure"),
                csrf: session.csrf.clone(),
                held: run.stores.iter().filter_map(|s| s.held).sum(),
                unknown: run.stores.iter().filter(|s| s.held.is_none()).count(),
                whom,
                run,
            },
        ),
        Err(e) => refused(&session, "No dry run", &e),
    }
}

pub(super) async fn file(
    State(state): State<ControlState>,
    Posted { session, fields }: Posted,
) -> Response {
    let whom = Whom::of(&fields);
    let req = FileRequest {
        tenant: whom.tenant,
        subject: whom.subject,
        aliases: whom.aliases,
        ticket: fields.text("ticket").to_owned(),
        reason: fields.text("reason").to_owned(),
    };
    match file_as(&state, &session.caller, req).await {
        Ok(record) => Redirect::to(&request_uri(&record.id)).into_response(),
        Err(e) => refused(&session, "Not filed", &e),
    }
}
