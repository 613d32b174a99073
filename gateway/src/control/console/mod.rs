//! The compliance console (`/console`): server-rendered pages for the DPO, on the control
//! listener, from the binary alone.
//!
//! Sign-in exchanges a compliance or admin token, pasted into the form, for a session cookie
//! holding it (`HttpOnly`, `SameSite=Strict`, `Path=/console`, expiring with the token); every
//! page verifies it again, so a session ends with its token. Every state-changing form carries a
//! CSRF token (an HMAC of the session under the audit key) and is refused without it. The seam
//! for OIDC sign-in is [`signed_in`]: a session is a verified [`Caller`], whatever made it.

mod html;

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use chrono::{DateTime, Months, Utc};
use hmac::{Hmac, KeyInit, Mac};
use lethe_policy::ErasureState;
use sha2::Sha256;

use super::ControlState;
use super::erasures::{ErasureView, approve_as, view, visible};
use super::extract::Caller;
use html::{deadline_badge, escape, nav, page};

const COOKIE: &str = "lethe_console";
/// The most requests the list shows.
const LIST_LIMIT: u32 = 500;

pub fn routes() -> Router<ControlState> {
    Router::new()
        .route(
            "/console",
            get(|| async { Redirect::to("/console/requests") }),
        )
        .route("/console/sign-in", get(sign_in_form).post(sign_in))
        .route("/console/sign-out", post(sign_out))
        .route("/console/requests", get(requests))
        .route("/console/requests/{id}", get(request))
        .route("/console/requests/{id}/approve", post(approve))
}

/// The statutory deadline: one month from receipt (GDPR art. 12(3)).
pub fn deadline(requested_at: DateTime<Utc>) -> DateTime<Utc> {
    requested_at
        .checked_add_months(Months::new(1))
        .unwrap_or(requested_at)
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

/// The session's token, from its cookie.
fn session_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
        .filter(|t| !t.is_empty())
}

/// The MAC a session's CSRF token is: bound to the session, unguessable without the audit key.
fn csrf_mac(state: &ControlState, session: &str) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&state.audit_key)
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    mac.update(b"lethe console csrf\0");
    mac.update(session.as_bytes());
    mac
}

fn csrf_of(state: &ControlState, session: &str) -> String {
    hex::encode(csrf_mac(state, session).finalize().into_bytes())
}

/// A signed-in person: the verified caller, and the session's CSRF token.
struct Session {
    caller: Caller,
    csrf: String,
}

impl Session {
    fn nav(&self) -> String {
        nav(&self.caller.claims.sub, &self.csrf)
    }

    fn page(&self, title: &str, body: &str) -> Response {
        html(StatusCode::OK, page(title, Some(&self.nav()), body))
    }
}

/// The answer to send instead of the page asked for (sign in first, a refused form).
type Elsewhere = Box<Response>;

