//! Filing an erasure: whom it names, then the dry run (what lineage and every store hold of the
//! subject now), then the ticket and reason, and only then the request.

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Redirect, Response};

use super::html::escape;
use super::{Session, field, posted, refused_page, request_uri};
use crate::control::ControlState;
use crate::control::erasures::{DryRun, DryRunRequest, FileRequest, dry_run_as, file_as};

/// Whom a request names, as the forms carry it: the tenant (the caller's when empty), the
/// subject, and aliases separated by commas.
struct Whom {
    tenant: Option<String>,
    subject: String,
    aliases: Vec<String>,
}

impl Whom {
    fn of(fields: &[(String, String)]) -> Whom {
        Whom {
            tenant: field(fields, "tenant")
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_owned),
            subject: field(fields, "subject").unwrap_or("").trim().to_owned(),
            aliases: field(fields, "aliases")
                .unwrap_or("")
                .split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(str::to_owned)
                .collect(),
        }
    }

    /// The same, as hidden fields of the next form.
    fn hidden(&self) -> String {
        let hidden = |name: &str, value: &str| {
            format!(
                "<input type=\"hidden\" name=\"{name}\" value=\"{}\">",
                escape(value)
            )
        };
        [
            hidden("tenant", self.tenant.as_deref().unwrap_or("")),
            hidden("subject", &self.subject),
            hidden("aliases", &self.aliases.join(", ")),
        ]
        .concat()
    }
}

/// The first step of filing: whom the erasure is for. `subject` is filled in when the person
/// comes from that subject's page.
pub(super) fn start_form(session: &Session, subject: Option<&str>) -> String {
    let subject_field = match subject {
        Some(subject) => format!(
            "<input type=\"hidden\" name=\"subject\" value=\"{}\">",
            escape(subject)
        ),
        None => "<label for=\"new-subject\">Subject key</label><input id=\"new-subject\" name=\"subject\" required>".to_owned(),
    };
    format!(
        "<form method=\"post\" action=\"/console/requests/dry-run\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\"><label for=\"new-tenant\">Tenant</label><input id=\"new-tenant\" name=\"tenant\" value=\"{tenant}\" required>{subject_field}<label for=\"aliases\">Aliases (other keys of the same person, comma-separated)</label><input id=\"aliases\" name=\"aliases\"><p><button type=\"submit\">Count what it would erase</button></p></form>",
        csrf = escape(&session.csrf),
        tenant = escape(&session.caller.claims.tenant),
    )
}

/// The dry run, then the form that files the request.
pub(super) async fn dry_run(State(state): State<ControlState>, request: Request) -> Response {
    let (session, fields) = match posted(&state, request).await {
        Ok(posted) => posted,
        Err(refused) => return *refused,
    };
    let whom = Whom::of(&fields);
    let req = DryRunRequest {
        tenant: whom.tenant.clone(),
        subject: whom.subject.clone(),
        aliases: whom.aliases.clone(),
    };
    match dry_run_as(&state, &session.caller, req).await {
        Ok(run) => session.page("File an erasure", &dry_run_body(&session, &whom, &run)),
        Err(e) => refused_page(&session, "No dry run", &e),
    }
}

fn dry_run_body(session: &Session, whom: &Whom, run: &DryRun) -> String {
    let mut rows = String::new();
    for store in &run.stores {
        let held = match (&store.held, &store.unknown) {
            (Some(n), _) => n.to_string(),
            (None, Some(why)) => format!("unknown: {}", escape(why)),
            (None, None) => "unknown".to_owned(),
        };
        rows.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{held}</td></tr>",
            escape(&store.target),
            store.lineage
        ));
    }
    let held: u64 = run.stores.iter().filter_map(|s| s.held).sum();
    let unknown = run.stores.iter().filter(|s| s.held.is_none()).count();
    let aliases = if whom.aliases.is_empty() {
        "no aliases".to_owned()
    } else {
        format!("aliases {}", escape(&whom.aliases.join(", ")))
    };
    format!(
        "<p>A dry run for subject <code>{subject_ref}</code> of {tenant} ({aliases}): nothing was changed. Each store was searched as its purge will search it, by the subject's stamp and by the ids lineage records.</p><table><caption>What the erasure would cover, per store</caption><thead><tr><th scope=\"col\">Store</th><th scope=\"col\">Lineage records</th><th scope=\"col\">Held by the store (its own count)</th></tr></thead><tbody>{rows}</tbody></table><p role=\"status\">{held} records held in all{unknown_note}.</p><h2>File it</h2><form method=\"post\" action=\"/console/requests\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">{hidden}<label for=\"ticket\">Ticket</label><input id=\"ticket\" name=\"ticket\" required><label for=\"reason\">Reason</label><input id=\"reason\" name=\"reason\" required><p><button type=\"submit\">File the erasure request</button></p></form>",
        subject_ref = escape(&run.subject_ref),
        tenant = escape(&run.tenant),
        unknown_note = if unknown == 0 {
            String::new()
        } else {
            format!("; {unknown} store(s) could not be counted")
        },
        csrf = escape(&session.csrf),
        hidden = whom.hidden(),
    )
}

pub(super) async fn file(State(state): State<ControlState>, request: Request) -> Response {
    let (session, fields) = match posted(&state, request).await {
        Ok(posted) => posted,
        Err(refused) => return *refused,
    };
    let whom = Whom::of(&fields);
    let req = FileRequest {
        tenant: whom.tenant,
        subject: whom.subject,
        aliases: whom.aliases,
        ticket: field(&fields, "ticket").unwrap_or("").to_owned(),
        reason: field(&fields, "reason").unwrap_or("").to_owned(),
    };
    match file_as(&state, &session.caller, req).await {
        Ok(record) => Redirect::to(&request_uri(&record.id)).into_response(),
        Err(e) => refused_page(&session, "Not filed", &e),
    }
}
