//! HTTP on one of Lethe's listeners (the data plane's, the control plane's, the admin one): each
//! connection admitted by the listener's gate or told why and closed, over TLS where configured
//! (the handshake beside the accept loop, within its deadline), each request head within
//! [`HEAD_DEADLINE`], until shutdown; then the connections in flight get their grace to finish.
//! A failed accept (no file descriptor left, say) is tried again after a pause, and said at most
//! once a second, so it can neither spin the CPU nor flood the log.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tower::{BoxError, Service};

use crate::admission::{Gate, Refused};
use crate::error_shape::{Code, error_body};
use crate::tls::{ServerTls, secured};

/// How long a client has to send a request's head (and, idle, its next one).
pub const HEAD_DEADLINE: Duration = Duration::from_secs(30);
/// How long the accept loop rests after a failed accept.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// A listener's bounds: its gate, its TLS, and how long its connections get at shutdown.
pub struct Listening {
    pub gate: Arc<Gate>,
    pub tls: Option<ServerTls>,
    pub grace: Duration,
}

/// Serves `listener`, each connection by the service `service` makes for its peer, until
/// `shutdown` resolves.
pub async fn serve_http<S, B>(
    listener: TcpListener,
    listening: Listening,
    service: impl Fn(SocketAddr) -> S,
    shutdown: impl Future<Output = ()>,
) where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut failing = AcceptFailures::default();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    failing.rest(&e).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let admitted = match listening.gate.admit(peer.ip()) {
            Ok(admitted) => admitted,
            Err(refused) => {
                tokio::spawn(refuse(stream, overloaded_response(&refused)));
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (watcher, service, tls) = (graceful.watcher(), service(peer), listening.tls.clone());
        // A client that never finishes its handshake holds up nobody else, and keeps its place
        // in the gate only until its deadline.
        tokio::spawn(async move {
            let Some(stream) = secured(stream, tls.as_ref()).await else {
                return;
            };
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEAD_DEADLINE)
                .serve_connection(
                    TokioIo::new(stream),
                    hyper_util::service::TowerToHyperService::new(service),
                );
            let _ = watcher.watch(connection).await;
            drop(admitted);
        });
    }
    let _ = tokio::time::timeout(listening.grace, graceful.shutdown()).await;
}

/// Failed accepts: each followed by a rest, and said at most once a second with how many
/// there were.
#[derive(Default)]
pub struct AcceptFailures {
    since: u64,
    said_at: Option<Instant>,
}

impl AcceptFailures {
    pub async fn rest(&mut self, error: &std::io::Error) {
        self.since += 1;
        if self
            .said_at
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(1))
        {
            tracing::warn!(%error, failures = self.since, "accept failed; trying again shortly");
            (self.since, self.said_at) = (0, Some(Instant::now()));
        }
        tokio::time::sleep(ACCEPT_PAUSE).await;
    }
}

/// An HTTP answer to a connection the listener cannot admit.
fn overloaded_response(refused: &Refused) -> Vec<u8> {
    let body = error_body(Code::Overloaded.as_str(), &refused.to_string(), "", None).to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\nretry-after: 1\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Tells a connection not admitted why, and closes it (without reading it).
pub async fn refuse(mut stream: TcpStream, why: Vec<u8>) {
    use tokio::io::AsyncWriteExt;
    let told = async {
        let _ = stream.write_all(&why).await;
        let _ = stream.shutdown().await;
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), told).await;
}
