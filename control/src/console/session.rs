//! Console sessions, kept server-side. Sign-in takes a compliance or admin token pasted into its
//! form (which carries a CSRF token of its own, bound to a cookie of the sign-in page) and keeps
//! a session in the state store: the cookie holds a random id (`HttpOnly`, `SameSite=Strict`,
//! `Path=/console`), the store its SHA-256 with the token's claims, never the token. A session
//! ends at sign-out, after `[control_plane] session_idle` unused, `session_max` after sign-in,
//! when its token expires or is revoked; the cookie is no bearer token for `/v1`. Every
//! state-changing form carries the session's CSRF token (random, kept with it). Failed sign-ins
//! are limited per client address. The seam for OIDC sign-in is [`signed_in`]: a session is a
//! verified [`Caller`], whatever made it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use askama::Template;
use axum::extract::connect_info::ConnectInfo;
use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use sha2::{Digest, Sha256};

use super::page::{Frame, Nav, message, render};
use crate::ControlState;
use crate::extract::Caller;
use crate::state::ConsoleSession;

const COOKIE: &str = "lethe_console";
/// The sign-in form's own CSRF token (double submit): a form posted from another site has not it.
const SIGN_IN_COOKIE: &str = "lethe_console_sign_in";
/// Failed sign-ins an address may make per [`SIGN_IN_WINDOW`] before it is turned away.
const SIGN_IN_FAILURES: u32 = 5;
const SIGN_IN_WINDOW: Duration = Duration::from_secs(60);
/// A session's last use is written at most this often.
const TOUCH_EVERY: Duration = Duration::from_secs(30);

/// A signed-in person: the verified caller, and the session's CSRF token. As an extractor, a
/// page's handler gets it or the person is sent to sign in (or told the store is unreachable).
pub struct Session {
    pub caller: Caller,
    pub csrf: String,
    id_hash: String,
}

impl Session {
    /// A page's frame: its title and this person's navigation.
    pub fn frame(&self, title: &str) -> Frame {
        Frame {
            title: title.to_owned(),
            nav: Some(Nav {
                actor: (self.caller.claims.name.as_ref())
                    .unwrap_or(&self.caller.claims.sub)
                    .clone(),
                csrf: self.csrf.clone(),
            }),
        }
    }
}

impl FromRequestParts<ControlState> for Session {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &ControlState,
    ) -> Result<Self, Self::Rejection> {
        signed_in(state, parts).await.map_err(|to| *to)
    }
}

/// The fields of a posted form, in order.
pub struct Fields(Vec<(String, String)>);

impl Fields {
    fn parse(body: &[u8]) -> Fields {
        Fields(form_urlencoded::parse(body).into_owned().collect())
    }

    /// The first value of `name`, if sent.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The first value of `name`, empty when not sent.
    pub fn text(&self, name: &str) -> &str {
        self.get(name).unwrap_or("")
    }

    /// Every value of `name` (ticked boxes).
    pub fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A state-changing form: the session and the fields, refused (nothing changed) without the
/// session's CSRF token.
pub struct Posted {
    pub session: Session,
    pub fields: Fields,
}

impl FromRequest<ControlState> for Posted {
    type Rejection = Response;

    async fn from_request(request: Request, state: &ControlState) -> Result<Self, Self::Rejection> {
        let (mut parts, body) = request.into_parts();
        let session = Session::from_request_parts(&mut parts, state).await?;
        let Ok(bytes) = axum::body::to_bytes(body, state.max_body_bytes).await else {
            return Err(message(
                StatusCode::BAD_REQUEST,
                Frame::bare("Bad request"),
                "The form could not be read.",
                false,
            ));
        };
        let fields = Fields::parse(&bytes);
        // The session's token is kept server-side: a form from another site cannot know it.
        if !same(fields.text("csrf"), &session.csrf) {
            return Err(message(
                StatusCode::FORBIDDEN,
                session.frame("Refused"),
                "This form was not sent from the console (its CSRF token is missing or wrong). Nothing was changed.",
                true,
            ));
        }
        Ok(Posted { session, fields })
    }
}

/// Failed sign-ins per client address (an IPv6 client by its /64, which one host is usually
/// given whole), forgotten a window after the last.
pub struct SignInLimit {
    failures: moka::sync::Cache<IpAddr, u32>,
}

impl SignInLimit {
    fn failures(&self, from: IpAddr) -> u32 {
        self.failures.get(&Self::key(from)).unwrap_or(0)
    }

