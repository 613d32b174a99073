//! Sending a decided request to its upstream with a pooled client, and reading the whole answer
//! before anything is passed back.

use crate::error_shape::Code;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{HttpConnector, capture_connection};
use hyper_util::rt::TokioExecutor;

use super::error::DataError;
use crate::config::RouteConfig;

/// A configured route: where its clients reach it (a prefix of the data plane, or a listener of
/// its own), with which credential, to which store.
#[derive(Debug, Clone)]
pub struct Route {
    pub name: String,
    /// Its path prefix on the data plane, for a store spoken to in HTTP.
    pub prefix: Option<String>,
    /// Its own listener, for a store spoken to in a protocol of its own.
    pub listen: Option<std::net::SocketAddr>,
    pub upstream: Uri,
    pub credential: Option<Credential>,
    /// How long the upstream may take to start answering.
    pub timeout: Option<std::time::Duration>,
    /// The purpose and category of requests that name none.
    pub purpose: Option<String>,
    pub category: Option<String>,
    /// What serves the route's requests and purges its store.
    pub store: Arc<dyn super::route::RouteStore>,
}

/// The upstream's own credential: a header and its value for HTTP stores; for others (Redis),
/// a user name, kept as written (Redis ACL user names are case-sensitive; a header name is not),
/// and its password.
#[derive(Debug, Clone)]
pub struct Credential {
    pub name: String,
    pub header: HeaderName,
    pub value: HeaderValue,
}

impl Route {
    /// The route a configuration describes, served and purged by `store` (its kind's, read from
    /// the route's own keys by `stores::routes`).
    pub fn from_config(
        config: &RouteConfig,
        store: Arc<dyn super::route::RouteStore>,
    ) -> Result<Route, String> {
        let upstream = config
            .upstream
            .parse()
            .map_err(|e| format!("route {}: upstream: {e}", config.name))?;
        let credential = match &config.credential {
            None => None,
            Some(c) => {
                let name = HeaderName::from_bytes(c.header.as_bytes())
                    .map_err(|e| format!("route {}: {e}", config.name))?;
                let mut value = HeaderValue::from_bytes(
                    &c.value
                        .resolve()
                        .map_err(|e| format!("route {}: credential: {e}", config.name))?,
                )
                .map_err(|e| format!("route {}: credential: {e}", config.name))?;
                value.set_sensitive(true);
                Some(Credential {
                    name: c.header.clone(),
                    header: name,
                    value,
                })
            }
        };
        Ok(Route {
            name: config.name.clone(),
            prefix: config.prefix.clone(),
            listen: config.listen,
            upstream,
            credential,
            timeout: config.timeout.map(|t| t.0),
            purpose: config.purpose.clone(),
            category: config.category.clone(),
            store,
        })
    }

    /// The rest of `path` when it is under this route's prefix.
    pub fn strip<'p>(&self, path: &'p str) -> Option<&'p str> {
        let rest = path.strip_prefix(self.prefix.as_deref()?)?;
        (rest.is_empty() || rest.starts_with('/')).then_some(rest)
    }
}

/// A whole upstream answer.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    /// The answer as the client gets it: hop-by-hop headers dropped, exact length.
    pub fn into_response(self, body: Bytes) -> Response<Full<Bytes>> {
        let mut headers = self.headers;
        strip_hop_by_hop(&mut headers);
        headers.remove(header::CONTENT_LENGTH);
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
        let mut response = Response::new(Full::new(body));
        *response.status_mut() = self.status;
        *response.headers_mut() = headers;
        response
    }

    /// The answer passed on unchanged (it carries no records: service calls, write results,
    /// the upstream's own errors).
    pub fn passed_on(self) -> Response<Full<Bytes>> {
        let body = self.body.clone();
        self.into_response(body)
    }

    pub fn is_success(&self) -> bool {
        self.status.is_success()
    }
}

const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Removes the hop-by-hop headers, including those the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Runs `work` within the route's timeout, if it has one.
async fn within<T>(route: &Route, work: impl Future<Output = T>) -> Result<T, DataError> {
    match route.timeout {
        Some(limit) => tokio::time::timeout(limit, work).await.map_err(|_| {
            DataError::upstream_unavailable(format!(
                "the {} upstream did not answer within {} ms",
                route.name,
                limit.as_millis()
            ))
        }),
        None => Ok(work.await),
    }
}

#[derive(Clone)]
pub struct Upstreams {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    tls: Arc<rustls::ClientConfig>,
    max_answer_bytes: usize,
    /// Where each call is counted (the data plane's metrics; a purge's go nowhere).
    metrics: Arc<crate::metrics::DataMetrics>,
}

