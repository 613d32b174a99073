//! OpenAI-compatible providers (`adapter = "openai"`): every request decided before it leaves,
//! what the provider keeps recorded and deleted on erasure; the provider's own retention window
//! is the certificate's expiry of its copies.

pub mod adapter;
pub(crate) mod connector;
pub(crate) mod route;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use hyper::Response;
use lethe_policy::MaxAge;
use serde::Deserialize;

use super::{Kind, Settings};
use crate::config::ErasureConfig;
use crate::data::error::DataError;
use crate::data::forward::{Route, Upstreams};
use crate::data::route::{HttpRoute, RouteStore, Serving};
use crate::data::{Body, RequestContext, Upstream};
use crate::purge::Connector;

pub const KIND: Kind = Kind::of::<OpenAiSettings>("openai");

/// A provider route's own settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenAiSettings {
    /// How long the provider keeps copies of what it is sent (abuse monitoring, for example 30
    /// days), even after they are deleted. Default 30d.
    pub retention_window: Option<MaxAge>,
}

impl Settings for OpenAiSettings {
    fn store(self) -> Result<Arc<dyn RouteStore>, Vec<String>> {
        let window = match self.retention_window {
            Some(window) => window,
            None => MaxAge::from_seconds(30 * 86_400).map_err(|e| vec![e.to_string()])?,
        };
        Ok(Arc::new(OpenAi { window }))
    }
}

#[derive(Debug)]
pub struct OpenAi {
    window: MaxAge,
}

impl RouteStore for OpenAi {
    fn kind(&self) -> &'static str {
        KIND.name
    }

    fn serving(&self) -> Serving<'_> {
        Serving::Http(self)
    }

    fn copies_kept_for(&self) -> Option<MaxAge> {
        Some(self.window)
    }

    fn connector(
        &self,
        route: Route,
        upstreams: Arc<Upstreams>,
        _erasure: &ErasureConfig,
        _audit_key: &Arc<[u8]>,
    ) -> Arc<dyn Connector> {
        Arc::new(connector::OpenAiConnector::new(
            route,
            upstreams,
            self.window.as_delta(),
        ))
    }
}

#[async_trait]
impl HttpRoute for OpenAi {
    /// Where a provider keeps objects is the route credential's business: an object stored in
    /// another organisation or project would be one the purge cannot see.
    fn scrubbed_headers(&self) -> &'static [&'static str] {
        &["openai-organization", "openai-project"]
    }

    async fn handle(
        &self,
        upstream: &Upstream<'_>,
        ctx: &RequestContext,
        path: &str,
        body: Bytes,
    ) -> Result<Response<Body>, DataError> {
        route::handle(self.window.as_delta(), upstream, ctx, path, body).await
    }
}