    fn failed(&self, from: IpAddr) {
        self.failures
            .entry(Self::key(from))
            .and_upsert_with(|kept| kept.map_or(1, |n| n.into_value().saturating_add(1)));
    }

    fn key(from: IpAddr) -> IpAddr {
        match from {
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & !u128::from(u64::MAX))),
            },
            v4 => v4,
        }
    }
}

impl Default for SignInLimit {
    fn default() -> Self {
        SignInLimit {
            failures: moka::sync::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(SIGN_IN_WINDOW)
                .build(),
        }
    }
}

/// The answer to send instead of the page asked for (sign in first, a refused form).
pub type Elsewhere = Box<Response>;

/// Whether the browser reached Lethe over TLS (through a TLS-terminating proxy): cookies are
/// then sent back over TLS only.
pub(super) fn behind_tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"))
}

/// A cookie's value.
pub(super) fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(name)?.strip_prefix('='))
        .filter(|t| !t.is_empty())
}

/// 32 random bytes, hex.
pub(super) fn random_hex() -> Result<String, Elsewhere> {
    let mut bytes = [0u8; 32];
    aws_lc_rs::rand::fill(&mut bytes).map_err(|_| unavailable())?;
    Ok(hex::encode(bytes))
}

/// What the store keeps of a session id.
fn hash(id: &str) -> String {
    hex::encode(Sha256::digest(id.as_bytes()))
}

/// Whether two tokens are equal, in time that does not depend on where they differ.
pub(super) fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0, |d, (x, y)| d | (x ^ y)) == 0
}

pub(super) fn unavailable() -> Elsewhere {
    Box::new(message(
        StatusCode::SERVICE_UNAVAILABLE,
        Frame::bare("Unavailable"),
        "Lethe's state store cannot be reached. Nothing was changed; try again shortly.",
        true,
    ))
}

fn elsewhere(path: &'static str) -> Elsewhere {
    Box::new(Redirect::to(path).into_response())
}

/// The session of a request, or where to send the person instead. A session that is over is
/// ended here.
async fn signed_in(state: &ControlState, parts: &Parts) -> Result<Session, Elsewhere> {
    let id = cookie(&parts.headers, COOKIE).ok_or_else(|| elsewhere("/console/sign-in"))?;
    let id_hash = hash(id);
    let kept = state
        .store
        .session(&id_hash)
        .await
        .map_err(|_| unavailable())?
        .ok_or_else(|| elsewhere(Ended::Gone.at()))?;
    let now = crate::now();
    let idle = chrono::TimeDelta::from_std(state.sessions.idle).unwrap_or(chrono::TimeDelta::MAX);
    let max = chrono::TimeDelta::from_std(state.sessions.max).unwrap_or(chrono::TimeDelta::MAX);
    let claims = serde_json::from_str(&kept.claims).ok();
    let over = match claims {
        _ if now >= kept.expires_at
            && (kept.created_at.checked_add_signed(max))
                .is_some_and(|end| kept.expires_at < end) =>
        {
            Err(Ended::SignIn)
        }
        _ if now >= kept.expires_at => Err(Ended::Limit),
        _ if now - kept.last_seen_at > idle => Err(Ended::Idle),
        None => Err(Ended::Revoked),
        Some(claims) => match Caller::of_claims(state, claims, parts).await {
            Ok(caller) => Ok(caller),
            // Whether its token was revoked cannot be known now: the session is not over.
            Err(e) if e.status == StatusCode::SERVICE_UNAVAILABLE => return Err(unavailable()),
            Err(_) => Err(Ended::Revoked),
        },
    };
    let caller = match over {
        Ok(caller) => caller,
        Err(why) => {
            // Over: it cannot come back, and the next page says why.
            let _ = state.store.end_session(&id_hash).await;
            return Err(elsewhere(why.at()));
        }
    };
    if (now - kept.last_seen_at).to_std().unwrap_or_default() >= TOUCH_EVERY {
        state
            .store
            .touch_session(&id_hash, now)
            .await
            .map_err(|_| unavailable())?;
    }
    Ok(Session {
        caller,
        csrf: kept.csrf,
        id_hash,
    })
}

