//! The control plane: an axum app on its own listener for compliance staff and operators.

pub mod admin;
pub mod metrics;

// The layers below, named as before.
use lethe_data as data;
#[cfg(test)]
use lethe_data::testing;
use lethe_data::{auth, config, error_shape, revocations};
use lethe_erasure as erasure;
use lethe_erasure::governed;
use lethe_state as state;
use lethe_state::now;

mod audit;
mod consents;
pub(crate) mod console;
mod derivatives;
mod erasures;
pub mod error;
mod extract;
mod holds;
pub(crate) mod ops;
mod retention;
mod subjects;
mod tokens;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

use crate::auth::access::Tokens;
use crate::metrics::Metrics;
use crate::state::Store;
use error::ApiError;

/// Everything the handlers share.
#[derive(Clone)]
pub struct ControlState {
    pub store: Arc<dyn Store>,
    /// The tokens callers may bring: Lethe's own and, with `[auth.oidc]`, the provider's.
    pub tokens: Tokens,
    pub audit_key: Arc<[u8]>,
    pub metrics: Arc<Metrics>,
    pub max_body_bytes: usize,
    pub erasure: ErasureSettings,
    /// The governed databases a policy change must reach before it is answered.
    pub governed: Arc<crate::governed::Governed>,
    /// The data plane beside it, for its metrics (none without a data plane).
    pub data: Option<Arc<crate::data::DataState>>,
    /// Which tenants' subject keys are case-insensitive.
    pub folding: lethe_policy::names::Folding,
    /// Tokens revoked before they expire (the data plane's list, where there is one).
    pub revocations: Arc<crate::revocations::Revocations>,
    /// How long a console session lasts unused, and at most.
    pub sessions: SessionLimits,
    /// Failed console sign-ins, per client address.
    pub sign_ins: Arc<console::SignInLimit>,
    /// The organisation's OpenID provider people sign in to the console through, if configured.
    pub oidc: Option<Arc<crate::auth::oidc::Provider>>,
    /// Whether the console also takes a pasted token.
    pub token_sign_in: bool,
}

/// How long a console session lasts: unused, and at most (and never past its token's expiry).
#[derive(Debug, Clone, Copy)]
pub struct SessionLimits {
    pub idle: std::time::Duration,
    pub max: std::time::Duration,
}

/// How erasure requests are carried out and certified.
#[derive(Clone)]
pub struct ErasureSettings {
    pub approvals_required: usize,
    /// Approving, releasing a hold and resuming after an exception need a second factor.
    pub approval_requires_mfa: bool,
    /// The purge targets every new request gets a job for (`chroma:<route>`, ...).
    pub targets: Vec<String>,
    pub certifier: Arc<crate::erasure::certificate::Certifier>,
    /// Months from a request's receipt to its statutory deadline.
    pub deadline_months: u32,
    /// Counts a subject in every purge target before an erasure is filed.
    pub inventory: Arc<crate::erasure::Inventory>,
}

impl ErasureSettings {
    pub fn from_config(
        config: &crate::config::Config,
        certifier: Arc<crate::erasure::certificate::Certifier>,
        inventory: Arc<crate::erasure::Inventory>,
    ) -> Self {
        ErasureSettings {
            approvals_required: config.erasure.approvals_required,
            approval_requires_mfa: config.erasure.approval_requires_mfa,
            targets: config.erasure_targets(),
            certifier,
            deadline_months: config.erasure.deadline_months,
            inventory,
        }
    }
}

