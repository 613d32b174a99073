//! The data plane: a hyper server in front of the memory stores.
//!
//! `request id -> timeout -> load shed + concurrency limit -> authenticate -> route -> read the
//! body within the limit -> adapter: decide and rewrite -> forward -> adapter: decide the answer
//! -> respond`. Nothing reaches the upstream before the request is decided, and nothing reaches
//! the client before the whole answer is checked, so every failure can still become a proper
//! JSON error.

pub mod auth;
pub mod config;
pub mod error_shape;
pub mod purge;
pub mod revocations;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

// The layers below, named as before.
use lethe_state as state;
pub use lethe_state::now;

pub mod admission;
pub mod context;
pub mod derivation;
pub mod error;
pub mod forward;
pub mod lineage;
pub mod listen;
pub mod metrics;
pub mod overtaken;
pub mod policy_cache;
pub mod records;
pub mod route;
pub mod sse;
pub mod stream;
pub mod tls;
pub mod tokens;

use crate::error_shape::Code;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};

pub use context::RequestContext;
use error::DataError;
use forward::{Route, Upstreams};
use lineage::LineageWriter;
use policy_cache::PolicyCache;
use tokens::TokenCache;

use crate::state::Store;

/// Everything a data-plane request needs.
pub struct DataState {
    pub routes: Vec<Route>,
    pub tokens: TokenCache,
    pub policy: Arc<PolicyCache>,
    pub store: Arc<dyn Store>,
    pub upstreams: Upstreams,
    pub lineage: LineageWriter,
    pub derivation: Arc<derivation::Derivation>,
    pub audit_key: Arc<[u8]>,
    pub max_body_bytes: usize,
    /// Which tenants' subject keys are case-insensitive.
    pub folding: lethe_policy::names::Folding,
    /// Tokens revoked before they expire.
    pub revocations: Arc<crate::revocations::Revocations>,
    /// Requests, upstream calls and connections, for `/metrics`.
    pub metrics: Arc<metrics::DataMetrics>,
}

impl DataState {
    /// The data plane of a configuration serving `routes` (its routes, built by
    /// `stores::routes`), and the lineage writer task (it ends once the state is dropped and its
    /// last rows are written).
    pub fn build(
        config: &crate::config::Config,
        routes: Vec<Route>,
        store: Arc<dyn Store>,
        tokens: crate::auth::access::Tokens,
        audit_key: Arc<[u8]>,
    ) -> Result<(Arc<DataState>, tokio::task::JoinHandle<()>), String> {
        let (lineage, lineage_task) = LineageWriter::spawn(Arc::clone(&store));
        let metrics = Arc::new(metrics::DataMetrics::default());
        let max_body_bytes =
            usize::try_from(config.data_plane.max_body_bytes).unwrap_or(usize::MAX);
        let state = DataState {
            routes,
            revocations: crate::revocations::Revocations::new(Arc::clone(&store)),
            tokens: TokenCache::new(tokens),
            policy: PolicyCache::new(Arc::clone(&store), 100_000, config.lineage.window.0),
            derivation: Arc::new(derivation::Derivation::new(
                &config.lineage,
                Arc::clone(&store),
                Arc::clone(&audit_key),
            )),
            store,
            // Answers may be larger than requests (a query returns many records).
            upstreams: Upstreams::from_config(config, max_body_bytes.saturating_mul(8))?
                .observed_by(Arc::clone(&metrics)),
            metrics,
            lineage,
            audit_key,
            max_body_bytes,
            folding: config.folding(),
        };
        Ok((Arc::new(state), lineage_task))
    }
}

impl DataState {
    /// The data plane's metrics, in Prometheus' text format: requests, upstream calls,
    /// connections, the policy cache and the lineage window.
    pub fn render_metrics(&self, out: &mut String) {
        self.metrics.render(out);
        self.policy.render(out);
        self.lineage.render(out);
        out.push_str(&self.derivation.memory().render());
    }
}

/// Limits applied around every connection and every request.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub timeout: Duration,
    pub max_concurrency: usize,
    /// Of each listener (the data plane's, each route's own).
    pub connections: admission::ConnectionLimits,
    pub auth_timeout: Duration,
    pub idle_timeout: Duration,
}