#[derive(Template)]
#[template(path = "console/sign_in.html")]
struct SignInPage<'a> {
    frame: Frame,
    message: Option<&'a str>,
    csrf: String,
    /// "Sign in with <provider>", offered first, when an OpenID provider is configured.
    provider: Option<&'a str>,
    /// Whether a pasted token is taken too.
    token: bool,
}

/// The sign-in page, with a fresh CSRF token in its form and in its cookie.
pub(super) fn sign_in_page(
    state: &ControlState,
    status: StatusCode,
    message: Option<&str>,
) -> Response {
    let csrf = match random_hex() {
        Ok(token) => token,
        Err(unavailable) => return *unavailable,
    };
    let cookie =
        format!("{SIGN_IN_COOKIE}={csrf}; Path=/console/sign-in; HttpOnly; SameSite=Strict");
    let mut response = render(
        status,
        &SignInPage {
            frame: Frame::bare("Sign in"),
            message,
            csrf,
            provider: state.oidc.as_ref().map(|p| p.config().name.as_str()),
            token: state.token_sign_in,
        },
    );
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
    response
}

pub async fn sign_in_form(State(state): State<ControlState>, request: Request) -> Response {
    let ended = request
        .uri()
        .query()
        .and_then(|q| q.strip_prefix("ended="))
        .and_then(Ended::of);
    let message = ended.map(|why| why.message(&state));
    sign_in_page(&state, StatusCode::OK, message.as_deref())
}

/// Why a session ended, told on the sign-in page it leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// Signed out here, elsewhere, or by the sign-in provider.
    Gone,
    Idle,
    /// `session_max` after sign-in.
    Limit,
    /// Its token, or the provider's ID token, expired.
    SignIn,
    /// Its token was revoked, or its role no longer opens the console.
    Revoked,
}

impl Ended {
    const ALL: [(Ended, &'static str); 5] = [
        (Ended::Gone, "/console/sign-in?ended=gone"),
        (Ended::Idle, "/console/sign-in?ended=idle"),
        (Ended::Limit, "/console/sign-in?ended=limit"),
        (Ended::SignIn, "/console/sign-in?ended=sign-in"),
        (Ended::Revoked, "/console/sign-in?ended=revoked"),
    ];

    fn at(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(e, _)| *e == self)
            .map_or("/console/sign-in", |(_, at)| at)
    }

    fn of(reason: &str) -> Option<Ended> {
        Self::ALL
            .iter()
            .find(|(_, at)| at.ends_with(&format!("={reason}")))
            .map(|(e, _)| *e)
    }

    fn message(self, state: &ControlState) -> String {
        let minutes = |d: std::time::Duration| d.as_secs() / 60;
        match self {
            Ended::Gone => "Your session ended: you signed out, here or at your sign-in provider. Sign in again.".to_owned(),
            Ended::Idle => format!("Your session ended after {} minutes unused. Sign in again.", minutes(state.sessions.idle)),
            Ended::Limit => format!("Your session reached its limit of {} minutes after sign-in. Sign in again.", minutes(state.sessions.max)),
            Ended::SignIn => "Your session ended when your sign-in expired (your token, or your sign-in provider's ID token). Sign in again.".to_owned(),
            Ended::Revoked => "Your session ended: its token was revoked, or your role no longer opens the console.".to_owned(),
        }
    }
}

/// The client's address, as the listener saw it (a proxy's own, behind one).
fn address(parts: &Parts) -> IpAddr {
    parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip())
}

