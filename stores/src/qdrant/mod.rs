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

use super::namespace::Namespace;
use super::{Kind, Settings};
use crate::config::ErasureConfig;
use crate::data::error::DataError;
use crate::data::forward::{Route, Upstreams};
use crate::data::route::Isolation;
use crate::data::route::{HttpRoute, RouteStore, Serving};
use crate::data::{Body, RequestContext, Upstream, whole};
use crate::purge::Connector;

pub const KIND: Kind = Kind::of::<QdrantSettings>("qdrant");

/// A Qdrant route's own settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QdrantSettings {
    /// The payload key that names a point's subject, for clients that keep it there and cannot
    /// send Lethe's headers (Mem0's `user_id`). A token bound to a subject still decides; a
    /// payload naming another is `scope_violation`.
    pub subject_field: Option<String>,
    /// What a purge does with the snapshots Qdrant holds (they were taken before it, so they
    /// hold the subject): `keep` them, each a remaining copy until its creation plus the
    /// target's `[[erasure.backups]]` retention, or `delete` them (every snapshot of a
    /// collection that held the subject, and every full-storage snapshot).
    #[serde(default)]
    pub snapshots: Snapshots,
    /// The payload keys holding a point's text (Mem0's `data`): after a purge, each is searched
    /// for the `[erasure] probes` built from the subject's keys; a point found that is the
    /// subject's or no one's fails verification.
    #[serde(default)]
    pub text_fields: Vec<String>,
    /// `collection_per_tenant`: each tenant has collections (and aliases) of its own, under
    /// physical names of its namespace (see `stores::namespace`); `shared` (the default): one
    /// collection for every tenant that names it.
    #[serde(default)]
    pub isolation: Isolation,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Snapshots {
    #[default]
    Keep,
    Delete,
}

/// A payload key of the app's own that Lethe (a top-level key) and Qdrant (a path: the erasure's
/// probes filter on `text_fields`) read alike: letters, digits, `_` and `-`, not `lethe_*`.
fn app_key(field: &str) -> bool {
    adapter::key_path::is_plain_key(field) && !field.starts_with("lethe_")
}

impl Settings for QdrantSettings {
    fn store(self) -> Result<Arc<dyn RouteStore>, Vec<String>> {
        if let Some(field) = &self.subject_field
            && !app_key(field)
        {
            return Err(vec![format!(
                "subject_field {field:?}: name a payload key of the app's own (letters, digits, '_' and '-'; not lethe_*)"
            )]);
        }
        if let Some(field) = self.text_fields.iter().find(|f| !app_key(f)) {
            return Err(vec![format!(
                "text_fields {field:?}: name a payload key of the app's own (letters, digits, '_' and '-'; not lethe_*)"
            )]);
        }
        Ok(Arc::new(Qdrant {
            subject_field: self.subject_field,
            snapshots: self.snapshots,
            text_fields: self.text_fields,
            isolation: self.isolation,
        }))
    }
}

#[derive(Debug)]
pub struct Qdrant {
    subject_field: Option<String>,
    snapshots: Snapshots,
    text_fields: Vec<String>,
    isolation: Isolation,
}

impl RouteStore for Qdrant {
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
        let target = format!("{}:{}", KIND.name, route.name);
        let backups = erasure
            .backups
            .iter()
            .find(|b| b.target == target)
            .map(|b| b.retention);
        Arc::new(connector::QdrantConnector::new(
            route,
            upstreams,
            connector::SnapshotRule {
                policy: self.snapshots,
                retention: backups,
                target,
            },
            connector::Probe {
                fields: self.text_fields.clone(),
                texts: erasure.probes.clone(),
            },
        ))
    }
}

#[async_trait]
impl HttpRoute for Qdrant {
    async fn handle(
        &self,
        upstream: &Upstream<'_>,
        ctx: &RequestContext,
        path: &str,
        body: Bytes,
    ) -> Result<Response<Body>, DataError> {
        let fields = route::Fields {
            subject: self.subject_field.as_deref(),
            text: &self.text_fields,
        };
        if self.isolation == Isolation::Shared {
            return route::handle(upstream, ctx, path, body, fields)
                .await
                .map(whole);
        }
        // The route sees the caller's physical names only; the client, its own names only.
        let namespace = Namespace::of(ctx.tenant());
        let (physical, mapped) =
            adapter::isolate::request(&upstream.parts.method, path, &body, &namespace)?;
        let body = mapped.map_or(body, Bytes::from);
        let answer = route::handle(upstream, ctx, &physical, body, fields).await?;
        let answer = super::rewritten(answer, |success, bytes| {
            adapter::isolate::answer(&upstream.parts.method, path, success, bytes, &namespace)
        })
        .await;
        Ok(whole(answer))
    }
}