impl Limits {
    pub fn of(config: &crate::config::DataPlaneConfig) -> Limits {
        let count = |n: u32| usize::try_from(n).unwrap_or(usize::MAX);
        Limits {
            timeout: config.request_timeout.0,
            max_concurrency: count(config.max_concurrency),
            connections: admission::ConnectionLimits {
                max_connections: count(config.max_connections),
                max_connections_per_address: count(config.max_connections_per_address),
            },
            auth_timeout: config.auth_timeout.0,
            idle_timeout: config.idle_timeout.0,
        }
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits::of(&crate::config::DataPlaneConfig::default())
    }
}

/// Whole, checked answers; or server-sent events relayed one checked event at a time.
pub type Body = http_body_util::Either<Full<Bytes>, stream::EventStream>;

pub fn whole(response: Response<Full<Bytes>>) -> Response<Body> {
    response.map(http_body_util::Either::Left)
}

#[derive(Debug, Clone)]
struct RequestId(String);

/// The whole stack as one service: request id outermost, so that even a timeout or an overload
/// answer carries it; then timeout, load shedding and the concurrency limit; then `handle`.
pub fn service(
    state: Arc<DataState>,
    limits: Limits,
) -> impl Service<Request<Incoming>, Response = Response<Body>, Error = Infallible, Future: Send>
+ Clone
+ Send {
    let metrics = Arc::clone(&state.metrics);
    let inner = ServiceBuilder::new()
        .timeout(limits.timeout)
        .load_shed()
        .concurrency_limit(limits.max_concurrency)
        .service_fn(move |request| {
            let state = Arc::clone(&state);
            async move { Ok::<_, Infallible>(handle(&state, request).await) }
        });
    tower::service_fn(move |mut request: Request<Incoming>| {
        let id = request
            .headers()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .filter(|v| {
                !v.is_empty()
                    && v.len() <= 128
                    && v.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
            })
            .map_or_else(new_request_id, str::to_owned);
        request.extensions_mut().insert(RequestId(id.clone()));
        let inner = inner.clone();
        let metrics = Arc::clone(&metrics);
        async move {
            let (method, started) = (request.method().clone(), Instant::now());
            let mut response = match inner.oneshot(request).await {
                Ok(response) => response,
                Err(e) => {
                    // Shed or timed out before (or while) `handle` saw it: counted here.
                    let refusal = overload_or_timeout(&e);
                    let (status, code) = (refusal.status.as_u16(), refusal.code.as_str());
                    metrics.served("-", &method, status, code, started.elapsed());
                    whole(refusal.into_response(&id))
                }
            };
            if let Ok(value) = HeaderValue::from_str(&id) {
                response.headers_mut().insert("x-request-id", value);
            }
            Ok::<_, Infallible>(response)
        }
    })
}

/// A process-unique request id without a system call: a random prefix drawn once, and a counter.
fn new_request_id() -> String {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static PREFIX: OnceLock<String> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = PREFIX.get_or_init(|| uuid::Uuid::new_v4().simple().to_string()[..12].to_owned());
    format!("{prefix}-{:x}", COUNTER.fetch_add(1, Ordering::Relaxed))
}

fn overload_or_timeout(e: &BoxError) -> DataError {
    if e.is::<tower::timeout::error::Elapsed>() {
        DataError::new(
            StatusCode::GATEWAY_TIMEOUT,
            Code::Timeout,
            "the request took longer than the configured timeout",
        )
    } else if e.is::<tower::load_shed::error::Overloaded>() {
        DataError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            Code::Overloaded,
            "too many requests in flight; retry",
        )
    } else {
        DataError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            Code::Internal,
            "internal error",
        )
    }
}

/// What the access log says about a request, filled in as the request is understood.
#[derive(Default)]
struct Seen {
    route: Option<String>,
    subject: Option<(String, String)>,
}

