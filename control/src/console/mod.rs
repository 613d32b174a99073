//! The compliance console (`/console`): server-rendered pages for the DPO, on the control
//! listener, from the binary alone. Who is signed in, and how, is [`session`]'s: a handler takes
//! a [`Session`] (a page) or a [`Posted`] form, and whoever has neither is sent to sign in. Each
//! page is a template in `control/templates/console/` that escapes every value it places; each
//! step a person takes calls the same action the API's handler does.

mod audit;
mod derivatives;
mod filing;
mod oidc;
mod page;
mod policy;
mod request;
mod requests;
mod session;
mod subject;

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};

use super::ControlState;
use super::error::ApiError;
use filing::StartForm;
use page::{Message, render};
pub use session::SignInLimit;
use session::{Fields, Posted, Session};
#[cfg(test)]
pub(crate) use subject::ActionBoxes;

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
        .route("/console/oidc/login", get(oidc::login))
        .route("/console/oidc/callback", get(oidc::callback))
        .route(
            "/console/oidc/backchannel-logout",
            post(oidc::backchannel_logout),
        )
        .route(
            "/console/requests",
            get(requests::requests).post(filing::file),
        )
        .route("/console/requests/dry-run", post(filing::dry_run))
        .route("/console/requests/{id}", get(request::request))
        .route("/console/requests/{id}/approve", post(request::approve))
        .route("/console/requests/{id}/review", post(request::review))
        .route("/console/requests/{id}/resume", post(request::resume))
        .route("/console/requests/{id}/extend", post(request::extend))
        .route("/console/requests/{id}/reject", post(request::reject))
        .route(
            "/console/requests/{id}/derivatives",
            post(derivatives::decide),
        )
        .route(
            "/console/requests/{id}/certificate",
            get(request::certificate),
        )
        .route("/console/subjects", get(subject::subject))
        .route("/console/subjects/grant", post(subject::grant))
        .route("/console/subjects/revoke", post(subject::revoke))
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

/// A refusal of the API's, as a page titled `title`, with its status.
fn refused(session: &Session, title: &str, e: &ApiError) -> Response {
    render(
        e.status,
        &Message {
            frame: session.frame(title),
            text: e.message.clone(),
            details: e.details.clone(),
            alert: true,
        },
    )
}

/// After a form: on to `to`, or the refusal, as a page titled `refused`.
fn then_to<T>(session: &Session, done: Result<T, ApiError>, to: &str, refused: &str) -> Response {
    match done {
        Ok(_) => Redirect::to(to).into_response(),
        Err(e) if e.is_second_factor_required() => oidc::step_up(session, to),
        Err(e) => self::refused(session, refused, &e),
    }
}

/// A value as a URL component.
fn urlencoding(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

fn request_uri(id: &str) -> String {
    format!("/console/requests/{}", urlencoding(id))
}

fn subject_uri(subject: &str) -> String {
    format!("/console/subjects?subject={}", urlencoding(subject))
}
