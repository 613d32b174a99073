//! The compliance console (`/console`): server-rendered pages for the DPO, on the control
//! listener, from the binary alone. Who is signed in, and how, is [`session`]'s.

mod audit;
mod derivatives;
mod filing;
mod html;
mod policy;
mod session;

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use lethe_policy::ErasureState;

use super::ControlState;
use super::consents::{GrantRequest, grant_as, revoke_as};
use super::erasures::{
    ErasureView, ExtendRequest, RejectRequest, approve_as, extend_as, reject_as, view, visible,
};
use super::extract::Caller;
use crate::state::{DueWindow, ErasureFilter, ErasureStats, MAX_EXTENSION_MONTHS};
use html::{deadline_badge, escape, page, steps};
pub use session::SignInLimit;
use session::{Session, posted, signed_in};

/// The requests one page of the list shows.
const LIST_LIMIT: u32 = 100;

pub fn routes() -> Router<ControlState> {
    Router::new()
        .route(
            "/console",
            get(|| async { Redirect::to("/console/requests") }),
        )
        .route(
            "/console/sign-in",
            get(session::sign_in_form).post(session::sign_in),
        )
        .route("/console/sign-out", post(session::sign_out))
        .route("/console/requests", get(requests).post(filing::file))
        .route("/console/requests/dry-run", post(filing::dry_run))
        .route("/console/requests/{id}", get(request))
        .route("/console/requests/{id}/approve", post(approve))
        .route("/console/requests/{id}/review", post(review))
        .route("/console/requests/{id}/resume", post(resume))
        .route("/console/requests/{id}/extend", post(extend))
        .route("/console/requests/{id}/reject", post(reject))
        .route(
            "/console/requests/{id}/derivatives",
            post(derivatives::decide),
        )
        .route("/console/requests/{id}/certificate", get(certificate))
        .route("/console/subjects", get(subject))
        .route("/console/subjects/grant", post(grant))
        .route("/console/subjects/revoke", post(revoke))
        .route("/console/audit", get(audit::audit))
        .route("/console/policy", get(policy::policy).post(policy::save))
        .route("/console/policy/preview", post(policy::preview))
        .route("/console/holds/place", post(policy::place_hold))
        .route("/console/holds/release", post(policy::release_hold))
        .route("/console/audit/export", get(audit::export))
        .layer(axum::middleware::map_response(guarded))
}