/// The control-plane app. Layers, outermost first: request id and error rendering, metrics and
/// access log, body limit; then the routes.
pub fn app(state: ControlState) -> Router {
    let metrics = Arc::clone(&state.metrics);
    Router::new()
        .route("/v1/consents", post(consents::grant).get(consents::list))
        .route("/v1/consents/{id}/revoke", post(consents::revoke))
        .route("/v1/tokens/revoke", post(tokens::revoke))
        .route(
            "/v1/retention-rules",
            get(retention::current).put(retention::replace),
        )
        .route("/v1/legal-holds", post(holds::place).get(holds::list))
        .route("/v1/legal-holds/{id}/release", post(holds::release))
        .route("/v1/subjects/{tenant}/{subject}", get(subjects::view))
        .route("/v1/erasures", post(erasures::file))
        .route("/v1/erasures/dry-run", post(erasures::dry_run))
        .route("/v1/erasures/{id}", get(erasures::status))
        .route("/v1/erasures/{id}/approve", post(erasures::approve))
        .route("/v1/erasures/{id}/review", post(erasures::review))
        .route("/v1/erasures/{id}/resume", post(erasures::resume))
        .route("/v1/erasures/{id}/extend", post(erasures::extend))
        .route("/v1/erasures/{id}/reject", post(erasures::reject))
        .route("/v1/erasures/{id}/certificate", get(erasures::certificate))
        .route("/v1/erasures/{id}/derivatives", get(derivatives::list))
        .route(
            "/v1/erasures/{id}/derivatives/decide",
            post(derivatives::decide),
        )
        .route(
            "/v1/lineage/{store}/{collection}/{*item}",
            get(derivatives::lineage),
        )
        .route("/v1/audit", get(audit::page))
        .route("/v1/audit/verify", get(audit::verify))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .route("/openapi.json", get(ops::openapi))
        .merge(console::routes())
        .fallback(|| async { ApiError::not_found("endpoint") })
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state.governed),
            governed_first,
        ))
        .layer(DefaultBodyLimit::max(state.max_body_bytes))
        .with_state(state)
        .layer(axum::middleware::from_fn_with_state(
            metrics,
            crate::metrics::record,
        ))
        .layer(axum::middleware::from_fn(error::render_errors))
}

/// Collects every problem with a request body before answering.
#[derive(Debug, Default)]
struct Problems(Vec<String>);

impl Problems {
    /// An identifier (a tenant, a purpose, a category) in its one spelling, written back (see
    /// `lethe_policy::names`: NFC; nothing invisible, no edge whitespace, no `/`, which separates
    /// tenant and subject in `subject_ref`; at most 200 bytes).
    fn name(&mut self, field: &str, value: &mut String) {
        self.key(field, value, false);
    }

    /// A subject key or alias in its one spelling, written back; `fold`: the tenant's keys are
    /// case-insensitive.
    fn key(&mut self, field: &str, value: &mut String, fold: bool) {
        match lethe_policy::names::canonical_key(value, fold) {
            Ok(std::borrow::Cow::Borrowed(_)) => {}
            Ok(std::borrow::Cow::Owned(canonical)) => *value = canonical,
            Err(e) => self.0.push(format!("{field}: {e}")),
        }
    }

    fn text(&mut self, field: &str, value: &str) {
        if value.trim().is_empty() {
            self.0.push(format!("{field}: must not be empty"));
        } else if value.len() > 2000 {
            self.0.push(format!("{field}: must be at most 2000 bytes"));
        }
    }

    fn check(&mut self, ok: bool, problem: impl FnOnce() -> String) {
        if !ok {
            self.0.push(problem());
        }
    }

    fn into_result(self) -> Result<(), ApiError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ApiError::validation(self.0))
        }
    }
}

#[cfg(test)]
mod closed_lists;
#[cfg(test)]
mod tests;

/// How long a change waits, from its arrival, for the governed databases before it is answered
/// anyway (then the
/// lag shows in the metrics, and the change is still applied as soon as a database takes it).
const GOVERNED_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A change (any request but a read) is answered once the policy it changed has reached every
/// governed database: a flip hides the subject there before its approval is acknowledged.
async fn governed_first(
    axum::extract::State(governed): axum::extract::State<Arc<crate::governed::Governed>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let may_change = !matches!(
        *request.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    );
    let before = governed.queued();
    let started = std::time::Instant::now();
    let response = next.run(request).await;
    // Only a request during which a change was announced waits (a sign-in does not), and no
    // longer than the wait from its arrival (an approval has waited for its flip already).
    let left = GOVERNED_WAIT.saturating_sub(started.elapsed());
    if may_change && governed.queued() != before && !governed.settled(left).await {
        tracing::warn!(
            lag = governed.lag(),
            "a policy change has not reached every governed database yet"
        );
    }
    response
}
