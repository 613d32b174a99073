//! Signing in through the organisation's OpenID provider (`[control_plane.oidc]`): the
//! authorization code flow with PKCE, `state` and `nonce`. What the callback must match travels
//! in a cookie of the browser that started the sign-in (`HttpOnly`, `SameSite=Lax` so that the
//! provider's redirect brings it, ten minutes), sealed with an HMAC of the audit key, so any
//! replica can finish a sign-in another started. A person's roles come from their groups; one
//! with none is refused, and the refusal is audited.

use std::time::Duration;

use askama::Template;
use aws_lc_rs::hmac;
use axum::extract::{Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use lethe_policy::audit::AuditEntry;
use serde::{Deserialize, Serialize};

use super::page::{Frame, message, render};
use super::session::{begin, behind_tls, cookie, random_hex, same, sign_in_page};
use crate::ControlState;
use crate::auth::oidc::{OidcError, Person, Provider, roles};
use crate::auth::{Claims, Role};
use crate::extract::Caller;

const COOKIE: &str = "lethe_oidc";
/// How long a sign-in may take at the provider.
const PENDING: Duration = Duration::from_secs(600);
/// What the cookie's seal is keyed with, besides the audit key: no other use of the key can
/// make a seal that passes here.
const SEAL_CONTEXT: &[u8] = b"lethe console oidc sign-in\0";

/// What the callback must match, kept by the browser that started the sign-in.
#[derive(Debug, Serialize, Deserialize)]
struct Pending {
    state: String,
    nonce: String,
    verifier: String,
    /// The tenant asked for, when the person's groups give roles in several.
    tenant: Option<String>,
    /// The console page to return to (a step that waits for a second factor).
    back: Option<String>,
    /// A fresh sign-in was asked for: the provider must have authenticated the person after it
    /// began.
    #[serde(default)]
    step_up: bool,
    /// Seconds since the epoch after which it is stale.
    until: i64,
}

fn seal_key(state: &ControlState) -> hmac::Key {
    hmac::Key::new(hmac::HMAC_SHA256, &state.audit_key)
}

fn seal(state: &ControlState, pending: &Pending) -> Option<String> {
    let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(pending).ok()?);
    let tag = hmac::sign(&seal_key(state), &[SEAL_CONTEXT, body.as_bytes()].concat());
    Some(format!("{body}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref())))
}

fn unseal(state: &ControlState, sealed: &str) -> Option<Pending> {
    let (body, tag) = sealed.split_once('.')?;
    let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
    hmac::verify(
        &seal_key(state),
        &[SEAL_CONTEXT, body.as_bytes()].concat(),
        &tag,
    )
    .ok()?;
    let pending: Pending = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(body).ok()?).ok()?;
    (crate::now().timestamp() < pending.until).then_some(pending)
}

fn pending_cookie(value: &str, max_age: u64, headers: &HeaderMap) -> Option<HeaderValue> {
    let secure = if behind_tls(headers) { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{COOKIE}={value}; Path=/console/oidc; HttpOnly; SameSite=Lax; Max-Age={max_age}{secure}"
    ))
    .ok()
}

/// A page of the sign-in that went wrong, with the pending sign-in forgotten.
fn refused(status: StatusCode, text: &str, headers: &HeaderMap) -> Response {
    forgetting_pending(
        message(status, Frame::bare("Not signed in"), text, true),
        headers,
    )
}

fn provider_failed(e: &OidcError, headers: &HeaderMap) -> Response {
    let status = match e {
        OidcError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        OidcError::Refused(_) | OidcError::Invalid(_) => StatusCode::FORBIDDEN,
    };
    refused(
        status,
        &format!("Not signed in: {e}. Start again from the sign-in page."),
        headers,
    )
}

#[derive(Deserialize)]
pub struct LoginQuery {
    tenant: Option<String>,
    /// A fresh sign-in with a second factor, for a step that needs one.
    #[serde(default)]
    step_up: bool,
    back: Option<String>,
}

/// A console page to return to: a path of the console, never another site (`//host`, `/\\host`).
fn console_page(back: Option<String>) -> Option<String> {
    let visible = |b: &str| b.bytes().all(|c| c.is_ascii_graphic() && c != b'\\');
    back.filter(|b| b.starts_with("/console/") && b.len() <= 512 && visible(b))
}

#[derive(Template)]
#[template(path = "console/step_up.html")]
struct StepUpPage {
    frame: Frame,
    step_up: String,
}

/// The page of a step refused for want of a second factor: a fresh sign-in with one, back to
/// `to`, where the person takes the step again.
pub(super) fn step_up(session: &super::session::Session, to: &str) -> Response {
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("step_up", "true")
        .append_pair("back", to)
        .finish();
    let page = StepUpPage {
        frame: session.frame("Second factor needed"),
        step_up: format!("/console/oidc/login?{query}"),
    };
    render(StatusCode::FORBIDDEN, &page)
}