/// The session of a request, or where to send the person instead.
fn signed_in(state: &ControlState, parts: &Parts) -> Result<Session, Elsewhere> {
    let to = |path: &'static str| Box::new(Redirect::to(path).into_response());
    let token = session_token(&parts.headers).ok_or_else(|| to("/console/sign-in"))?;
    let caller =
        Caller::of_token(state, token, parts).map_err(|_| to("/console/sign-in?expired"))?;
    Ok(Session {
        caller,
        csrf: csrf_of(state, token),
    })
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

/// A state-changing form's session, refused without the session's CSRF token.
async fn posted(
    state: &ControlState,
    request: Request,
) -> Result<(Session, Vec<(String, String)>), Elsewhere> {
    let (parts, body) = request.into_parts();
    let session = signed_in(state, &parts)?;
    let unreadable = || {
        Box::new(html(
            StatusCode::BAD_REQUEST,
            page("Bad request", None, "<p>The form could not be read.</p>"),
        ))
    };
    let bytes = axum::body::to_bytes(body, state.max_body_bytes)
        .await
        .map_err(|_| unreadable())?;
    let fields = form(&bytes);
    // The session's token is in the cookie, which a form from another site cannot read.
    let given = hex::decode(field(&fields, "csrf").unwrap_or("")).unwrap_or_default();
    let token = session_token(&parts.headers).unwrap_or("");
    if csrf_mac(state, token).verify_slice(&given).is_err() {
        return Err(Box::new(html(
            StatusCode::FORBIDDEN,
            page(
                "Refused",
                Some(&session.nav()),
                "<p class=\"error\" role=\"alert\">This form was not sent from the console (its CSRF token is missing or wrong). Nothing was changed.</p>",
            ),
        )));
    }
    Ok((session, fields))
}

fn sign_in_page(status: StatusCode, message: Option<&str>) -> Response {
    let message = message
        .map(|m| format!("<p class=\"error\" role=\"alert\">{}</p>", escape(m)))
        .unwrap_or_default();
    html(
        status,
        page(
            "Sign in",
            None,
            &format!(
                "{message}<form method=\"post\" action=\"/console/sign-in\"><label for=\"token\">Compliance or admin token</label><input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"off\" required><p><button type=\"submit\">Sign in</button></p></form>"
            ),
        ),
    )
}

async fn sign_in_form(request: Request) -> Response {
    let expired = request.uri().query() == Some("expired");
    sign_in_page(
        StatusCode::OK,
        expired.then_some("Your session ended with its token. Sign in again."),
    )
}

async fn sign_in(State(state): State<ControlState>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, state.max_body_bytes).await else {
        return sign_in_page(StatusCode::BAD_REQUEST, Some("The form could not be read."));
    };
    let fields = form(&bytes);
    let token = field(&fields, "token").unwrap_or("").trim();
    let caller = match Caller::of_token(&state, token, &parts) {
        Ok(caller) => caller,
        Err(e) => {
            return sign_in_page(e.status, Some(&format!("Not signed in: {}", e.message)));
        }
    };
    let seconds = caller
        .claims
        .exp
        .saturating_sub(jsonwebtoken::get_current_timestamp());
    let cookie =
        format!("{COOKIE}={token}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={seconds}");
    let mut response = Redirect::to("/console/requests").into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

async fn sign_out(State(state): State<ControlState>, request: Request) -> Response {
    if let Err(refused) = posted(&state, request).await {
        return *refused;
    }
    let mut response = Redirect::to("/console/sign-in").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "lethe_console=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0",
        ),
    );
    response
}

/// Whether a request's deadline no longer runs.
fn closed(state: ErasureState) -> bool {
    matches!(state, ErasureState::Completed | ErasureState::Rejected)
}