/// One request: every failure becomes the JSON error shape here.
async fn handle(state: &DataState, request: Request<Incoming>) -> Response<Body> {
    let started = Instant::now();
    let id = request
        .extensions()
        .get::<RequestId>()
        .map(|r| r.0.clone())
        .unwrap_or_default();
    let method = request.method().clone();
    let mut seen = Seen::default();
    let mut error = "";
    let response = match run(state, request, &id, &mut seen).await {
        Ok(response) => response,
        Err(e) => {
            error = e.code.as_str();
            whole(e.into_response(&id))
        }
    };
    let route = seen.route.as_deref().unwrap_or("-");
    let status = response.status().as_u16();
    (state.metrics).served(route, &method, status, error, started.elapsed());
    if !tracing::enabled!(tracing::Level::INFO) {
        return response;
    }
    // Subjects only ever appear pseudonymised in logs.
    let subject_ref = seen.subject.map(|(tenant, s)| {
        let full = lethe_policy::audit::subject_ref(&state.audit_key, &tenant, &s);
        full.get(..16).unwrap_or_default().to_owned()
    });
    tracing::info!(
        request_id = %id,
        %method,
        route,
        subject_ref = subject_ref.as_deref().unwrap_or("-"),
        status,
        error,
        micros = started.elapsed().as_micros() as u64,
        "data request"
    );
    response
}

async fn run(
    state: &DataState,
    request: Request<Incoming>,
    id: &str,
    seen: &mut Seen,
) -> Result<Response<Body>, DataError> {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path();
    let found = state
        .routes
        .iter()
        .find_map(|r| r.strip(path).map(|rest| (r, rest)));
    let http = found.and_then(|(route, _)| match route.store.serving() {
        route::Serving::Http(http) => Some(http),
        route::Serving::Connections(_) => None,
    });
    seen.route = found.map(|(route, _)| route.name.clone());
    let claims = authenticated(state, &parts.headers, http.and_then(|h| h.token_header())).await?;
    let (route, rest) = found.ok_or_else(|| {
        DataError::new(
            StatusCode::NOT_FOUND,
            Code::UnknownRoute,
            "no route has this path prefix",
        )
    })?;
    let mut ctx = RequestContext::new(
        id.to_owned(),
        claims,
        &route.name,
        &parts.headers,
        &state.folding,
    )?;
    seen.subject = ctx.subject.clone().map(|s| (ctx.tenant().to_owned(), s));
    let rest = canonical_path(rest, http.is_some_and(|h| h.decodes_path()))?.to_owned();
    single_parameters(parts.uri.query())?;
    // A route's defaults stand in for the headers a client cannot send.
    if ctx.purpose.is_none() {
        ctx.purpose.clone_from(&route.purpose);
    }
    if ctx.category.is_none() {
        ctx.category.clone_from(&route.category);
    }

    let body = whole_body(state, &parts.headers, body).await?;

    let upstream = Upstream {
        state,
        route,
        parts: &parts,
    };
    match route.store.serving() {
        route::Serving::Http(http) => http.handle(&upstream, &ctx, &rest, body).await,
        // A route with a listener of its own has no prefix, so it is never found above.
        route::Serving::Connections(_) => Err(DataError::new(
            StatusCode::NOT_FOUND,
            Code::UnknownRoute,
            "no route has this path prefix",
        )),
    }
}

/// The caller's claims: a token, in the route's header or `Authorization`, that verifies and
/// is not revoked (a revocation that cannot be checked refuses it too).
async fn authenticated(
    state: &DataState,
    headers: &hyper::HeaderMap,
    token_header: Option<&'static str>,
) -> Result<Arc<crate::auth::Claims>, DataError> {
    let token = token(headers, token_header).map_err(|e| {
        DataError::new(
            StatusCode::UNAUTHORIZED,
            Code::Unauthenticated,
            e.to_string(),
        )
    })?;
    let claims = state.tokens.verify(token).await.map_err(|e| match e {
        crate::auth::AuthError::ProviderUnavailable(_) => DataError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            Code::ProviderUnavailable,
            e.to_string(),
        ),
        _ => DataError::new(
            StatusCode::UNAUTHORIZED,
            Code::Unauthenticated,
            e.to_string(),
        ),
    })?;
    state
        .revocations
        .check(&claims)
        .await
        .map_err(|e| match e {
            crate::revocations::Refused::Revoked => DataError::new(
                StatusCode::UNAUTHORIZED,
                Code::Unauthenticated,
                e.to_string(),
            ),
            _ => DataError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                Code::StateUnavailable,
                "whether the token was revoked cannot be known",
            ),
        })?;
    Ok(claims)
}