impl Upstreams {
    /// A pooled client for `http://` and `https://` upstreams, with the TLS of `tls_client`.
    pub fn new(max_answer_bytes: usize, extra_ca: Option<&[u8]>) -> Result<Self, String> {
        let tls = tls_client(extra_ca)?;
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(rustls::ClientConfig::clone(&tls))
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        // A connection idle this long is not reused: servers close idle connections after their
        // keep-alive (5 s for Qdrant's actix and uvicorn), and a request sent on one just closed
        // fails (`IncompleteMessage`; measured under a purge bench, 11 in 11 000 Qdrant queries).
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(64)
            .pool_timer(hyper_util::rt::TokioTimer::new())
            .pool_idle_timeout(std::time::Duration::from_secs(4))
            .build(connector);
        Ok(Upstreams {
            client,
            tls,
            max_answer_bytes,
            metrics: Arc::default(),
        })
    }

    /// The same client, its calls counted in `metrics`.
    pub fn observed_by(self, metrics: Arc<crate::metrics::DataMetrics>) -> Self {
        Upstreams { metrics, ..self }
    }

    /// The client of a configuration (its `data_plane.upstream_ca`).
    pub fn from_config(
        config: &crate::config::Config,
        max_answer_bytes: usize,
    ) -> Result<Self, String> {
        Upstreams::new(max_answer_bytes, extra_ca(config)?.as_deref())
    }

    /// The TLS every upstream is reached with, for stores spoken to in a protocol of their own.
    pub fn tls(&self) -> Arc<rustls::ClientConfig> {
        self.tls.clone()
    }

    /// Sends `body` to the route's upstream and reads the whole answer.
    pub async fn send(
        &self,
        route: &Route,
        method: Method,
        path: &str,
        query: Option<&str>,
        client_headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Answer, DataError> {
        let whole = async {
            let response = self
                .open(route, method, path, query, client_headers, body)
                .await?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, self.max_answer_bytes)
                .collect()
                .await
                .map_err(|_| {
                    DataError::upstream_unavailable(format!(
                        "the {} upstream's answer was cut off or too large",
                        route.name
                    ))
                })?;
            Ok(Answer {
                status: parts.status,
                headers: parts.headers,
                body: body.to_bytes(),
            })
        };
        within(route, whole).await?
    }

    /// Sends `body` to the route's upstream at `path` (and `query`) and answers once the head of
    /// the answer is in (within the route's timeout); the body is the caller's to read. The
    /// client's own credentials and Lethe's headers stay behind; the route's credential goes
    /// instead.
    pub async fn open(
        &self,
        route: &Route,
        method: Method,
        path: &str,
        query: Option<&str>,
        client_headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response<Incoming>, DataError> {
        let uri = upstream_uri(route, path, query)?;
        let headers = upstream_headers(route, client_headers, &method, body.len());
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = method;
        *request.uri_mut() = uri;
        *request.headers_mut() = headers;
        // Which pooled connection carries the request (hyper-util fills it in at checkout).
        let connection = capture_connection(&mut request);

        let started = std::time::Instant::now();
        let called = |status: Option<u16>, error: &'static str| {
            (self.metrics).called(&route.name, status, error, started.elapsed());
        };
        let answered = within(route, self.client.request(request))
            .await
            .inspect_err(|_| called(None, "timeout"))?;
        let response = answered.map_err(|e| {
            called(None, "unavailable");
            // `?e` keeps hyper's cause (`IncompleteMessage`, `Io(ConnectionReset)`, ...):
            // hyper-util's Display is only "client error (SendRequest)".
            tracing::warn!(route = %route.name, error = ?e, "upstream request failed");
            DataError::upstream_unavailable(format!("the {} upstream is unavailable", route.name))
        })?;
        called(Some(response.status().as_u16()), "");
        // An interim answer (101 Switching Protocols, say) is no answer: passed on, it would
        // leave the client's connection in a protocol Lethe does not speak.
        if response.status().is_informational() {
            return Err(DataError::new(
                StatusCode::BAD_GATEWAY,
                Code::UpstreamInvalid,
                format!("the {} upstream answered {}", route.name, response.status()),
            ));
        }
        // A server may close its connection right after an error answer without saying so
        // (Starlette under uvicorn writes the 500, re-raises, and uvicorn closes the transport).
        // Kept in the pool, that connection would take the next request and lose it (hyper does
        // not retry a request it sent): the client would get a 502. A connection that carried a
        // 5xx is never used again; its answer is still read whole.
        if response.status().is_server_error()
            && let Some(connected) = &*connection.connection_metadata()
        {
            connected.poison();
        }
        if response
            .headers()
            .get(header::CONTENT_ENCODING)
            .is_some_and(|v| v != "identity")
        {
            return Err(DataError::new(
                StatusCode::BAD_GATEWAY,
                Code::UpstreamInvalid,
                "the upstream answered compressed",
            ));
        }
        Ok(response)
    }
}