/// Every console answer: never framed by another site, never sniffed as another type, nothing
/// loaded or sent but to the console itself, no address of it handed on.
async fn guarded(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

fn html(status: StatusCode, body: String) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

/// The fields of a form body.
fn form(body: &[u8]) -> Vec<(String, String)> {
    form_urlencoded::parse(body).into_owned().collect()
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Every erasure request of the caller's tenant, with its deadline.
async fn requests(
    State(state): State<ControlState>,
    axum::extract::Query(query): axum::extract::Query<std::collections::HashMap<String, String>>,
    parts: Parts,
) -> Response {
    let session = match signed_in(&state, &parts).await {
        Ok(session) => session,
        Err(to) => return *to,
    };
    let tenant = session.caller.claims.tenant.clone();
    let now = crate::now();
    let state_filter = query
        .get("state")
        .and_then(|s| ErasureState::ALL.into_iter().find(|e| e.to_string() == *s));
    let due_filter = query
        .get("due")
        .map(String::as_str)
        .filter(|d| !d.is_empty());
    let due = match due_filter {
        Some("overdue") => Some(DueWindow {
            from: None,
            to: Some(now),
        }),
        Some("week") => Some(DueWindow {
            from: Some(now),
            to: Some(now + chrono::TimeDelta::days(7)),
        }),
        _ => None,
    };
    let filter = ErasureFilter {
        state: state_filter,
        open: due.is_some(),
        due,
    };
    let page_number: u32 = query.get("page").and_then(|p| p.parse().ok()).unwrap_or(0);
    let listed = state
        .store
        .erasures(
            &tenant,
            &filter,
            page_number.saturating_mul(LIST_LIMIT),
            LIST_LIMIT + 1,
        )
        .await;
    let stats = state
        .store
        .erasure_stats(&tenant, now, now - chrono::TimeDelta::days(30))
        .await;
    let (mut records, stats) = match (listed, stats) {
        (Ok(records), Ok(stats)) => (records, stats),
        _ => {
            return html(
                StatusCode::SERVICE_UNAVAILABLE,
                page(
                    "Unavailable",
                    Some(&session.nav()),
                    "<p class=\"error\">The state store cannot be read.</p>",
                ),
            );
        }
    };
    let more = records.len() > LIST_LIMIT as usize;
    records.truncate(LIST_LIMIT as usize);
    let mut rows = String::new();
    for r in &records {
        let due = r.deadline;
        rows.push_str(&format!(
            "<tr><td><a href=\"/console/requests/{id}\">{id}</a></td><td><code>{subject}</code></td><td>{ticket}</td><td>{state}</td><td><time>{requested}</time></td><td><time>{due}</time>{extended}</td><td>{badge}</td></tr>",
            id = escape(&r.id),
            subject = escape(&short_ref(&session.caller, &r.tenant, &r.subject)),
            ticket = escape(&r.ticket),
            state = escape(&r.state.to_string()),
            requested = r.requested_at.format("%Y-%m-%d"),
            due = due.format("%Y-%m-%d"),
            extended = if r.extension.is_some() { " (extended)" } else { "" },
            badge = deadline_badge(due, now, r.state.is_final()),
        ));
    }
    let mut body = summary(stats);
    body.push_str(&format!(
        "<details><summary>File a new request</summary>{}</details>",
        filing::start_form(&session, None)
    ));
    let chosen_state = state_filter.map(|s| s.to_string());
    body.push_str(&filters(chosen_state.as_deref(), due_filter));
    body.push_str(&if records.is_empty() {
        "<p>No erasure requests here.</p>".to_owned()
    } else {
        format!(
            "<table><caption>Erasure requests of {tenant} (newest first)</caption><thead><tr><th scope=\"col\">Request</th><th scope=\"col\">Subject reference</th><th scope=\"col\">Ticket</th><th scope=\"col\">State</th><th scope=\"col\">Received</th><th scope=\"col\">Deadline</th><th scope=\"col\">Time</th></tr></thead><tbody>{rows}</tbody></table>",
            tenant = escape(&tenant)
        )
    });
    if more {
        let mut next: Vec<String> = query
            .iter()
            .filter(|(k, _)| *k != "page")
            .map(|(k, v)| format!("{}={}", urlencoding(k), urlencoding(v)))
            .collect();
        next.push(format!("page={}", page_number + 1));
        body.push_str(&format!(
            "<p><a href=\"/console/requests?{}\">Older requests</a></p>",
            escape(&next.join("&"))
        ));
    }
    session.page("Erasure requests", &body)
}

/// A subject's reference, as the audit log names it, shortened for a table.
fn short_ref(caller: &Caller, tenant: &str, subject: &str) -> String {
    let reference = caller.subject_ref(tenant, subject);
    reference.chars().take(12).collect()
}

/// Open requests by state, overdue ones, and the median online and completion latency of the
/// last 30 days.
fn summary(stats: ErasureStats) -> String {
    let (mut online, mut completion) = (stats.online_ms, stats.completion_s);
    let median = |xs: &mut Vec<i64>, unit: &str| {
        xs.sort_unstable();
        xs.get(xs.len() / 2)
            .map_or("none yet".to_owned(), |m| format!("{m} {unit}"))
    };
    let by_state = if stats.open.is_empty() {
        "none".to_owned()
    } else {
        stats
            .open
            .iter()
            .map(|(s, n)| format!("{} {n}", escape(s)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "<dl><dt>Open, by state</dt><dd>{by_state}</dd><dt>Overdue</dt><dd>{}</dd><dt>Median online latency (30 days)</dt><dd>{}</dd><dt>Median completion latency (30 days)</dt><dd>{}</dd></dl>",
        stats.overdue,
        median(&mut online, "ms"),
        median(&mut completion, "s"),
    )
}

/// The list's filters: by state, and by deadline.
fn filters(state: Option<&str>, due: Option<&str>) -> String {
    let option = |value: &str, label: &str, chosen: Option<&str>| {
        let selected = if chosen == Some(value) {
            " selected"
        } else {
            ""
        };
        format!("<option value=\"{value}\"{selected}>{label}</option>")
    };
    let states: String = std::iter::once(option("", "every state", state))
        .chain(
            ErasureState::ALL
                .iter()
                .map(|s| option(&s.to_string(), &s.to_string(), state)),
        )
        .collect();
    let dues: String = [
        ("", "any deadline"),
        ("overdue", "overdue"),
        ("week", "due within 7 days"),
    ]
    .iter()
    .map(|(v, l)| option(v, l, due))
    .collect();
    format!(
        "<form method=\"get\" action=\"/console/requests\"><label for=\"state\">State</label><select id=\"state\" name=\"state\">{states}</select><label for=\"due\">Deadline</label><select id=\"due\" name=\"due\">{dues}</select><p><button type=\"submit\">Filter</button></p></form>"
    )
}

/// One request: where it stands, its approvals, each store's progress, what may be done.
async fn request(
    State(state): State<ControlState>,
    Path(id): Path<String>,
    parts: Parts,
) -> Response {
    let session = match signed_in(&state, &parts).await {
        Ok(session) => session,
        Err(to) => return *to,
    };
    let found = match visible(&state, &session.caller, &id).await {
        Ok(record) => view(&state, record).await,
        Err(e) => Err(e),
    };
    match found {
        Ok(v) => {
            let holds = if v.record.state == ErasureState::Held {
                state
                    .store
                    .holds(&v.record.tenant, Some(&v.record.subject))
                    .await
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|h| h.hold.is_active(crate::now()))
                    .map(|h| h.hold.reason)
                    .collect()
            } else {
                Vec::new()
            };
            let mut refs: Vec<String> = v.targets.iter().map(|j| j.id.clone()).collect();
            refs.push(v.record.id.clone());
            let events = state
                .store
                .audit_of(&v.record.tenant, &refs, 500)
                .await
                .unwrap_or_default();
            let key = state.erasure.certifier.public_key_hex();
            let mut body = request_body(&session, &v, &holds, &key);
            match state.store.derivatives(&v.record.id).await {
                Ok(found) => body.push_str(&derivatives::section(
                    &session,
                    &v.record.id,
                    &v.record.tenant,
                    &found,
                )),
                // Never "nothing was found" for a list that could not be read.
                Err(_) => body.push_str(
                    "<h2>Derivatives</h2><p role=\"alert\">The state store could not list what this request's closure reached; reload the page to try again.</p>",
                ),
            }
            body.push_str(&timeline(&events));
            session.page(&format!("Erasure request {}", v.record.id), &body)
        }
        Err(_) => html(
            StatusCode::NOT_FOUND,
            page(
                "Not found",
                Some(&session.nav()),
                "<p>No such erasure request.</p>",
            ),
        ),
    }
}

/// A button that posts `action` for the request, with the session's CSRF token.
fn action_form(session: &Session, id: &str, action: &str, label: &str) -> String {
    format!(
        "<form method=\"post\" action=\"/console/requests/{}/{action}\"><input type=\"hidden\" name=\"csrf\" value=\"{}\"><button type=\"submit\">{label}</button></form>",
        escape(id),
        escape(&session.csrf)
    )
}

/// The form extending a request's deadline, once, by up to two months, with a reason.
fn extend_form(session: &Session, id: &str) -> String {
    let months: String = (1..=MAX_EXTENSION_MONTHS)
        .map(|m| {
            format!(
                "<option value=\"{m}\">{m} month{}</option>",
                if m == 1 { "" } else { "s" }
            )
        })
        .collect();
    format!(
        "<details><summary>Extend the deadline</summary><form method=\"post\" action=\"/console/requests/{}/extend\"><input type=\"hidden\" name=\"csrf\" value=\"{}\"><label for=\"months\">By</label><select id=\"months\" name=\"months\">{months}</select><label for=\"extension-reason\">Reason (told to the data subject within the first deadline)</label><input id=\"extension-reason\" name=\"reason\" required><p><button type=\"submit\">Extend the deadline</button></p></form></details>",
        escape(id),
        escape(&session.csrf)
    )
}

/// `public_key`: the certificates' verification key.
fn request_body(session: &Session, v: &ErasureView, holds: &[String], public_key: &str) -> String {
    let r = &v.record;
    let now = crate::now();
    let due = r.deadline;
    let mut out = steps(r.state, r.suppressed_at.is_some());
    out.push_str(&format!(
        "<dl><dt>State</dt><dd>{state}</dd><dt>Subject reference</dt><dd><code>{subject}</code></dd><dt>Ticket</dt><dd>{ticket}</dd><dt>Reason</dt><dd>{reason}</dd><dt>Received</dt><dd>{requested}</dd><dt>Deadline</dt><dd>{due} {badge}</dd><dt>Approvals</dt><dd>{approvals} of {required}: {who}</dd><dt>Online latency</dt><dd>{online}</dd></dl>",
        state = escape(&r.state.to_string()),
        subject = escape(&session.caller.subject_ref(&r.tenant, &r.subject)),
        ticket = escape(&r.ticket),
        reason = escape(&r.reason),
        requested = r.requested_at.format("%Y-%m-%d %H:%M UTC"),
        due = due.format("%Y-%m-%d"),
        badge = deadline_badge(due, now, r.state.is_final()),
        approvals = r.approvals.len(),
        required = v.approvals_required,
        who = if r.approvals.is_empty() {
            "none yet".to_owned()
        } else {
            escape(&r.approvals.join(", "))
        },
        online = v
            .online_latency_ms
            .map_or("not suppressed yet".to_owned(), |ms| format!(
                "{ms} ms from the request to the flip"
            )),
    ));
    if !v.flip.is_empty() {
        out.push_str("<p>The flip in each governed database:</p><ul>");
        for f in &v.flip {
            let held = f.applied_at.map_or(
                "does not hold yet: a transaction from before it may still read or write the subject there".to_owned(),
                |at| format!("holds since {}", at.format("%Y-%m-%d %H:%M:%S UTC")),
            );
            out.push_str(&format!("<li>{}: {held}</li>", escape(&f.database)));
        }
        out.push_str("</ul>");
    }
    match &r.extension {
        Some(e) => out.push_str(&format!(
            "<p>The deadline was extended by {} month{} on {} by {}: {}</p>",
            e.months,
            if e.months == 1 { "" } else { "s" },
            e.at.format("%Y-%m-%d"),
            escape(&e.by),
            escape(&e.reason)
        )),
        None if !r.state.is_final() && due > now => out.push_str(&extend_form(session, &r.id)),
        None => {}
    }
    if let Some(no) = &r.rejection {
        out.push_str(&format!(
            "<p role=\"status\">Refused on {} by {}: {}</p>",
            no.at.format("%Y-%m-%d %H:%M UTC"),
            escape(&no.by),
            escape(&no.reason)
        ));
    }
    if let Some(done) = r.completed_at {
        out.push_str(&format!(
            "<p>Completed {} ({} s after the request).</p>",
            done.format("%Y-%m-%d %H:%M UTC"),
            (done - r.requested_at).num_seconds()
        ));
    }
    if !holds.is_empty() {
        out.push_str("<p role=\"status\">Parked by legal holds; it continues when every hold covering it is released:</p><ul>");
        for reason in holds {
            out.push_str(&format!("<li>{}</li>", escape(reason)));
        }
        out.push_str("</ul>");
    }
    match r.state {
        ErasureState::Exception => {
            out.push_str(&action_form(session, &r.id, "review", "Take it for review"))
        }
        ErasureState::ManualReview => out.push_str(&action_form(
            session,
            &r.id,
            "resume",
            "Resume: purge the failed stores again",
        )),
        _ => {}
    }
    if r.state == ErasureState::Requested {
        let still = v.approvals_required.saturating_sub(r.approvals.len());
        out.push_str(&format!(
            "<p>{still} more approval{} needed, by any compliance or admin person of {} who has not approved it yet{}.</p>",
            if still == 1 { "" } else { "s" },
            escape(&r.tenant),
            if v.approvals_required >= 2 { " and did not file it" } else { "" }
        ));
        let me = &session.caller.claims.sub;
        let confusable = |other: &String| lethe_policy::names::confusable(other, me);
        if r.approvals.iter().any(confusable) {
            out.push_str("<p>You approved this request; another person must approve it too.</p>");
        } else if v.approvals_required >= 2 && confusable(&r.requested_by) {
            out.push_str("<p>You filed this request: two other people must approve it.</p>");
        } else {
            out.push_str(&action_form(
                session,
                &r.id,
                "approve",
                "Approve the erasure",
            ));
        }
    }
    if matches!(r.state, ErasureState::Requested | ErasureState::Held) {
        out.push_str(&format!(
            "<details><summary>Refuse the request</summary><form method=\"post\" action=\"/console/requests/{}/reject\"><input type=\"hidden\" name=\"csrf\" value=\"{}\"><label for=\"rejection-reason\">Reason (identity not confirmed, an exemption of art. 17(3); told to the data subject)</label><input id=\"rejection-reason\" name=\"reason\" required><p><button type=\"submit\">Refuse the request</button></p></form></details>",
            escape(&r.id),
            escape(&session.csrf)
        ));
    }
    out.push_str("<h2>Stores</h2><table><thead><tr><th scope=\"col\">Store</th><th scope=\"col\">State</th><th scope=\"col\">Before</th><th scope=\"col\">Deleted</th><th scope=\"col\">Remaining</th><th scope=\"col\">Attempts</th><th scope=\"col\">Last error</th></tr></thead><tbody>");
    for job in &v.targets {
        let count = |k: &str| {
            job.result
                .as_ref()
                .and_then(|r| r.get(k))
                .map_or("–".to_owned(), |n| n.to_string())
        };
        out.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&job.target),
            escape(&job.state),
            count("before"),
            count("deleted"),
            count("remaining"),
            job.attempts,
            escape(job.last_error.as_deref().unwrap_or("")),
        ));
    }
    out.push_str("</tbody></table>");
    out.push_str(&physical(v));
    if r.state == ErasureState::Completed {
        out.push_str(&format!(
            "<h2>Certificate</h2><p><a href=\"/console/requests/{id}/certificate\">The signed certificate</a> (JSON, to keep) · <a href=\"/console/requests/{id}/certificate?page\">as a page</a></p><p>It is signed with Ed25519 by this Lethe, whose public key is <code>{key}</code> (compare it with the key your organisation publishes, from <code>lethe certificate public-key</code>). Anyone can verify the download:</p><pre><code>lethe certificate verify lethe-certificate-{id}.json --key {key}</code></pre>",
            id = escape(&r.id),
            key = escape(public_key),
        ));
    }
    out
}