/// `GET /console/oidc/login`: off to the provider, with this browser's pending sign-in.
pub async fn login(
    State(state): State<ControlState>,
    Query(query): Query<LoginQuery>,
    headers: HeaderMap,
) -> Response {
    let Some(provider) = state.oidc.clone() else {
        return sign_in_page(
            &state,
            StatusCode::NOT_FOUND,
            Some("No sign-in provider is configured here."),
        );
    };
    let metadata = match provider.metadata().await {
        Ok(metadata) => metadata,
        Err(e) => return provider_failed(&e, &headers),
    };
    let (Ok(state_value), Ok(nonce), Ok(verifier)) = (random_hex(), random_hex(), random_hex())
    else {
        return refused(
            StatusCode::SERVICE_UNAVAILABLE,
            "No randomness to sign in with.",
            &headers,
        );
    };
    let pending = Pending {
        state: state_value,
        nonce,
        verifier,
        // Only a tenant some group gives a role in: anything else could never sign anyone in.
        tenant: query
            .tenant
            .filter(|t| provider.config().roles.iter().any(|r| r.tenant == *t)),
        back: console_page(query.back),
        step_up: query.step_up,
        until: crate::now().timestamp() + PENDING.as_secs() as i64,
    };
    let to = provider.authorization_url(
        metadata,
        &pending.state,
        &pending.nonce,
        &pending.verifier,
        query.step_up,
    );
    let Some(value) =
        seal(&state, &pending).and_then(|s| pending_cookie(&s, PENDING.as_secs(), &headers))
    else {
        return refused(
            StatusCode::INTERNAL_SERVER_ERROR,
            "The sign-in could not be started.",
            &headers,
        );
    };
    let mut response = Redirect::to(&to).into_response();
    response.headers_mut().append(header::SET_COOKIE, value);
    response
}

#[derive(Template)]
#[template(path = "console/signed_out.html")]
struct SignedOutPage<'a> {
    frame: Frame,
    provider: &'a str,
    provider_sign_out: String,
}

/// For a person who signed in through the provider, and a provider that offers RP-initiated
/// logout: the page that says they are signed out of Lethe, with a link to sign out there too (a
/// link: the console's CSP holds a form's redirect to another site).
pub(super) async fn provider_sign_out(state: &ControlState, caller: &Caller) -> Option<Response> {
    let provider = state.oidc.as_ref()?;
    let config = provider.config();
    caller
        .claims
        .sub
        .strip_prefix(&format!("{}#", config.issuer))?;
    let end = provider
        .metadata()
        .await
        .ok()?
        .end_session_endpoint
        .clone()?;
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("client_id", &config.client_id)
        .finish();
    let joiner = if end.contains('?') { '&' } else { '?' };
    let page = SignedOutPage {
        frame: Frame::bare("Signed out"),
        provider: &config.name,
        provider_sign_out: format!("{end}{joiner}{query}"),
    };
    Some(render(StatusCode::OK, &page))
}

#[derive(Deserialize)]
pub struct Callback {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
}

/// Whether the provider authenticated the person (`auth_time`) after `began`, within `leeway`:
/// a provider that ignored `max_age=0` would pass an old sign-in off as the fresh one asked for,
/// and one that does not say when is not taken at its word.
fn signed_in_since(authenticated: Option<u64>, began: i64, leeway: u64) -> bool {
    let leeway = i64::try_from(leeway).unwrap_or(0);
    let authenticated = authenticated.and_then(|t| i64::try_from(t).ok());
    authenticated.is_some_and(|t| t.saturating_add(leeway) >= began)
}

#[derive(Template)]
#[template(path = "console/tenants.html")]
struct TenantsPage {
    frame: Frame,
    who: String,
    tenants: Vec<(String, String)>,
}

