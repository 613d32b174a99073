//! What was made from a subject's data, in the console: a request's derivatives with the
//! erase-or-release form, and on a subject's page what derives from it and what its items derive
//! from. Content-free like the API: items by where they are kept, subjects by reference.

use axum::extract::{Path, Request, State};
use axum::response::Response;

use super::html::escape;
use super::{Session, field, posted, request_uri, then_to};
use crate::control::ControlState;
use crate::control::derivatives::{DecideRequest, decide_as};
use crate::state::{Decision, Derivative, Edge};

/// A subject's reference as the console shows it: short, with the whole one as its title.
fn short(session: &Session, tenant: &str, subject: Option<&str>) -> String {
    match subject {
        Some(s) => {
            let full = session.caller.subject_ref(tenant, s);
            format!(
                "<code title=\"{}\">{}</code>",
                escape(&full),
                escape(full.get(..12).unwrap_or(&full))
            )
        }
        None => "–".to_owned(),
    }
}

fn hows(how: &[lethe_policy::How]) -> String {
    how.iter()
        .map(|h| h.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A request's derivatives, and for those undecided the form that erases or releases them.
pub(super) fn section(session: &Session, id: &str, tenant: &str, found: &[Derivative]) -> String {
    let mut out = String::from("<h2>Derivatives</h2>");
    if found.is_empty() {
        out.push_str("<p>Nothing was found to be derived from the subject's data.</p>");
        return out;
    }
    let undecided = found.iter().any(|d| d.decision == Decision::Undecided);
    out.push_str("<p>What was made from the subject's data (summaries, extracted facts, model answers, copies), in every store, hidden since the flip. The subject's own are purged with it; another subject's are erased or released by a person; what holds nothing only keeps writes that would derive from it refused.</p>");
    if undecided {
        out.push_str(&format!(
            "<form method=\"post\" action=\"/console/requests/{}/derivatives\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">",
            escape(id),
            escape(&session.csrf)
        ));
    }
    out.push_str("<table><thead><tr><th scope=\"col\"></th><th scope=\"col\">Store</th><th scope=\"col\">Collection</th><th scope=\"col\">Item</th><th scope=\"col\">Whose</th><th scope=\"col\">How</th><th scope=\"col\">Decision</th></tr></thead><tbody>");
    for d in found {
        let pick = if d.decision == Decision::Undecided {
            format!(
                "<input type=\"checkbox\" name=\"refs\" value=\"{r}\" id=\"{r}\" aria-label=\"{item}\">",
                r = escape(&d.reference),
                item = escape(&d.item.item)
            )
        } else {
            String::new()
        };
        let decision = match (&d.decided_by, &d.reason) {
            (Some(by), Some(reason)) => format!(
                "{} (by {}: {})",
                d.decision.as_str(),
                escape(by),
                escape(reason)
            ),
            _ => d.decision.as_str().to_owned(),
        };
        let erased = if d.erased_at.is_some() {
            ", verified gone"
        } else {
            ""
        };
        out.push_str(&format!(
            "<tr><td>{pick}</td><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{decision}{erased}</td></tr>",
            escape(&d.item.store),
            escape(&d.item.collection),
            escape(&d.item.item),
            short(session, tenant, d.subject.as_deref()),
            hows(&d.how),
        ));
    }
    out.push_str("</tbody></table>");
    if undecided {
        out.push_str("<label for=\"decision\">Decision for the items ticked</label><select id=\"decision\" name=\"decision\"><option value=\"erase\">Erase: it is the subject's data</option><option value=\"release\">Release: it is its own subject's, readable again</option></select><label for=\"derivative-reason\">Reason (for the record)</label><input id=\"derivative-reason\" name=\"reason\" required><p><button type=\"submit\">Decide</button></p></form>");
    }
    out
}

/// `POST /console/requests/{id}/derivatives`: the ticked derivatives erased or released.
pub(super) async fn decide(
    State(state): State<ControlState>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    let (session, fields) = match posted(&state, request).await {
        Ok(posted) => posted,
        Err(refused) => return *refused,
    };
    let refs: Vec<String> = fields
        .iter()
        .filter(|(k, _)| k == "refs")
        .map(|(_, v)| v.clone())
        .collect();
    let decision = match field(&fields, "decision") {
        Some("erase") => Decision::Erase,
        Some("release") => Decision::Release,
        _ => Decision::Undecided,
    };
    let req = DecideRequest {
        refs,
        decision,
        reason: field(&fields, "reason").unwrap_or("").to_owned(),
    };
    then_to(
        &session,
        decide_as(&state, &session.caller, &id, req).await,
        &request_uri(&id),
        "Not decided",
    )
}

/// On a subject's page: what other subjects' items derive from its data (found as its erasure's
/// flip would find them), and what its items derive from.
pub(super) fn subject_section(
    session: &Session,
    tenant: &str,
    derived: &[Derivative],
    borrowed: &[Edge],
) -> String {
    let mut out = String::from("<h3>Derived from this subject's data</h3>");
    let others: Vec<&Derivative> = derived
        .iter()
        .filter(|d| !d.own && d.decision != Decision::Guard)
        .collect();
    if others.is_empty() {
        out.push_str("<p>No other subject's item is known to derive from this subject's data.</p>");
    } else {
        out.push_str("<p>Its erasure hides these at the flip; then a person erases or releases each (or, with <code>[lineage] cross_subject = \"erase\"</code>, they are erased with it):</p><table><thead><tr><th scope=\"col\">Store</th><th scope=\"col\">Collection</th><th scope=\"col\">Item</th><th scope=\"col\">Whose</th><th scope=\"col\">How</th></tr></thead><tbody>");
        for d in others {
            out.push_str(&format!(
                "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
                escape(&d.item.store),
                escape(&d.item.collection),
                escape(&d.item.item),
                short(session, tenant, d.subject.as_deref()),
                hows(&d.how)
            ));
        }
        out.push_str("</tbody></table>");
    }
    out.push_str("<h3>What this subject's items derive from</h3>");
    if borrowed.is_empty() {
        out.push_str("<p>None of its items is known to derive from another subject's.</p>");
    } else {
        out.push_str("<table><thead><tr><th scope=\"col\">Its item</th><th scope=\"col\">Derives from</th><th scope=\"col\">Whose</th><th scope=\"col\">How</th></tr></thead><tbody>");
        for e in borrowed {
            out.push_str(&format!(
                "<tr><td><code>{}</code> ({})</td><td><code>{}</code> ({})</td><td>{}</td><td>{}</td></tr>",
                escape(&e.child.item),
                escape(&e.child.store),
                escape(&e.parent.item),
                escape(&e.parent.store),
                short(session, tenant, Some(&e.parent_owner)),
                e.how.as_str()
            ));
        }
        out.push_str("</tbody></table>");
    }
    out
}