/// The request's body, whole, refused past the data plane's limit (declared or read).
async fn whole_body(
    state: &DataState,
    headers: &hyper::HeaderMap,
    body: Incoming,
) -> Result<Bytes, DataError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let too_large = || {
        DataError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            Code::BodyTooLarge,
            format!("the body is larger than {} bytes", state.max_body_bytes),
        )
    };
    if declared.is_some_and(|n| n > state.max_body_bytes as u64) {
        return Err(too_large());
    }
    Ok(Limited::new(body, state.max_body_bytes)
        .collect()
        .await
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                too_large()
            } else {
                DataError::new(
                    StatusCode::BAD_REQUEST,
                    Code::InvalidRequest,
                    "the body could not be read",
                )
            }
        })?
        .to_bytes())
}

/// The path after a route's prefix, when it names what it means one way only: no
/// percent-encoded bytes (the stores decode them, so `%61dd` would be `add` to them and not to
/// Lethe) unless the route `decodes` its path itself, no empty, `.` or `..` segments, no
/// backslashes. Anything else is refused rather than guessed at.
fn canonical_path(rest: &str, decodes: bool) -> Result<&str, DataError> {
    let plain = !rest.contains('\\') && (decodes || !rest.contains('%'));
    let segments = rest.is_empty()
        || rest == "/"
        || rest
            .strip_prefix('/')
            .is_some_and(|r| r.split('/').all(|s| !matches!(s, "" | "." | "..")));
    if plain && segments {
        Ok(rest)
    } else {
        Err(DataError::new(
            StatusCode::BAD_REQUEST,
            Code::InvalidRequest,
            "the path must name every segment plainly: no percent-encoding, empty, . or .. segments",
        ))
    }
}

/// A query that names a parameter twice, in any spelling, is refused: stores disagree on which
/// one counts, and Lethe must decide on the one the store reads.
fn single_parameters(query: Option<&str>) -> Result<(), DataError> {
    let mut seen = std::collections::HashSet::new();
    for (name, _) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        if !seen.insert(name.into_owned()) {
            return Err(DataError::new(
                StatusCode::BAD_REQUEST,
                Code::InvalidRequest,
                "a query parameter is given more than once",
            ));
        }
    }
    Ok(())
}

/// Where this request's upstream calls go: the route's upstream, with the client's query string
/// and headers (less credentials and hop-by-hop headers).
#[derive(Clone, Copy)]
pub struct Upstream<'a> {
    pub state: &'a DataState,
    pub route: &'a Route,
    pub parts: &'a hyper::http::request::Parts,
}

impl Upstream<'_> {
    /// Sends with the client's query string.
    pub async fn send(
        &self,
        method: hyper::Method,
        path: &str,
        body: Bytes,
    ) -> Result<forward::Answer, DataError> {
        self.send_query(method, path, self.parts.uri.query(), body)
            .await
    }

    /// Sends with a query string of Lethe's instead of the client's.
    pub async fn send_query(
        &self,
        method: hyper::Method,
        path: &str,
        query: Option<&str>,
        body: Bytes,
    ) -> Result<forward::Answer, DataError> {
        self.state
            .upstreams
            .send(self.route, method, path, query, &self.parts.headers, body)
            .await
    }
}

/// The caller's token: `Authorization: Bearer ...`, or, for a route whose clients send their key
/// in a header of their protocol's own (`api-key`), that header; never both (a proxy in front
/// of Lethe might authorise the other).
fn token<'h>(
    headers: &'h hyper::HeaderMap,
    own: Option<&'static str>,
) -> Result<&'h str, crate::auth::AuthError> {
    let bearer = crate::auth::bearer_token(headers);
    let Some(own) = own else { return bearer };
    let mut sent = headers.get_all(own).iter();
    match (bearer, sent.next(), sent.next()) {
        (Err(crate::auth::AuthError::Missing), Some(key), None) => key
            .to_str()
            .map(str::trim)
            .map_err(|_| crate::auth::AuthError::Malformed),
        (Err(crate::auth::AuthError::Missing), None, _) => Err(crate::auth::AuthError::Missing),
        (Ok(bearer), None, _) => Ok(bearer),
        (Err(e), None, _) => Err(e),
        _ => Err(crate::auth::AuthError::Repeated),
    }
}

