//! Purging a subject's objects from an OpenAI-compatible provider: every response, stored chat
//! completion, conversation, conversation item and file lineage records as the subject's is
//! deleted upstream and checked gone (`GET` answers 404). The provider keeps copies for its own
//! retention window (abuse monitoring); the certificate gives that window's end.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::TimeDelta;
use hyper::{Method, StatusCode};

use crate::data::forward::{Route, Upstreams};
use crate::http::StoreHttp;
use crate::openai::adapter::object_path;
use crate::purge::{Connector, ConnectorError, Copy, Physical, PurgeReport, Subjects};
use crate::state::ExpiredItem;

pub struct OpenAiConnector {
    http: StoreHttp,
    /// How long the provider keeps copies after deleting them.
    window: TimeDelta,
}

impl OpenAiConnector {
    pub fn new(route: Route, upstreams: Arc<Upstreams>, window: TimeDelta) -> Self {
        OpenAiConnector {
            http: StoreHttp::new(route, upstreams),
            window,
        }
    }

    /// The status of a call: a success, or 404 (gone); anything else is an error.
    async fn status(&self, method: Method, path: &str) -> Result<StatusCode, ConnectorError> {
        Ok(self.http.call(method, path, None, None).await?.0)
    }

    async fn exists(&self, path: &str) -> Result<bool, ConnectorError> {
        Ok(self.status(Method::GET, path).await?.is_success())
    }
}

/// The provider's paths of the objects lineage names, items first: a conversation's deletion
/// takes its items with it.
fn paths_of(lineage: &[(String, String)]) -> Vec<String> {
    let mut paths: Vec<String> = lineage
        .iter()
        .filter_map(|(collection, id)| object_path(collection, id))
        .collect();
    paths.sort_by_key(|p| !p.contains("/items/"));
    paths
}

#[async_trait]
impl Connector for OpenAiConnector {
    async fn purge(
        &self,
        _subjects: &Subjects,
        lineage: &[(String, String)],
    ) -> Result<PurgeReport, ConnectorError> {
        let paths = paths_of(lineage);
        // Every request of the subject left before the flip: none is kept past this.
        let why = format!(
            "the provider keeps what it was sent for its retention window of {} days, deleted or not",
            self.window.num_days()
        );
        let kept = Physical::default().with(Copy::until(
            "the provider's retention copies (abuse monitoring)",
            "the requests sent and the answers given for the subject",
            &why,
            crate::now() + self.window,
        ));
        let mut report = PurgeReport::starting(kept, false);
        for path in &paths {
            if self.exists(path).await? {
                report.before += 1;
                if self.status(Method::DELETE, path).await?.is_success() {
                    report.deleted += 1;
                }
            }
        }
        for path in &paths {
            if self.exists(path).await? {
                report.remaining += 1;
            }
        }
        Ok(report)
    }

    /// The stored objects lineage names that the provider still has (the provider is searched
    /// by no other key).
    async fn count(
        &self,
        _subjects: &Subjects,
        lineage: &[(String, String)],
    ) -> Result<u64, ConnectorError> {
        let mut held = 0;
        for path in &paths_of(lineage) {
            if self.exists(path).await? {
                held += 1;
            }
        }
        Ok(held)
    }

    async fn delete_items(
        &self,
        collection: &str,
        items: &[ExpiredItem],
    ) -> Result<u64, ConnectorError> {
        let mut deleted = 0;
        for id in items.iter().map(|i| &i.item_id) {
            if let Some(path) = object_path(collection, id)
                && self.status(Method::DELETE, &path).await?.is_success()
            {
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    async fn held_items(
        &self,
        collection: &str,
        items: &[ExpiredItem],
    ) -> Result<u64, ConnectorError> {
        let mut held = 0;
        for id in items.iter().map(|i| &i.item_id) {
            if let Some(path) = object_path(collection, id) {
                held += u64::from(self.exists(&path).await?);
            }
        }
        Ok(held)
    }
}
