//! The control and admin listeners for axum: connections accepted, and their TLS handshakes
//! made, side by side (see `data::tls`), so a client that never finishes one holds up nobody.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::data::tls::{ServerTls, Stream, secured};

/// A listener for axum whose connections are accepted, and their handshakes made, side by side.
pub struct Incoming {
    accepted: tokio::sync::mpsc::Receiver<(Stream, SocketAddr)>,
    local: SocketAddr,
}

impl Incoming {
    pub fn new(listener: TcpListener, tls: Option<ServerTls>) -> io::Result<Self> {
        let local = listener.local_addr()?;
        let (sender, accepted) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let (stream, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if sender.is_closed() {
                    return;
                }
                let (sender, tls) = (sender.clone(), tls.clone());
                tokio::spawn(async move {
                    if let Some(stream) = secured(stream, tls.as_ref()).await {
                        let _ = sender.send((stream, peer)).await;
                    }
                });
            }
        });
        Ok(Incoming { accepted, local })
    }
}

impl axum::serve::Listener for Incoming {
    type Io = Stream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Stream, SocketAddr) {
        match self.accepted.recv().await {
            Some(accepted) => accepted,
            // The acceptor ends only with the listener: nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}
