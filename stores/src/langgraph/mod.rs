//! The LangGraph server (`adapter = "langgraph"`): threads decided on their registration, store
//! items under their subject's namespace, purges by registry, stamp and namespace.

pub mod adapter;
pub(crate) mod connector;
pub(crate) mod route;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use hyper::Response;
use serde::Deserialize;

use super::{Kind, Settings};
use crate::config::ErasureConfig;
use crate::data::error::DataError;
use crate::data::forward::{Route, Upstreams};
use crate::data::route::{HttpRoute, RouteStore, Serving};
use crate::data::{Body, RequestContext, Upstream};
use crate::purge::Connector;
use adapter::Namespace;

pub const KIND: Kind = Kind::of::<LangGraphSettings>("langgraph");

/// A LangGraph route's own settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LangGraphSettings {
    /// The namespace every store item of a subject lives under, as literal elements and the
    /// placeholders `{tenant}` and `{subject}` (both required, so that tenants sharing a server
    /// never share a namespace); items may add elements after it. Default
    /// `["{tenant}", "{subject}"]`; an app that keeps memories under `("memories", tenant, user)`
    /// sets `["memories", "{tenant}", "{subject}"]`.
    pub namespace: Option<Vec<String>>,
}

impl Settings for LangGraphSettings {
    fn store(self) -> Result<Arc<dyn RouteStore>, Vec<String>> {
        let namespace = match &self.namespace {
            None => Namespace::default(),
            Some(template) => {
                let once = |name: &str| template.iter().filter(|e| *e == name).count() == 1;
                if !once("{subject}")
                    || !once("{tenant}")
                    || template.iter().any(|e| e.is_empty() || e.contains('.'))
                {
                    return Err(vec![
                        "namespace must name {tenant} and {subject} exactly once each (tenants sharing a server must not share namespaces), and no element may be empty or contain a dot".to_owned(),
                    ]);
                }
                Namespace::from_template(template)
            }
        };
        Ok(Arc::new(LangGraph { namespace }))
    }
}

#[derive(Debug)]
pub struct LangGraph {
    namespace: Namespace,
}

impl RouteStore for LangGraph {
    fn kind(&self) -> &'static str {
        KIND.name
    }

    fn serving(&self) -> Serving<'_> {
        Serving::Http(self)
    }

    fn connector(
        &self,
        route: Route,
        upstreams: Arc<Upstreams>,
        erasure: &ErasureConfig,
        _audit_key: &Arc<[u8]>,
    ) -> Arc<dyn Connector> {
        let probe = connector::Probe {
            queries: erasure.probes.clone(),
            min_score: f64::from(erasure.probe_min_similarity) / 100.0,
        };
        Arc::new(connector::LangGraphConnector::new(
            route,
            upstreams,
            self.namespace.clone(),
            probe,
        ))
    }
}

#[async_trait]
impl HttpRoute for LangGraph {
    async fn handle(
        &self,
        upstream: &Upstream<'_>,
        ctx: &RequestContext,
        path: &str,
        body: Bytes,
    ) -> Result<Response<Body>, DataError> {
        route::handle(&self.namespace, upstream, ctx, path, body).await
    }
}
