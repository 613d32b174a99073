//! Qdrant (`adapter = "qdrant"`): points stamped in their payload, reads narrowed with a filter
//! Qdrant evaluates and decided again, purges by stamp in every collection.

pub mod adapter;
pub(crate) mod connector;
pub(crate) mod route;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use hyper::Response;
use serde::Deserialize;

use super::{Kind, RouteStore, Settings};
use crate::config::ErasureConfig;
use crate::data::error::DataError;
use crate::data::forward::{Route, Upstreams};
use crate::data::{Body, RequestContext, Upstream, whole};
use crate::erasure::Connector;

pub const KIND: Kind = Kind::of::<QdrantSettings>("qdrant");

/// A Qdrant route's own settings (none yet).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QdrantSettings {}

impl Settings for QdrantSettings {
    fn store(self) -> Result<Arc<dyn RouteStore>, Vec<String>> {
        Ok(Arc::new(Qdrant))
    }
}

#[derive(Debug)]
pub struct Qdrant;

#[async_trait]
impl RouteStore for Qdrant {
    fn kind(&self) -> &'static str {
        KIND.name
    }

    async fn handle(
        &self,
        upstream: &Upstream<'_>,
        ctx: &RequestContext,
        path: &str,
        body: Bytes,
    ) -> Result<Response<Body>, DataError> {
        route::handle(upstream, ctx, path, body).await.map(whole)
    }

    fn connector(
        &self,
        route: Route,
        upstreams: Arc<Upstreams>,
        _erasure: &ErasureConfig,
    ) -> Arc<dyn Connector> {
        Arc::new(connector::QdrantConnector::new(route, upstreams))
    }
}
