//! Chroma (`adapter = "chroma"`): records stamped in their metadata, reads narrowed with a
//! `where` and decided again, purges by stamp in every collection.

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

pub const KIND: Kind = Kind::of::<ChromaSettings>("chroma");

/// A Chroma route's own settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChromaSettings {
    /// The Chroma tenants whose every database an erasure searches (Chroma cannot list its
    /// tenants). Default `["default_tenant"]`.
    #[serde(default = "default_tenants")]
    pub chroma_tenants: Vec<String>,
}

fn default_tenants() -> Vec<String> {
    vec!["default_tenant".to_owned()]
}

impl Settings for ChromaSettings {
    fn store(self) -> Result<Arc<dyn RouteStore>, Vec<String>> {
        if self.chroma_tenants.is_empty() || self.chroma_tenants.iter().any(String::is_empty) {
            return Err(vec![
                "chroma_tenants: name at least one Chroma tenant, none empty".to_owned(),
            ]);
        }
        Ok(Arc::new(Chroma {
            tenants: self.chroma_tenants,
        }))
    }
}

#[derive(Debug)]
pub struct Chroma {
    tenants: Vec<String>,
}

#[async_trait]
impl RouteStore for Chroma {
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
        erasure: &ErasureConfig,
    ) -> Arc<dyn Connector> {
        Arc::new(connector::ChromaConnector::new(
            route,
            upstreams,
            self.tenants.clone(),
            erasure.probes.clone(),
        ))
    }
}
