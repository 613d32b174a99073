//! What a route's store must do for the data plane: serve the route's clients in its protocol,
//! purge the store, and tell the relay and the forwarder what is particular to that protocol.
//! The stores (`stores/<kind>/`) implement it; the data plane knows no store by name.
//!
//! A route is reached one of two ways, as its store's protocol needs ([`Serving`]): HTTP under
//! the route's `prefix` on the data plane's listener, each request handed to the store decided
//! by nothing yet but the caller's token ([`HttpRoute`]); or the store's own protocol on a
//! listener of the route's own (`listen`), each client connection handed over whole
//! ([`ConnectionRoute`]), for stores such as Redis that speak no HTTP.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use hyper::Response;
use serde::Deserialize;

use super::error::DataError;
use super::forward::{Route, Upstreams};
use super::{Body, DataState, RequestContext, Upstream};
use crate::config::ErasureConfig;
use crate::purge::Connector;

/// How a route's collections are shared among tenants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// One collection for every tenant that names it; records are filtered by their stamps.
    #[default]
    Shared,
    /// A collection of its own for every tenant, under a physical name of the tenant's.
    CollectionPerTenant,
}

/// How a route's clients reach its store.
pub enum Serving<'s> {
    /// HTTP on the data plane's listener, under the route's `prefix`.
    Http(&'s dyn HttpRoute),
    /// The store's own protocol on a listener of the route's own (`listen`).
    Connections(&'s dyn ConnectionRoute),
}

impl Serving<'_> {
    /// The route key that says where clients reach it, for messages.
    pub fn key(&self) -> &'static str {
        match self {
            Serving::Http(_) => "prefix",
            Serving::Connections(_) => "listen",
        }
    }
}

/// What a configured route's store does: serve the route's clients, purge the store, and say
/// what the certificate needs to know of it.
pub trait RouteStore: Send + Sync + fmt::Debug {
    /// Its kind's name.
    fn kind(&self) -> &'static str;

    /// How its clients reach it, and what serves them.
    fn serving(&self) -> Serving<'_>;

    /// What is wrong with `upstream` for this store (an HTTP store takes `http://` and
    /// `https://` URLs).
    fn upstream_problem(&self, upstream: &str) -> Option<String> {
        let scheme = upstream
            .parse::<hyper::Uri>()
            .ok()
            .and_then(|uri| uri.scheme_str().map(str::to_owned));
        scheme
            .filter(|s| !["http", "https"].contains(&s.as_str()))
            .map(|_| format!("upstream {upstream:?}: {} speaks http, https", self.kind()))
    }

    /// How long the store keeps copies of what it was sent after deleting them (a provider's
    /// retention window): the certificate gives it as their expiry unless a backup retention is
    /// configured for the target.
    fn copies_kept_for(&self) -> Option<lethe_policy::MaxAge> {
        None
    }

    /// Whether its tenants share collections (see `stores::namespace`): routes to one upstream must
    /// agree, or a shared route would list every tenant's physical names.
    fn isolation(&self) -> Isolation {
        Isolation::Shared
    }

    /// The connector that purges the store (and deletes expired items for the sweeper);
    /// `audit_key` keys subject references (stores that hold owners pseudonymised).
    fn connector(
        &self,
        route: Route,
        upstreams: Arc<Upstreams>,
        erasure: &ErasureConfig,
        audit_key: &Arc<[u8]>,
    ) -> Arc<dyn Connector>;
}

/// A store spoken to in HTTP: each request of the route, decided and answered.
#[async_trait]
pub trait HttpRoute: Send + Sync {
    /// Client headers of its protocol that never reach the upstream (beside the credentials and
    /// hop-by-hop headers every route drops).
    fn scrubbed_headers(&self) -> &'static [&'static str] {
        &[]
    }

    /// The header its clients send their key in when they cannot send `Authorization: Bearer`
    /// (Azure's `api-key`): Lethe's token is read from it.
    fn token_header(&self) -> Option<&'static str> {
        None
    }

    /// Whether it reads percent-encoded names in its paths itself, to one canonical name each
    /// (Azure's SDK encodes a document key whole): then Lethe lets `%` through to it.
    fn decodes_path(&self) -> bool {
        false
    }

    /// One data-plane request (`path` is what follows the route's prefix), decided and
    /// answered.
    async fn handle(
        &self,
        upstream: &Upstream<'_>,
        ctx: &RequestContext,
        path: &str,
        body: Bytes,
    ) -> Result<Response<Body>, DataError>;
}

/// A store spoken to in a protocol of its own, on the route's own listener: it authenticates
/// the client, decides every command and answers it, in that protocol.
#[async_trait]
pub trait ConnectionRoute: Send + Sync {
    /// Serves one client connection of `route` (from `peer`) until either side closes it,
    /// `timeouts` run out, or `stopping` turns true, when it ends at the next command boundary.
    async fn serve(
        &self,
        route: &Route,
        state: &Arc<DataState>,
        connection: tokio::net::TcpStream,
        peer: SocketAddr,
        timeouts: Timeouts,
        stopping: tokio::sync::watch::Receiver<bool>,
    );

    /// What a client the listener cannot admit is told, in the route's protocol, before its
    /// connection is closed.
    fn refusal(&self, why: &str) -> Vec<u8>;
}

/// How long a connection of a route with a listener of its own may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// To authenticate, from the moment it is accepted.
    pub authenticate: Duration,
    /// To send its next command, once authenticated (not while it subscribes or waits).
    pub idle: Duration,
    /// To send the rest of a command it began.
    pub command: Duration,
}
