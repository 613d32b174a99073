//! Azure AI Search (`adapter = "azure_search"`): documents stamped in `lethe_*` fields their
//! index is created with, reads narrowed by an OData filter Azure evaluates and decided again,
//! purges by stamp and by key in batches of at most 1 000 (Azure has no delete by query).

pub mod adapter;
pub(crate) mod connector;
pub mod odata;
pub(crate) mod route;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use hyper::Response;
use serde::Deserialize;

use super::{Kind, Settings};
use crate::config::ErasureConfig;
use crate::data::error::DataError;
use crate::data::forward::{Route, Upstreams};
use crate::data::route::{HttpRoute, RouteStore, Serving};
use crate::data::{Body, RequestContext, Upstream, whole};
use crate::purge::Connector;
use adapter::{IndexInfo, canonical_field, is_stamp_field};

pub const KIND: Kind = Kind::of::<AzureSearchSettings>("azure_search");

/// How long what Lethe read of an index (its key field) is trusted: an index's fields cannot
/// change, but it can be deleted and made again around Lethe.
const INDEX_INFO_TTL: Duration = Duration::from_secs(60);

/// An Azure AI Search route's own settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AzureSearchSettings {
    /// The field naming a document's subject, for clients that keep it there and cannot send
    /// Lethe's headers (the runbook's `user_id`). A token bound to a subject still decides; a
    /// document naming another is `scope_violation`.
    pub subject_field: Option<String>,
    /// The fields holding a document's text: what derivative lineage reads of it, and where the
    /// erasure's lexical probe searches (every searchable field when none is named).
    #[serde(default)]
    pub text_fields: Vec<String>,
}

/// A field of the app's own: a name Azure takes, not `lethe_*`.
fn app_field(field: &str) -> bool {
    canonical_field(field) && !is_stamp_field(field)
}

impl Settings for AzureSearchSettings {
    fn store(self) -> Result<Arc<dyn RouteStore>, Vec<String>> {
        let mut problems = Vec::new();
        for field in self.subject_field.iter().chain(&self.text_fields) {
            if !app_field(field) {
                problems.push(format!(
                    "{field:?}: name a field of the app's own (a letter, then letters, digits and '_'; not lethe_*)"
                ));
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Arc::new(AzureSearch {
            subject_field: self.subject_field,
            text_fields: self.text_fields,
            indexes: moka::sync::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(INDEX_INFO_TTL)
                .build(),
        }))
    }
}

pub struct AzureSearch {
    subject_field: Option<String>,
    text_fields: Vec<String>,
    /// What Lethe read of each index, by name.
    indexes: moka::sync::Cache<String, IndexInfo>,
}

impl std::fmt::Debug for AzureSearch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AzureSearch")
            .field("subject_field", &self.subject_field)
            .field("text_fields", &self.text_fields)
            .finish_non_exhaustive()
    }
}

impl RouteStore for AzureSearch {
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
        Arc::new(connector::AzureSearchConnector::new(
            route,
            upstreams,
            connector::Probe {
                fields: self.text_fields.clone(),
                texts: erasure.probes.clone(),
            },
        ))
    }
}

#[async_trait]
impl HttpRoute for AzureSearch {
    /// The client's `api-key` is its Lethe token; Azure gets the route's own key.
    fn scrubbed_headers(&self) -> &'static [&'static str] {
        &["api-key"]
    }

    fn token_header(&self) -> Option<&'static str> {
        Some("api-key")
    }

    fn decodes_path(&self) -> bool {
        true
    }

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
        route::handle(upstream, ctx, path, body, fields, &self.indexes)
            .await
            .map(whole)
    }
}
