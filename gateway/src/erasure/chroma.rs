//! Purging a subject from Chroma: by the stamp in every collection, and by the ids lineage holds.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use hyper::{HeaderMap, Method};
use serde_json::{Value, json};

use super::{Connector, PurgeReport};
use crate::adapters::stamp::{SUBJECT, TENANT};
use crate::data::forward::{Route, Upstreams};

const DATABASE: &str = "/api/v2/tenants/default_tenant/databases/default_database";

/// Chroma keeps deleted records (text, metadata, vectors) in its log and HNSW files until it
/// compacts; there is no command that removes them sooner.
const PHYSICAL: &str = "pending: Chroma keeps deleted records in its write-ahead log and HNSW index files until compaction";

pub struct ChromaConnector {
    route: Route,
    upstreams: Arc<Upstreams>,
}

impl ChromaConnector {
    pub fn new(route: Route, upstreams: Arc<Upstreams>) -> Self {
        ChromaConnector { route, upstreams }
    }

    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Result<Value, String> {
        let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let answer = self
            .upstreams
            .send(&self.route, method, path, None, &HeaderMap::new(), body)
            .await
            .map_err(|e| format!("{}: {}", self.route.name, e.message))?;
        if !answer.is_success() {
            return Err(format!(
                "{} answered {} for {path}",
                self.route.name, answer.status
            ));
        }
        serde_json::from_slice(&answer.body)
            .map_err(|_| format!("{} answered something other than JSON", self.route.name))
    }

    /// The ids in `collection` whose stamp names one of `keys`.
    async fn stamped(
        &self,
        collection: &str,
        tenant: &str,
        keys: &[String],
    ) -> Result<Vec<String>, String> {
        let filter = json!({"$and": [{ TENANT: { "$eq": tenant } }, { SUBJECT: { "$in": keys } }]});
        let answer = self
            .call(
                Method::POST,
                &format!("{DATABASE}/collections/{collection}/get"),
                Some(json!({"where": filter, "include": []})),
            )
            .await?;
        Ok(ids(&answer))
    }

    /// Which of `ids` still exist in `collection`.
    async fn present(
        &self,
        collection: &str,
        ids_wanted: &[String],
    ) -> Result<Vec<String>, String> {
        if ids_wanted.is_empty() {
            return Ok(Vec::new());
        }
        let answer = self
            .call(
                Method::POST,
                &format!("{DATABASE}/collections/{collection}/get"),
                Some(json!({"ids": ids_wanted, "include": []})),
            )
            .await?;
        Ok(ids(&answer))
    }
}

fn ids(answer: &Value) -> Vec<String> {
    answer
        .get("ids")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[async_trait]
impl Connector for ChromaConnector {
    async fn purge(
        &self,
        tenant: &str,
        keys: &[String],
        lineage: &[(String, String)],
    ) -> Result<PurgeReport, String> {
        let collections = self
            .call(Method::GET, &format!("{DATABASE}/collections"), None)
            .await?;
        let collections: Vec<String> = collections
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|c| c.get("id")?.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let mut report = PurgeReport {
            before: 0,
            deleted: 0,
            remaining: 0,
            physical: PHYSICAL.to_owned(),
        };
        for collection in &collections {
            let known: Vec<String> = lineage
                .iter()
                .filter(|(c, _)| c == collection)
                .map(|(_, id)| id.clone())
                .collect();
            let mut doomed = self.stamped(collection, tenant, keys).await?;
            for id in self.present(collection, &known).await? {
                if !doomed.contains(&id) {
                    doomed.push(id);
                }
            }
            report.before += doomed.len() as u64;
            if !doomed.is_empty() {
                report.deleted += self.delete_items(collection, &doomed).await?;
            }
            let mut left = self.stamped(collection, tenant, keys).await?;
            left.extend(self.present(collection, &known).await?);
            left.sort();
            left.dedup();
            report.remaining += left.len() as u64;
        }
        Ok(report)
    }

    /// Deletes `ids` from `collection`; answers how many Chroma deleted.
    async fn delete_items(&self, collection: &str, ids: &[String]) -> Result<u64, String> {
        let answer = self
            .call(
                Method::POST,
                &format!("{DATABASE}/collections/{collection}/delete"),
                Some(json!({"ids": ids})),
            )
            .await?;
        Ok(answer.get("deleted").and_then(Value::as_u64).unwrap_or(0))
    }
}