/// `GET /console/oidc/callback`: the provider's answer, checked against this browser's pending
/// sign-in; the code exchanged, the ID token verified, the person's role found, a session begun.
pub async fn callback(
    State(state): State<ControlState>,
    Query(answer): Query<Callback>,
    parts: Parts,
) -> Response {
    let headers = &parts.headers;
    let Some(provider) = state.oidc.clone() else {
        return sign_in_page(
            &state,
            StatusCode::NOT_FOUND,
            Some("No sign-in provider is configured here."),
        );
    };
    let (pending, code) = match matched(&state, answer, headers) {
        Ok(matched) => matched,
        Err(refusal) => return *refusal,
    };
    let person = match provider
        .sign_in(&code, &pending.verifier, &pending.nonce)
        .await
    {
        Ok(person) => person,
        Err(e) => return provider_failed(&e, headers),
    };
    let began = pending.until - PENDING.as_secs() as i64;
    if pending.step_up && !signed_in_since(person.authenticated, began, provider.leeway()) {
        return refused(
            StatusCode::FORBIDDEN,
            "Your sign-in provider did not sign you in again, and the step needs a fresh sign-in with a second factor. Start again from the page you were on.",
            headers,
        );
    }
    let (tenant, role) = match role_of(&state, &provider, &person, &pending, &parts).await {
        Ok(granted) => granted,
        Err(elsewhere) => return *elsewhere,
    };
    let claims = Claims {
        sub: person.actor(),
        tenant: tenant.clone(),
        role,
        subject: None,
        exp: person.expires,
        jti: None,
        name: person.display.clone(),
        second_factor: person.second_factor,
    };
    let caller = match Caller::of_claims(&state, claims, &parts).await {
        Ok(caller) => caller,
        Err(e) => return refused(e.status, &format!("Not signed in: {}", e.message), headers),
    };
    if audit_sign_in(&state, &person, Some(&tenant), &parts, "ok")
        .await
        .is_err()
    {
        return *super::session::unavailable();
    }
    let back = pending.back.as_deref().unwrap_or("/console/requests");
    forgetting_pending(begin(&state, headers, &caller, back).await, headers)
}

/// This browser's pending sign-in and the provider's code, when the provider's answer matches
/// it (its `state`), else the refusal.
fn matched(
    state: &ControlState,
    answer: Callback,
    headers: &HeaderMap,
) -> Result<(Pending, String), Box<Response>> {
    let refuse = |status, text: &str| Box::new(refused(status, text, headers));
    let pending = cookie(headers, COOKIE).and_then(|sealed| unseal(state, sealed));
    let Some(pending) = pending else {
        return Err(refuse(
            StatusCode::FORBIDDEN,
            "This sign-in was not started in this browser, or took longer than ten minutes. Start again from the sign-in page.",
        ));
    };
    if let Some(error) = answer.error {
        return Err(refuse(
            StatusCode::FORBIDDEN,
            &format!("The sign-in provider did not sign you in ({error})."),
        ));
    }
    let (Some(code), Some(sent_state)) = (answer.code, answer.state) else {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "The provider's answer has no code or state.",
        ));
    };
    if !same(&sent_state, &pending.state) {
        return Err(refuse(
            StatusCode::FORBIDDEN,
            "This answer belongs to another sign-in (its state is not this browser's). Start again from the sign-in page.",
        ));
    }
    Ok((pending, code))
}

/// The tenant and role the person signs in to, from their groups (and the tenant the sign-in
/// asked for); else the refusal (audited) or, for a person of several tenants, the choice.
async fn role_of(
    state: &ControlState,
    provider: &Provider,
    person: &Person,
    pending: &Pending,
    parts: &Parts,
) -> Result<(String, Role), Box<Response>> {
    let headers = &parts.headers;
    let mut granted = roles(&provider.config().roles, &person.groups);
    if let Some(tenant) = &pending.tenant {
        granted.retain(|(t, _)| t == tenant);
    }
    let who = person
        .display
        .clone()
        .unwrap_or_else(|| person.subject.clone());
    match &granted[..] {
        [] => {
            let why = match &pending.tenant {
                Some(tenant) => format!("no role in the tenant {tenant}"),
                None => "no role in Lethe".to_owned(),
            };
            if audit_sign_in(state, person, pending.tenant.as_deref(), parts, "refused")
                .await
                .is_err()
            {
                return Err(super::session::unavailable());
            }
            Err(Box::new(refused(
                StatusCode::FORBIDDEN,
                &format!(
                    "{who}: your account is in no group that gives {why}. Ask whoever manages Lethe's access to add you to one."
                ),
                headers,
            )))
        }
        [(tenant, role)] => Ok((tenant.clone(), *role)),
        several => {
            let tenants = several
                .iter()
                .map(|(t, _)| {
                    let query: String = form_urlencoded::Serializer::new(String::new())
                        .append_pair("tenant", t)
                        .finish();
                    (t.clone(), format!("/console/oidc/login?{query}"))
                })
                .collect();
            let page = TenantsPage {
                frame: Frame::bare("Choose a tenant"),
                who,
                tenants,
            };
            Err(Box::new(forgetting_pending(
                render(StatusCode::OK, &page),
                headers,
            )))
        }
    }
}

/// `response`, with this browser's pending sign-in forgotten.
fn forgetting_pending(mut response: Response, headers: &HeaderMap) -> Response {
    if let Some(forget) = pending_cookie("", 0, headers) {
        response.headers_mut().append(header::SET_COOKIE, forget);
    }
    response
}