/// The upstream's URI of `path` (and `query`) on `route`, below the upstream URL's own path.
fn upstream_uri(route: &Route, path: &str, query: Option<&str>) -> Result<Uri, DataError> {
    let base = route.upstream.path().trim_end_matches('/');
    // The route's root (`/qdrant`, a client's version check) is the upstream's root.
    let path = match (base, path) {
        ("", "") => "/",
        _ => path,
    };
    let path_and_query = match query {
        Some(q) => format!("{base}{path}?{q}"),
        None => format!("{base}{path}"),
    };
    let mut parts = route.upstream.clone().into_parts();
    parts.path_and_query =
        Some(path_and_query.parse().map_err(|_| {
            DataError::new(StatusCode::BAD_REQUEST, Code::InvalidRequest, "bad path")
        })?);
    let uri = Uri::from_parts(parts)
        .map_err(|_| DataError::new(StatusCode::BAD_REQUEST, Code::InvalidRequest, "bad path"))?;
    Ok(uri)
}

/// The headers sent upstream: the client's, without its own credentials, hop-by-hop and
/// Lethe's headers or those the route scrubs, with the route's credential instead.
fn upstream_headers(
    route: &Route,
    client_headers: &HeaderMap,
    method: &Method,
    body_len: usize,
) -> HeaderMap {
    let mut headers = client_headers.clone();
    strip_hop_by_hop(&mut headers);
    for name in [
        header::HOST,
        header::AUTHORIZATION,
        header::COOKIE,
        header::CONTENT_LENGTH,
        header::ACCEPT_ENCODING,
    ] {
        headers.remove(name);
    }
    if let super::route::Serving::Http(http) = route.store.serving() {
        for name in http.scrubbed_headers() {
            headers.remove(*name);
        }
    }
    let lethe: Vec<HeaderName> = headers
        .keys()
        .filter(|k| k.as_str().starts_with("x-lethe-"))
        .cloned()
        .collect();
    for name in lethe {
        headers.remove(name);
    }
    // Lethe has to read every answer, so it asks for it uncompressed.
    headers.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    if body_len > 0 || *method == Method::POST || *method == Method::PUT {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body_len));
    }
    if let Some(credential) = &route.credential {
        headers.insert(credential.header.clone(), credential.value.clone());
    }
    headers
}

/// The certificates of a configuration's `data_plane.upstream_ca`, when it names some.
fn extra_ca(config: &crate::config::Config) -> Result<Option<Vec<u8>>, String> {
    match &config.data_plane.upstream_ca {
        Some(secret) => secret
            .resolve()
            .map(Some)
            .map_err(|e| format!("data_plane.upstream_ca: {e}")),
        None => Ok(None),
    }
}

/// TLS to upstreams: Mozilla's roots and, when given, the certificates of `extra_ca` (PEM), for
/// upstreams behind a private CA. Certificates are always verified.
pub fn tls_client(extra_ca: Option<&[u8]>) -> Result<Arc<rustls::ClientConfig>, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(pem) = extra_ca {
        let mut added = 0;
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| format!("upstream_ca: {e}"))?;
            roots.add(cert).map_err(|e| format!("upstream_ca: {e}"))?;
            added += 1;
        }
        if added == 0 {
            return Err("upstream_ca: no certificate in the PEM".into());
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(tls))
}

/// The TLS of a configuration's upstreams (its `data_plane.upstream_ca`).
pub fn tls_of(config: &crate::config::Config) -> Result<Arc<rustls::ClientConfig>, String> {
    tls_client(extra_ca(config)?.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_go_including_those_connection_names() {
        let mut headers = HeaderMap::new();
        for (k, v) in [
            ("connection", "keep-alive, x-secret-hop"),
            ("x-secret-hop", "1"),
            ("te", "trailers"),
            ("x-kept", "1"),
            ("transfer-encoding", "chunked"),
        ] {
            headers.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        strip_hop_by_hop(&mut headers);
        assert_eq!(
            headers.keys().map(HeaderName::as_str).collect::<Vec<_>>(),
            ["x-kept"]
        );
    }
}
