//! What a route's store must do for the data plane: serve the route's requests, purge the store,
//! and tell the relay and the forwarder what is particular to its protocol. The stores
//! (`stores/<kind>/`) implement it; the data plane knows no store by name.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use hyper::Response;
use serde::Deserialize;

use super::error::DataError;
use super::forward::{Route, Upstreams};
use super::{Body, RequestContext, Upstream};
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

/// What a configured route's store does: serve the route's requests, purge the store, and say
/// what the certificate needs to know of it.
#[async_trait]
pub trait RouteStore: Send + Sync + fmt::Debug {
    /// Its kind's name.
    fn kind(&self) -> &'static str;

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

    /// Client headers of its protocol that never reach the upstream (beside the credentials and
    /// hop-by-hop headers every route drops).
    fn scrubbed_headers(&self) -> &'static [&'static str] {
        &[]
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

    /// The connector that purges the store (and deletes expired items for the sweeper).
    fn connector(
        &self,
        route: Route,
        upstreams: Arc<Upstreams>,
        erasure: &ErasureConfig,
    ) -> Arc<dyn Connector>;
}