/// Every erasure request of the caller's tenant, with its deadline.
async fn requests(State(state): State<ControlState>, parts: Parts) -> Response {
    let session = match signed_in(&state, &parts) {
        Ok(session) => session,
        Err(to) => return *to,
    };
    let tenant = session.caller.claims.tenant.clone();
    let records = match state.store.erasures(&tenant, LIST_LIMIT).await {
        Ok(records) => records,
        Err(_) => {
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
    let now = crate::now();
    let mut rows = String::new();
    for r in &records {
        let due = deadline(r.requested_at);
        rows.push_str(&format!(
            "<tr><td><a href=\"/console/requests/{id}\">{id}</a></td><td><code>{subject}</code></td><td>{ticket}</td><td>{state}</td><td>{requested}</td><td>{due}</td><td>{badge}</td></tr>",
            id = escape(&r.id),
            subject = escape(&short_ref(&session.caller, &r.tenant, &r.subject)),
            ticket = escape(&r.ticket),
            state = escape(&r.state.to_string()),
            requested = r.requested_at.format("%Y-%m-%d"),
            due = due.format("%Y-%m-%d"),
            badge = deadline_badge(due, now, closed(r.state)),
        ));
    }
    let body = if records.is_empty() {
        "<p>No erasure requests yet.</p>".to_owned()
    } else {
        format!(
            "<table><caption>Erasure requests of {tenant} (newest first)</caption><thead><tr><th scope=\"col\">Request</th><th scope=\"col\">Subject reference</th><th scope=\"col\">Ticket</th><th scope=\"col\">State</th><th scope=\"col\">Received</th><th scope=\"col\">Deadline</th><th scope=\"col\">Time</th></tr></thead><tbody>{rows}</tbody></table>",
            tenant = escape(&tenant)
        )
    };
    session.page("Erasure requests", &body)
}

/// A subject's reference, as the audit log names it, shortened for a table.
fn short_ref(caller: &Caller, tenant: &str, subject: &str) -> String {
    let reference = caller.subject_ref(tenant, subject);
    reference.chars().take(12).collect()
}

/// One request: where it stands, its approvals, each store's progress, what may be done.
async fn request(
    State(state): State<ControlState>,
    Path(id): Path<String>,
    parts: Parts,
) -> Response {
    let session = match signed_in(&state, &parts) {
        Ok(session) => session,
        Err(to) => return *to,
    };
    let found = match visible(&state, &session.caller, &id).await {
        Ok(record) => view(&state, record).await,
        Err(e) => Err(e),
    };
    match found {
        Ok(v) => session.page(
            &format!("Erasure request {}", v.record.id),
            &request_body(&session, &v),
        ),
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

fn request_body(session: &Session, v: &ErasureView) -> String {
    let r = &v.record;
    let now = crate::now();
    let due = deadline(r.requested_at);
    let mut out = format!(
        "<dl><dt>State</dt><dd>{state}</dd><dt>Subject reference</dt><dd><code>{subject}</code></dd><dt>Ticket</dt><dd>{ticket}</dd><dt>Reason</dt><dd>{reason}</dd><dt>Received</dt><dd>{requested}</dd><dt>Deadline</dt><dd>{due} {badge}</dd><dt>Approvals</dt><dd>{approvals} of {required}: {who}</dd><dt>Online latency</dt><dd>{online}</dd></dl>",
        state = escape(&r.state.to_string()),
        subject = escape(&session.caller.subject_ref(&r.tenant, &r.subject)),
        ticket = escape(&r.ticket),
        reason = escape(&r.reason),
        requested = r.requested_at.format("%Y-%m-%d %H:%M UTC"),
        due = due.format("%Y-%m-%d"),
        badge = deadline_badge(due, now, closed(r.state)),
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
    );
    if r.state == ErasureState::Requested {
        if r.approvals.contains(&session.caller.claims.sub) {
            out.push_str("<p>You approved this request; another person must approve it too.</p>");
        } else {
            out.push_str(&format!(
                "<form method=\"post\" action=\"/console/requests/{}/approve\"><input type=\"hidden\" name=\"csrf\" value=\"{}\"><button type=\"submit\">Approve the erasure</button></form>",
                escape(&r.id),
                escape(&session.csrf)
            ));
        }
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
    if r.state == ErasureState::Completed {
        out.push_str(&format!(
            "<p><a href=\"/v1/erasures/{}/certificate\">The signed certificate</a> (verify it with <code>lethe certificate verify FILE</code>).</p>",
            escape(&r.id)
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
    let outcome = approve_as(&state, &session.caller, &id).await;
    match outcome {
        Ok(_) => Redirect::to(&format!("/console/requests/{}", urlencoding(&id))).into_response(),
        Err(e) => html(
            e.status,
            page(
                "Not approved",
                Some(&session.nav()),
                &format!(
                    "<p class=\"error\" role=\"alert\">{}</p>",
                    escape(&e.message)
                ),
            ),
        ),
    }
}

/// An id as a path segment.
fn urlencoding(id: &str) -> String {
    form_urlencoded::byte_serialize(id.as_bytes()).collect()
}