/// `POST /console/oidc/backchannel-logout` (OpenID Connect Back-Channel Logout 1.0): the
/// provider signed a person out; every console session of theirs ends, on every replica (they
/// are kept in the state store), and the sign-out is audited. The provider is told 200, or 400
/// for a logout token that does not verify.
pub async fn backchannel_logout(
    State(state): State<ControlState>,
    parts: Parts,
    body: axum::body::Bytes,
) -> Response {
    let answer = |status: StatusCode, body: &'static str| {
        (
            status,
            [
                (header::CACHE_CONTROL, "no-store"),
                (header::CONTENT_TYPE, "application/json"),
            ],
            body,
        )
            .into_response()
    };
    let Some(provider) = state.oidc.clone() else {
        return answer(StatusCode::NOT_FOUND, r#"{"error":"invalid_request"}"#);
    };
    let token = form_urlencoded::parse(&body)
        .find(|(k, _)| k == "logout_token")
        .map(|(_, v)| v);
    let Some(token) = token else {
        return answer(StatusCode::BAD_REQUEST, r#"{"error":"invalid_request"}"#);
    };
    let out = match provider.signed_out(&token).await {
        Ok(out) => out,
        Err(OidcError::Unavailable(_)) => {
            return answer(
                StatusCode::SERVICE_UNAVAILABLE,
                r#"{"error":"temporarily_unavailable"}"#,
            );
        }
        Err(_) => return answer(StatusCode::BAD_REQUEST, r#"{"error":"invalid_request"}"#),
    };
    // Sessions begun before it (its iat is in whole seconds, and the provider's clock may run
    // behind within the leeway) end; one begun later is not its to end.
    let time = |s: u64| {
        i64::try_from(s)
            .ok()
            .and_then(|s| chrono::DateTime::from_timestamp(s, 0))
    };
    let before = time(out.issued.saturating_add(provider.leeway() + 1));
    let keep_until = time(provider.logout_passes_until(out.issued));
    let (Some(before), Some(keep_until)) = (before, keep_until) else {
        return answer(StatusCode::BAD_REQUEST, r#"{"error":"invalid_request"}"#);
    };
    let entry = audit_entry(&out.actor, None, &parts, "console.sign_out", "provider");
    let taken = (state.store)
        .signed_out_by_provider(&out.actor, before, &out.id, keep_until, entry)
        .await;
    // A token taken already, here or on another replica, ended what it could then.
    match taken {
        Ok(_) => answer(StatusCode::OK, "{}"),
        Err(_) => answer(
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"error":"temporarily_unavailable"}"#,
        ),
    }
}

/// The audit event of a sign-in through the provider, by the person's issuer and subject.
async fn audit_sign_in(
    state: &ControlState,
    person: &Person,
    tenant: Option<&str>,
    parts: &Parts,
    result: &str,
) -> Result<(), crate::state::StoreError> {
    let entry = audit_entry(&person.actor(), tenant, parts, "console.sign_in", result);
    state.store.append_audit(entry).await.map(|_| ())
}

/// An audit event of the console's sign-ins and sign-outs, by who it concerns.
fn audit_entry(
    actor: &str,
    tenant: Option<&str>,
    parts: &Parts,
    action: &str,
    result: &str,
) -> AuditEntry {
    let request_id = parts
        .extensions
        .get::<crate::error::RequestId>()
        .map(|r| r.0.clone())
        .unwrap_or_default();
    AuditEntry {
        at: crate::now(),
        tenant: tenant.map(str::to_owned),
        actor: actor.to_owned(),
        action: action.to_owned(),
        request_id,
        subject_ref: None,
        target: "console".to_owned(),
        target_ref: None,
        result: result.to_owned(),
        attempt: 1,
    }
}

#[cfg(test)]
mod tests {
    use super::signed_in_since;

    /// A step-up is a sign-in after it was asked for: an `auth_time` before (beyond the leeway),
    /// or none at all, is the old sign-in passed off as a fresh one.
    #[test]
    fn a_step_up_needs_a_sign_in_after_it_was_asked_for() {
        let asked = 1_800_000_000;
        for (authenticated, leeway, fresh) in [
            (Some(asked as u64 + 5), 0, true),
            (Some(asked as u64), 0, true),
            (Some(asked as u64 - 20), 30, true),
            (Some(asked as u64 - 31), 30, false),
            (Some(asked as u64 - 3600), 30, false),
            (None, 30, false),
            (Some(u64::MAX), 30, false),
        ] {
            assert_eq!(
                signed_in_since(authenticated, asked, leeway),
                fresh,
                "{authenticated:?} with leeway {leeway}"
            );
        }
    }
}