async fn approve(
    State(state): State<ControlState>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    let (session, _) = match posted(&state, request).await {
        Ok(posted) => posted,
        Err(refused) => return *refused,
    };
    let done = approve_as(&state, &session.caller, &id).await;
    then_to(&session, done, &request_uri(&id), "Not done")
}

/// An id as a path segment.
fn urlencoding(id: &str) -> String {
    form_urlencoded::byte_serialize(id.as_bytes()).collect()
}

/// A refusal of the API's, as a page.
fn refused_page(session: &Session, title: &str, e: &super::error::ApiError) -> Response {
    let details: String = e
        .details
        .iter()
        .map(|d| format!("<li>{}</li>", escape(d)))
        .collect();
    html(
        e.status,
        page(
            title,
            Some(&session.nav()),
            &format!(
                "<p class=\"error\" role=\"alert\">{}</p><ul>{details}</ul>",
                escape(&e.message)
            ),
        ),
    )
}

fn subject_uri(subject: &str) -> String {
    format!("/console/subjects?subject={}", urlencoding(subject))
}

/// A subject: its state, grants (grant, revoke), inventory per store and processors, and the
/// form that files its erasure, below the inventory it would cover.
async fn subject(
    State(state): State<ControlState>,
    axum::extract::Query(query): axum::extract::Query<std::collections::HashMap<String, String>>,
    parts: Parts,
) -> Response {
    let session = match signed_in(&state, &parts).await {
        Ok(session) => session,
        Err(to) => return *to,
    };
    let asked = query.get("subject").map(|s| s.trim()).unwrap_or("");
    let mut body = format!(
        "<form method=\"get\" action=\"/console/subjects\"><label for=\"subject\">Subject key</label><input id=\"subject\" name=\"subject\" value=\"{}\" required><p><button type=\"submit\">Look up</button></p></form>",
        escape(asked)
    );
    if asked.is_empty() {
        return session.page("Subjects", &body);
    }
    let tenant = session.caller.claims.tenant.clone();
    // The key in its one spelling (case folded where the tenant's keys are), as every store holds it.
    let asked = match state.folding.subject(&tenant, asked) {
        Ok(key) => key.into_owned(),
        Err(e) => {
            body.push_str(&format!(
                "<p class=\"error\" role=\"alert\">Subject key: {}.</p>",
                escape(&e.to_string())
            ));
            return session.page("Subjects", &body);
        }
    };
    let asked = asked.as_str();
    let found = super::subjects::view(
        State(state.clone()),
        session.caller.clone(),
        Path((tenant.clone(), asked.to_owned())),
    )
    .await;
    let csrf = escape(&session.csrf);
    let subject_field = format!(
        "<input type=\"hidden\" name=\"subject\" value=\"{}\">",
        escape(asked)
    );
    match found {
        Ok(axum::Json(v)) => {
            body.push_str(&format!(
                "<h2>{}</h2><dl><dt>State</dt><dd>{}</dd><dt>Epoch</dt><dd>{}</dd><dt>Reference</dt><dd><code>{}</code></dd><dt>Held</dt><dd>{}</dd></dl>",
                escape(asked),
                escape(v["state"].as_str().unwrap_or("")),
                v["epoch"],
                escape(v["subject_ref"].as_str().unwrap_or("")),
                if v["held"] == true { "yes: erasures wait" } else { "no" },
            ));
            body.push_str("<h3>Consent grants</h3><table><thead><tr><th scope=\"col\">Purpose</th><th scope=\"col\">Category</th><th scope=\"col\">Actions</th><th scope=\"col\">Status</th><th scope=\"col\"></th></tr></thead><tbody>");
            for g in v["grants"].as_array().into_iter().flatten() {
                let actions: Vec<&str> = g["actions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|a| a.as_str())
                    .collect();
                let revoke = if g["status"] == "active" {
                    format!(
                        "<form method=\"post\" action=\"/console/subjects/revoke\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">{subject_field}<input type=\"hidden\" name=\"grant\" value=\"{}\"><button type=\"submit\">Revoke</button></form>",
                        escape(g["id"].as_str().unwrap_or(""))
                    )
                } else {
                    String::new()
                };
                body.push_str(&format!(
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{revoke}</td></tr>",
                    escape(g["purpose"].as_str().unwrap_or("")),
                    escape(g["category"].as_str().unwrap_or("")),
                    escape(&actions.join(", ")),
                    escape(g["status"].as_str().unwrap_or("")),
                ));
            }
            body.push_str("</tbody></table><h3>Inventory (lineage, per store)</h3>");
            let inventory = v["inventory"].as_object().cloned().unwrap_or_default();
            if inventory.is_empty() {
                body.push_str("<p>Lineage records no item of this subject.</p>");
            } else {
                body.push_str("<table><thead><tr><th scope=\"col\">Store</th><th scope=\"col\">Items</th></tr></thead><tbody>");
                for (store, n) in &inventory {
                    body.push_str(&format!("<tr><td>{}</td><td>{n}</td></tr>", escape(store)));
                }
                body.push_str("</tbody></table>");
            }
            let keys = [asked.to_owned()];
            let derived = state
                .store
                .closure_of(&tenant, &keys, &state.erasure.targets)
                .await;
            let borrowed = state.store.borrowed(&tenant, asked).await;
            match (derived, borrowed) {
                (Ok(derived), Ok(borrowed)) => body.push_str(&derivatives::subject_section(
                    &session, &tenant, &derived, &borrowed,
                )),
                _ => body.push_str("<p class=\"error\">The state store cannot be read.</p>"),
            }
            body.push_str("<h3>Legal holds covering this subject</h3>");
            match state.store.holds(&tenant, Some(asked)).await {
                Ok(holds) => body.push_str(&policy::holds_section(&session, &holds, Some(asked))),
                Err(_) => body.push_str("<p class=\"error\">The state store cannot be read.</p>"),
            }
            body.push_str("<h3>Processors</h3>");
            let processors = v["processors"].as_array().cloned().unwrap_or_default();
            if processors.is_empty() {
                body.push_str("<p>No provider received this subject's data through Lethe.</p>");
            } else {
                for p in &processors {
                    body.push_str(&format!(
                        "<p>{}: first {}, last {}</p>",
                        escape(p["processor"].as_str().unwrap_or("")),
                        escape(p["first_at"].as_str().unwrap_or("")),
                        escape(p["last_at"].as_str().unwrap_or(""))
                    ));
                }
            }
            let total: u64 = inventory
                .values()
                .filter_map(serde_json::Value::as_u64)
                .sum();
            body.push_str(&format!(
                "<h3>File an erasure</h3><p>The erasure covers every store; lineage knows {total} items of this subject in {} stores (above). Before it is filed, every store counts what it holds of the subject.</p>{}",
                inventory.len(),
                filing::start_form(&session, Some(asked))
            ));
        }
        Err(e) if e.status == StatusCode::NOT_FOUND => {
            body.push_str(&format!(
                "<p>Lethe has no record of {}: no grant, no item.</p>",
                escape(asked)
            ));
        }
        Err(e) => return refused_page(&session, "Subject", &e),
    }
    body.push_str(&format!(
        "<h3>Grant consent</h3><form method=\"post\" action=\"/console/subjects/grant\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">{subject_field}<label for=\"purpose\">Purpose</label><input id=\"purpose\" name=\"purpose\" required><label for=\"category\">Category</label><input id=\"category\" name=\"category\" required><fieldset><legend>Actions</legend>{}</fieldset><label for=\"source\">Source (where the consent was given)</label><input id=\"source\" name=\"source\" required><p><button type=\"submit\">Grant</button></p></form>",
        action_boxes()
    ));
    session.page("Subjects", &body)
}

/// A checkbox for each consent action of the policy crate.
pub(crate) fn action_boxes() -> String {
    lethe_policy::Action::ALL
        .iter()
        .map(|a| {
            format!("<label><input type=\"checkbox\" name=\"actions\" value=\"{a}\"> {a}</label>")
        })
        .collect()
}

async fn grant(State(state): State<ControlState>, request: Request) -> Response {
    let (session, fields) = match posted(&state, request).await {
        Ok(posted) => posted,
        Err(refused) => return *refused,
    };
    let subject = field(&fields, "subject").unwrap_or("").to_owned();
    let actions: Result<std::collections::BTreeSet<lethe_policy::Action>, _> = fields
        .iter()
        .filter(|(k, _)| k == "actions")
        .map(|(_, v)| serde_json::from_value(serde_json::Value::String(v.clone())))
        .collect();
    let Ok(actions) = actions else {
        return refused_page(
            &session,
            "Not granted",
            &super::error::ApiError::invalid("actions: unknown action"),
        );
    };
    let req = GrantRequest {
        tenant: None,
        subject: subject.clone(),
        purpose: field(&fields, "purpose").unwrap_or("").to_owned(),
        category: field(&fields, "category").unwrap_or("").to_owned(),
        actions,
        expires_at: None,
        source: field(&fields, "source").unwrap_or("").to_owned(),
        policy_version: 1,
    };
    then_to(
        &session,
        grant_as(&state, &session.caller, req).await,
        &subject_uri(&subject),
        "Not granted",
    )
}

async fn revoke(State(state): State<ControlState>, request: Request) -> Response {
    let (session, fields) = match posted(&state, request).await {
        Ok(posted) => posted,
        Err(refused) => return *refused,
    };
    let subject = field(&fields, "subject").unwrap_or("").to_owned();
    then_to(
        &session,
        revoke_as(
            &state,
            &session.caller,
            field(&fields, "grant").unwrap_or(""),
        )
        .await,
        &subject_uri(&subject),
        "Not revoked",
    )
}

/// The signed certificate, as the JSON document to keep (and verify with `lethe certificate
/// verify`).
async fn certificate(
    State(state): State<ControlState>,
    Path(id): Path<String>,
    axum::extract::Query(query): axum::extract::Query<std::collections::HashMap<String, String>>,
    parts: Parts,
) -> Response {
    let session = match signed_in(&state, &parts).await {
        Ok(session) => session,
        Err(to) => return *to,
    };
    // As a page, or as the signed document to keep.
    let mut accept = HeaderMap::new();
    if query.contains_key("page") {
        accept.insert(header::ACCEPT, HeaderValue::from_static("text/html"));
    }
    let answer = super::erasures::certificate(
        State(state.clone()),
        session.caller.clone(),
        Path(id.clone()),
        accept,
    )
    .await;
    match answer {
        Ok(response) if query.contains_key("page") => response,
        Ok(mut response) => {
            let name = format!(
                "attachment; filename=\"lethe-certificate-{}.json\"",
                urlencoding(&id)
            );
            if let Ok(value) = HeaderValue::from_str(&name) {
                response
                    .headers_mut()
                    .insert(header::CONTENT_DISPOSITION, value);
            }
            response
        }
        Err(e) => refused_page(&session, "No certificate", &e),
    }
}

/// What each store did physically, and every copy that remains: where, what, until when (or
/// why no date can be given).
fn physical(v: &ErasureView) -> String {
    let mut out = String::new();
    for job in &v.targets {
        let Some(physical) = job.result.as_ref().and_then(|r| r.get("physical")) else {
            continue;
        };
        let lines = |key: &str| -> Vec<String> {
            physical[key]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|l| l.as_str().map(escape))
                .collect()
        };
        out.push_str(&format!(
            "<h3>{}: physical status</h3>",
            escape(&job.target)
        ));
        for line in lines("done").into_iter().chain(lines("verified")) {
            out.push_str(&format!("<p>{line}</p>"));
        }
        let remaining = physical["remaining"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if !remaining.is_empty() {
            out.push_str("<table><thead><tr><th scope=\"col\">Remaining copy</th><th scope=\"col\">Holds</th><th scope=\"col\">Why</th><th scope=\"col\">Until</th></tr></thead><tbody>");
            for c in &remaining {
                let until = match c["until"].as_str() {
                    Some(until) => escape(until),
                    None => format!("unknown: {}", escape(c["unknown"].as_str().unwrap_or(""))),
                };
                out.push_str(&format!(
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{until}</td></tr>",
                    escape(c["place"].as_str().unwrap_or("")),
                    escape(c["holds"].as_str().unwrap_or("")),
                    escape(c["why"].as_str().unwrap_or("")),
                ));
            }
            out.push_str("</tbody></table>");
        }
    }
    out
}

async fn extend(
    State(state): State<ControlState>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    let (session, fields) = match posted(&state, request).await {
        Ok(posted) => posted,
        Err(refused) => return *refused,
    };
    let req = ExtendRequest {
        months: field(&fields, "months")
            .and_then(|m| m.parse().ok())
            .unwrap_or(0),
        reason: field(&fields, "reason").unwrap_or("").to_owned(),
    };
    then_to(
        &session,
        extend_as(&state, &session.caller, &id, req).await,
        &request_uri(&id),
        "Not extended",
    )
}

async fn reject(
    State(state): State<ControlState>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    let (session, fields) = match posted(&state, request).await {
        Ok(posted) => posted,
        Err(refused) => return *refused,
    };
    let req = RejectRequest {
        reason: field(&fields, "reason").unwrap_or("").to_owned(),
    };
    then_to(
        &session,
        reject_as(&state, &session.caller, &id, req).await,
        &request_uri(&id),
        "Not refused",
    )
}

async fn review(state: State<ControlState>, id: Path<String>, request: Request) -> Response {
    by_person(state, id, request, super::erasures::review).await
}

async fn resume(state: State<ControlState>, id: Path<String>, request: Request) -> Response {
    by_person(state, id, request, super::erasures::resume).await
}

/// A step a person takes on a request (review, resume), through the API's own handler.
async fn by_person<F, Fut>(
    State(state): State<ControlState>,
    Path(id): Path<String>,
    request: Request,
    step: F,
) -> Response
where
    F: FnOnce(State<ControlState>, Caller, Path<String>) -> Fut,
    Fut: std::future::Future<Output = Result<axum::Json<ErasureView>, super::error::ApiError>>,
{
    let (session, _) = match posted(&state, request).await {
        Ok(posted) => posted,
        Err(refused) => return *refused,
    };
    let done = step(
        State(state.clone()),
        session.caller.clone(),
        Path(id.clone()),
    )
    .await;
    then_to(&session, done, &request_uri(&id), "Not done")
}

/// After a form: on to `to`, or the refusal, as a page titled `refused`.
fn then_to<T>(
    session: &Session,
    done: Result<T, super::error::ApiError>,
    to: &str,
    refused: &str,
) -> Response {
    match done {
        Ok(_) => Redirect::to(to).into_response(),
        Err(e) => refused_page(session, refused, &e),
    }
}

fn request_uri(id: &str) -> String {
    format!("/console/requests/{}", urlencoding(id))
}

/// The request's audit events: who did what to it and its purge jobs, when.
fn timeline(events: &[lethe_policy::audit::AuditRecord]) -> String {
    let mut out = String::from(
        "<h2>Timeline</h2><table><caption>Audit events of the request and its purge jobs</caption><thead><tr><th scope=\"col\">#</th><th scope=\"col\">At</th><th scope=\"col\">Actor</th><th scope=\"col\">Action</th><th scope=\"col\">Target</th><th scope=\"col\">Result</th></tr></thead><tbody>",
    );
    for e in events {
        out.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            e.seq,
            e.entry
                .at
                .format("<time>%Y-%m-%d</time> <time>%H:%M:%S</time>"),
            escape(&e.entry.actor),
            escape(&e.entry.action),
            escape(&e.entry.target),
            escape(&e.entry.result),
        ));
    }
    out.push_str("</tbody></table>");
    out
}
