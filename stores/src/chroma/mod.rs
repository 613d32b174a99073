//! Chroma (`adapter = "chroma"`): records stamped in their metadata, reads narrowed with a
//! `where` and decided again, purges by stamp in every collection.

pub mod adapter;
pub(crate) mod connector;
pub(crate) mod route;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use serde::Deserialize;

use super::namespace::Namespace;
use super::{Kind, Settings};
use crate::config::ErasureConfig;
use crate::data::error::DataError;
use crate::data::forward::{Route, Upstreams};
use crate::data::route::Isolation;
use crate::data::route::{HttpRoute, RouteStore, Serving};
use crate::data::{Body, RequestContext, Upstream, whole};
use crate::purge::Connector;

pub const KIND: Kind = Kind::of::<ChromaSettings>("chroma");

/// A Chroma route's own settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChromaSettings {
    /// The Chroma tenants whose every database an erasure searches (Chroma cannot list its
    /// tenants). Default `["default_tenant"]`.
    #[serde(default = "default_tenants")]
    pub chroma_tenants: Vec<String>,
    /// `collection_per_tenant`: each tenant has databases of its own (its `default_database`
    /// made on first use) in the first of `chroma_tenants`, so its collections' names, lists and
    /// counts are its own, and a collection id is checked to be one of its before any request
    /// names it; `shared` (the default): one collection for every tenant that names it.
    #[serde(default)]
    pub isolation: Isolation,
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
            isolation: self.isolation,
            made: moka::sync::Cache::new(100_000),
            owned: moka::sync::Cache::new(1_000_000),
        }))
    }
}

#[derive(Debug)]
pub struct Chroma {
    tenants: Vec<String>,
    isolation: Isolation,
    /// Physical databases known to exist.
    made: moka::sync::Cache<String, ()>,
    /// Collection ids known to be in a physical database (a collection never moves).
    owned: moka::sync::Cache<(String, String), ()>,
}

impl Chroma {
    /// A tenant's `default_database`, made on its first use (two replicas racing both succeed).
    async fn ensure_database(
        &self,
        upstream: &Upstream<'_>,
        home: &str,
        database: &str,
    ) -> Result<(), DataError> {
        if self.made.contains_key(database) {
            return Ok(());
        }
        let body = serde_json::to_vec(&serde_json::json!({ "name": database })).unwrap_or_default();
        let answer = upstream
            .send_query(
                hyper::Method::POST,
                &format!("/api/v2/tenants/{home}/databases"),
                None,
                Bytes::from(body),
            )
            .await?;
        if answer.is_success() || answer.status == hyper::StatusCode::CONFLICT {
            self.made.insert(database.to_owned(), ());
            Ok(())
        } else {
            Err(DataError::upstream_unavailable(
                "the tenant's Chroma database could not be made",
            ))
        }
    }

    /// Whether a collection id is one of a physical database's, as that database itself says:
    /// `None` when it is, else Chroma's own answer that it is not there.
    async fn foreign(
        &self,
        upstream: &Upstream<'_>,
        home: &str,
        database: &str,
        id: &str,
    ) -> Result<Option<crate::data::forward::Answer>, DataError> {
        let key = (database.to_owned(), id.to_owned());
        if self.owned.contains_key(&key) {
            return Ok(None);
        }
        let answer = upstream
            .send_query(
                hyper::Method::GET,
                &format!("/api/v2/tenants/{home}/databases/{database}/collections/by-id/{id}"),
                None,
                Bytes::new(),
            )
            .await?;
        if answer.is_success() {
            self.owned.insert(key, ());
            Ok(None)
        } else {
            Ok(Some(answer))
        }
    }

    /// A request of a tenant whose collections are its own.
    async fn isolated(
        &self,
        upstream: &Upstream<'_>,
        ctx: &RequestContext,
        path: &str,
        body: Bytes,
    ) -> Result<Response<Full<Bytes>>, DataError> {
        use adapter::isolate::{self, DEFAULT_DATABASE, Shape};
        let namespace = Namespace::of(ctx.tenant());
        let home = self
            .tenants
            .first()
            .map_or("default_tenant", String::as_str);
        let parts = upstream.parts;
        let isolated = isolate::request(&parts.method, path, &body, &namespace, home)?;
        let query = parts.uri.query();
        // Nothing is made or looked up for a request that will be refused.
        if let Some(refused) =
            route::refusal(&adapter::classify(&parts.method, &isolated.path), ctx)
        {
            return Err(refused);
        }
        let answer = match &isolated.database {
            Some((logical, physical)) => {
                if logical == DEFAULT_DATABASE {
                    self.ensure_database(upstream, home, physical).await?;
                }
                match &isolated.check_id {
                    Some(id) => self.foreign(upstream, home, physical, id).await?,
                    None => None,
                }
            }
            None => None,
        };
        let response = match answer {
            // Another tenant's collection is one that does not exist.
            Some(not_here) => not_here.passed_on(),
            // Chroma pages the list of every tenant's databases: Lethe pages the caller's.
            None if isolated.shape == Shape::Databases => upstream
                .send_query(parts.method.clone(), &isolated.path, None, Bytes::new())
                .await?
                .passed_on(),
            None => {
                let body = isolated.body.clone().map_or(body, Bytes::from);
                route::handle(upstream, ctx, &isolated.path, body).await?
            }
        };
        if let Some((_, physical)) = &isolated.database
            && isolated.drops_database
            && response.status().is_success()
        {
            // Made again at its next use, if it is the default database.
            self.made.invalidate(physical);
        }
        Ok(super::rewritten(response, |success, bytes| {
            isolate::answer(&isolated, success, bytes, &namespace, query)
        })
        .await)
    }
}

impl RouteStore for Chroma {
    fn kind(&self) -> &'static str {
        KIND.name
    }

    fn serving(&self) -> Serving<'_> {
        Serving::Http(self)
    }

    fn isolation(&self) -> Isolation {
        self.isolation
    }

    fn connector(
        &self,
        route: Route,
        upstreams: Arc<Upstreams>,
        erasure: &ErasureConfig,
        _audit_key: &Arc<[u8]>,
    ) -> Arc<dyn Connector> {
        Arc::new(connector::ChromaConnector::new(
            route,
            upstreams,
            self.tenants.clone(),
            erasure.probes.clone(),
        ))
    }
}

#[async_trait]
impl HttpRoute for Chroma {
    async fn handle(
        &self,
        upstream: &Upstream<'_>,
        ctx: &RequestContext,
        path: &str,
        body: Bytes,
    ) -> Result<Response<Body>, DataError> {
        match self.isolation {
            Isolation::Shared => route::handle(upstream, ctx, path, body).await.map(whole),
            Isolation::CollectionPerTenant => {
                self.isolated(upstream, ctx, path, body).await.map(whole)
            }
        }
    }
}