/// Serves the data plane on `listener` (over `tls` where given) until `shutdown` resolves, then
/// lets requests in flight finish (at most the request timeout).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<DataState>,
    limits: Limits,
    tls: Option<tls::ServerTls>,
    shutdown: impl Future<Output = ()>,
) {
    let gate = admission::Gate::new(limits.connections);
    state.metrics.listener("data", gate.clone());
    let service = service(state, limits);
    let listening = listen::Listening {
        gate,
        tls,
        grace: limits.timeout,
    };
    listen::serve_http(listener, listening, |_| service.clone(), shutdown).await;
}

/// Serves a route with a listener of its own: each client connection is handed whole to the
/// route's store, until `stopping` turns true; the connections still open then get the request
/// timeout to end at a command boundary, and are closed after it.
pub async fn serve_connections(
    listener: tokio::net::TcpListener,
    route: Route,
    state: Arc<DataState>,
    stopping: tokio::sync::watch::Receiver<bool>,
    limits: Limits,
) {
    let route = Arc::new(route);
    let gate = admission::Gate::new(limits.connections);
    state.metrics.listener(&route.name, gate.clone());
    let timeouts = route::Timeouts {
        authenticate: limits.auth_timeout,
        idle: limits.idle_timeout,
        command: limits.timeout,
    };
    let grace = limits.timeout;
    let mut open = tokio::task::JoinSet::new();
    let mut stop = stopping.clone();
    let mut failing = listen::AcceptFailures::default();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                failing.rest(&e).await;
                continue;
            }
        };
        let route::Serving::Connections(store) = route.store.serving() else {
            continue;
        };
        let admitted = match gate.admit(peer.ip()) {
            Ok(admitted) => admitted,
            Err(refused) => {
                open.spawn(listen::refuse(stream, store.refusal(&refused.to_string())));
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (route, state, stopping) = (Arc::clone(&route), Arc::clone(&state), stopping.clone());
        open.spawn(async move {
            if let route::Serving::Connections(store) = route.store.serving() {
                store
                    .serve(&route, &state, stream, peer, timeouts, stopping)
                    .await;
            }
            drop(admitted);
        });
        // Connections that ended are not kept.
        while open.try_join_next().is_some() {}
    }
    let ended = async { while open.join_next().await.is_some() {} };
    if tokio::time::timeout(grace, ended).await.is_err() {
        open.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_read_from_one_header_only() {
        use crate::auth::AuthError::{Missing, Repeated};
        use hyper::header::HeaderMap;
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.append(*name, HeaderValue::from_static(value));
            }
            map
        };
        const BEARER: (&str, &str) = ("authorization", "Bearer t1");
        const KEY: (&str, &str) = ("api-key", "t2");
        // The headers sent, the route's own token header, the token read.
        type Case = (
            &'static [(&'static str, &'static str)],
            Option<&'static str>,
            Result<&'static str, String>,
        );
        let cases: &[Case] = &[
            (&[BEARER], None, Ok("t1")),
            (&[KEY], None, Err(Missing.to_string())),
            (&[BEARER], Some("api-key"), Ok("t1")),
            (&[KEY], Some("api-key"), Ok("t2")),
            (&[], Some("api-key"), Err(Missing.to_string())),
            (&[BEARER, KEY], Some("api-key"), Err(Repeated.to_string())),
            (
                &[KEY, ("api-key", "t3")],
                Some("api-key"),
                Err(Repeated.to_string()),
            ),
        ];
        for (sent, own, expected) in cases {
            let sent_headers = headers(sent);
            let found = token(&sent_headers, *own).map_err(|e| e.to_string());
            assert_eq!(&found, expected, "{sent:?} {own:?}");
        }
    }
}
