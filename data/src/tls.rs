//! TLS on Lethe's own listeners (`[data_plane.tls]`, `[control_plane.tls]`, `[admin.tls]`):
//! rustls, TLS 1.2 and 1.3 only, the certificate chain and key read from PEM files and read again
//! when the files change (checked at most every few seconds, on a handshake; a pair that does not
//! load leaves the one in use), and, with `client_ca`, only clients whose certificate that CA
//! signed. Connections are accepted side by side, each handshake within a deadline, so a client
//! that never finishes one holds up nobody else.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::config::TlsConfig;

/// A listener's TLS.
pub type ServerTls = Arc<rustls::ServerConfig>;

/// How long a client has to finish its handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);
/// How often the files are looked at again, at most.
const RECHECK: Duration = Duration::from_secs(2);

/// When the certificate's and the key's files were last changed, as read.
type Stamps = Option<(SystemTime, SystemTime)>;

/// The certificate and key in use, read again when their files change.
#[derive(Debug)]
struct Reloading {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<(Arc<CertifiedKey>, Stamps)>,
    checked: Mutex<Instant>,
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn load(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, String> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("{}: no certificate in the PEM", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    let certified = CertifiedKey::from_der(chain, key, &provider)
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    Ok(Arc::new(certified))
}

impl Reloading {
    fn new(cert: &Path, key: &Path) -> Result<Self, String> {
        let stamps = modified(cert).zip(modified(key));
        Ok(Reloading {
            current: RwLock::new((load(cert, key)?, stamps)),
            cert: cert.to_owned(),
            key: key.to_owned(),
            checked: Mutex::new(Instant::now()),
        })
    }

    /// Reads the pair again if either file changed since it was read.
    fn refresh(&self) {
        {
            let mut checked = self.checked.lock().unwrap_or_else(|p| p.into_inner());
            if checked.elapsed() < RECHECK {
                return;
            }
            *checked = Instant::now();
        }
        let stamps = modified(&self.cert).zip(modified(&self.key));
        let known = self.current.read().unwrap_or_else(|p| p.into_inner()).1;
        if stamps == known {
            return;
        }
        match load(&self.cert, &self.key) {
            Ok(certified) => {
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = (certified, stamps);
                tracing::info!(cert = %self.cert.display(), "TLS certificate read again");
            }
            // Half-written files, or a key that is not the certificate's: the pair in use stays.
            Err(e) => {
                tracing::warn!(error = %e, "TLS certificate not read again; keeping the one in use")
            }
        }
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.refresh();
        Some(Arc::clone(
            &self.current.read().unwrap_or_else(|p| p.into_inner()).0,
        ))
    }
}

/// The rustls server configuration of `config` (what `at` names in messages).
pub fn server_config(config: &TlsConfig, at: &str) -> Result<ServerTls, String> {
    let problem = |e: String| format!("{at}.tls: {e}");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| problem(e.to_string()))?;
    let builder = match &config.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca)
                .map_err(|e| problem(format!("{}: {e}", ca.display())))?
            {
                let cert = cert.map_err(|e| problem(format!("{}: {e}", ca.display())))?;
                roots.add(cert).map_err(|e| problem(e.to_string()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| problem(format!("{}: {e}", ca.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let resolver = Reloading::new(&config.cert, &config.key).map_err(problem)?;
    let mut tls = builder.with_cert_resolver(Arc::new(resolver));
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(tls))
}

/// A client connection, in the clear or over TLS.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The stream of an accepted connection: over TLS where there is a configuration (`None` when
/// the client did not finish its handshake in time, or failed it).
pub async fn secured(stream: TcpStream, tls: Option<&ServerTls>) -> Option<Stream> {
    let Some(tls) = tls else {
        return Some(Stream::Plain(stream));
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(tls));
    match tokio::time::timeout(HANDSHAKE, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => Some(Stream::Tls(Box::new(stream))),
        _ => None,
    }
}