pub async fn sign_in(State(state): State<ControlState>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    if !state.token_sign_in {
        return sign_in_page(
            &state,
            StatusCode::FORBIDDEN,
            Some(
                "Signing in with a token is turned off here: sign in with your organisation's account.",
            ),
        );
    }
    let from = address(&parts);
    if state.sign_ins.failures(from) >= SIGN_IN_FAILURES {
        return sign_in_page(
            &state,
            StatusCode::TOO_MANY_REQUESTS,
            Some("Too many failed sign-ins from this address; wait a minute."),
        );
    }
    let Ok(bytes) = axum::body::to_bytes(body, state.max_body_bytes).await else {
        return sign_in_page(
            &state,
            StatusCode::BAD_REQUEST,
            Some("The form could not be read."),
        );
    };
    let fields = Fields::parse(&bytes);
    let sent = fields.text("csrf");
    if sent.is_empty() || !cookie(&parts.headers, SIGN_IN_COOKIE).is_some_and(|c| same(c, sent)) {
        return sign_in_page(
            &state,
            StatusCode::FORBIDDEN,
            Some("This form was not sent from the sign-in page. Sign in from it."),
        );
    }
    let token = fields.text("token").trim();
    let caller = match Caller::of_token(&state, token, &parts).await {
        Ok(caller) => caller,
        Err(e) => {
            if e.status != StatusCode::SERVICE_UNAVAILABLE {
                state.sign_ins.failed(from);
            }
            return sign_in_page(
                &state,
                e.status,
                Some(&format!("Not signed in: {}", e.message)),
            );
        }
    };
    begin(&state, &parts.headers, &caller, "/console/requests").await
}

/// A session for `caller`, who has just signed in: the cookie that names it, and the way to
/// the requests. It ends at `session_max` at the latest, or when the caller's token (or ID
/// token) expires, whichever comes first.
pub(super) async fn begin(
    state: &ControlState,
    headers: &HeaderMap,
    caller: &Caller,
    to: &str,
) -> Response {
    // The session this browser held before, if any, ends: one browser, one person signed in.
    if let Some(old) = cookie(headers, COOKIE) {
        let _ = state.store.end_session(&hash(old)).await;
    }
    let now = crate::now();
    let max = chrono::TimeDelta::from_std(state.sessions.max).unwrap_or(chrono::TimeDelta::MAX);
    let token_ends = i64::try_from(caller.claims.exp)
        .ok()
        .and_then(|exp| chrono::DateTime::from_timestamp(exp, 0))
        .unwrap_or(now);
    let expires_at = (now + max).min(token_ends);
    let (id, csrf) = match (random_hex(), random_hex()) {
        (Ok(id), Ok(csrf)) => (id, csrf),
        (Err(e), _) | (_, Err(e)) => return *e,
    };
    let Ok(claims) = serde_json::to_string(&caller.claims) else {
        return *unavailable();
    };
    let session = ConsoleSession {
        id_hash: hash(&id),
        actor: caller.claims.sub.clone(),
        claims,
        csrf,
        created_at: now,
        last_seen_at: now,
        expires_at,
    };
    if state.store.create_session(&session).await.is_err() {
        return *unavailable();
    }
    let secure = behind_tls(headers);
    let seconds = (expires_at - now).num_seconds().max(0);
    let cookie = format!(
        "{COOKIE}={id}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={seconds}{}",
        if secure { "; Secure" } else { "" }
    );
    let mut response = Redirect::to(to).into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

pub async fn sign_out(
    State(state): State<ControlState>,
    Posted { session, .. }: Posted,
) -> Response {
    if state.store.end_session(&session.id_hash).await.is_err() {
        return *unavailable();
    }
    let mut response = match super::oidc::provider_sign_out(&state, &session.caller).await {
        Some(page) => page,
        None => Redirect::to("/console/sign-in").into_response(),
    };
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "lethe_console=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0",
        ),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "ab"));
        assert!(!same("", "a"));
    }

    #[test]
    fn failures_count_per_address_and_per_ipv6_64() {
        let limit = SignInLimit::default();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        limit.failed(ip("2001:db8:1:2::1"));
        limit.failed(ip("2001:db8:1:2:ffff::9"));
        limit.failed(ip("192.0.2.7"));
        limit.failed(ip("::ffff:192.0.2.7"));
        assert_eq!(limit.failures(ip("2001:db8:1:2::77")), 2);
        assert_eq!(limit.failures(ip("2001:db8:1:3::1")), 0);
        assert_eq!(limit.failures(ip("192.0.2.7")), 2);
        assert_eq!(limit.failures(ip("192.0.2.8")), 0);
    }
}
