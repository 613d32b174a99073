//! Purging a subject from Qdrant: by the stamp in every collection, and by the ids lineage holds
//! that Qdrant does not hold under another owner's stamp; deletions are counted again in Qdrant.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDateTime, Utc};
use hyper::Method;
use lethe_policy::MaxAge;
use serde_json::{Value, json};

use crate::data::forward::{Route, Upstreams};
use crate::http::StoreHttp;
use crate::kit::stamp::{SUBJECT, TENANT, may_be_subjects};
use crate::purge::{Connector, ConnectorError, Copy, Physical, PurgeReport, Subjects};
use crate::qdrant::Snapshots;
use crate::qdrant::adapter::{PointId, stamped_by};
use crate::state::ExpiredItem;

const PAGE: usize = 1000;

/// How long a purge waits for Qdrant's optimizer after lowering its thresholds.
const OPTIMIZE_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// What Qdrant keeps of deleted points, as measured on 1.16.3: their payloads stay in the
/// segments until the optimizer vacuums them (only a segment of at least
/// `vacuum_min_vector_number` points, never fewer than 100, whose deleted share passes
/// `deleted_threshold`), and in the collection's write-ahead log until its segment is retired.
/// The purge runs the optimizer with the least thresholds; smaller segments stay as they are.
fn physical() -> Physical {
    Physical::default()
        .with(Copy::unknown(
            "collections/<collection>/<shard>/segments (payload and vector storage) of fewer than 100 points",
            "the deleted points' payloads and vectors",
            "Qdrant marks deleted points and keeps their bytes until its optimizer vacuums the segment; the purge's optimizer run (see done) cannot vacuum a segment under 100 points",
            "such a segment is rewritten only when later writes grow it past the threshold or merge it",
        ))
        .with(Copy::unknown(
            "collections/<collection>/<shard>/wal",
            "the upserts of the deleted points",
            "the write-ahead log keeps every operation until its segment is retired",
            "retirement depends on later writes filling the log (wal_capacity_mb, wal_retain_closed)",
        ))
}

/// What a purge does with Qdrant's snapshots, and how long the target's backups are kept.
#[derive(Debug, Clone)]
pub struct SnapshotRule {
    pub policy: Snapshots,
    pub retention: Option<MaxAge>,
    /// `qdrant:<route>`, named where no retention is configured.
    pub target: String,
}

/// The lexical verification probe: the `texts` (with `{subject}` and `{tenant}`) matched in
/// the payload `fields` that hold the points' text.
#[derive(Debug, Clone)]
pub struct Probe {
    pub fields: Vec<String>,
    pub texts: Vec<String>,
}

pub struct QdrantConnector {
    http: StoreHttp,
    snapshots: SnapshotRule,
    probe: Probe,
}

impl QdrantConnector {
    pub fn new(
        route: Route,
        upstreams: Arc<Upstreams>,
        snapshots: SnapshotRule,
        probe: Probe,
    ) -> Self {
        QdrantConnector {
            http: StoreHttp::new(route, upstreams),
            snapshots,
            probe,
        }
    }

    /// Whether the probe can run: texts to search for, and fields to search them in.
    fn probes(&self) -> bool {
        !self.probe.fields.is_empty() && !self.probe.texts.is_empty()
    }

    /// Points whose text fields contain a probe built from one of the subject's keys and that
    /// are the subject's (stamped so) or no one's (a person must look). Qdrant matches `text`
    /// by its full-text index where the field has one, as a substring otherwise.
    async fn probe_hits(
        &self,
        collection: &str,
        subjects: &Subjects,
    ) -> Result<u64, ConnectorError> {
        let tenant = subjects.tenant();
        let mut hits = BTreeSet::new();
        for text in subjects.probes(&self.probe.texts) {
            for field in &self.probe.fields {
                let filter = json!({ "must": [{ "key": field, "match": { "text": text } }] });
                for p in self.scroll(collection, filter, json!(true)).await? {
                    if may_be_subjects(&p["payload"], tenant, |s| subjects.include(s)) {
                        hits.extend(PointId::parse(&p["id"]));
                    }
                }
            }
        }
        Ok(hits.len() as u64)
    }

    /// The snapshots under `path` (`/collections/{c}/snapshots`, or `/snapshots` for the
    /// whole storage): each one's name and, if Qdrant gave it, its creation time.
    async fn snapshots_at(
        &self,
        path: &str,
    ) -> Result<Vec<(String, Option<DateTime<Utc>>)>, ConnectorError> {
        let answer = self.http.json(Method::GET, path, None).await?;
        Ok(answer["result"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| {
                let name = s["name"].as_str()?.to_owned();
                let created = s["creation_time"].as_str().and_then(|t| {
                    NaiveDateTime::parse_from_str(t, "%Y-%m-%dT%H:%M:%S%.f")
                        .ok()
                        .map(|t| t.and_utc())
                });
                Some((name, created))
            })
            .collect())
    }

    /// Every snapshot taken before the purge holds the subject as it was: deleted when the
    /// route says so, else a remaining copy until its creation plus the backup retention.
    async fn snapshots(
        &self,
        path: &str,
        what: &str,
        physical: &mut Physical,
    ) -> Result<(), ConnectorError> {
        for (name, created) in self.snapshots_at(path).await? {
            let place = format!("{what} snapshot {name}");
            if self.snapshots.policy == Snapshots::Delete {
                let deleted = self
                    .http
                    .call(
                        Method::DELETE,
                        &format!("{path}/{name}"),
                        Some("wait=true"),
                        None,
                    )
                    .await;
                match deleted {
                    Ok(_) => physical.done.push(format!("{place} deleted")),
                    Err(e) => physical.remaining.push(Copy::unknown(
                        &place,
                        "the subject's points as of the snapshot",
                        "taken before the purge",
                        &format!("the route deletes snapshots, but Qdrant refused this one ({e})"),
                    )),
                }
                continue;
            }
            let holds = "the subject's points as of the snapshot";
            let why = "taken before the purge; the route keeps snapshots (snapshots = \"keep\")";
            physical.remaining.push(match (created, self.snapshots.retention) {
                (Some(created), Some(retention)) => {
                    Copy::until(&place, holds, why, created + retention.as_delta())
                }
                (None, _) => Copy::unknown(&place, holds, why, "Qdrant gave no creation time for it"),
                (_, None) => Copy::unknown(
                    &place,
                    holds,
                    why,
                    &format!(
                        "no backup retention is configured for {} ([[erasure.backups]]); or set snapshots = \"delete\" on the route",
                        self.snapshots.target
                    ),
                ),
            });
        }
        Ok(())
    }

    async fn collections(&self) -> Result<Vec<String>, ConnectorError> {
        let answer = self.http.json(Method::GET, "/collections", None).await?;
        Ok(answer["result"]["collections"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c.get("name")?.as_str().map(str::to_owned))
            .collect())
    }

    /// Every alias's name.
    async fn aliases(&self) -> Result<Vec<String>, ConnectorError> {
        let answer = self.http.json(Method::GET, "/aliases", None).await?;
        Ok(answer["result"]["aliases"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.get("alias_name")?.as_str().map(str::to_owned))
            .collect())
    }

    /// Every point matching `filter`, page by page, with the payload `with_payload` asks for
    /// (`true`, `false` for ids only, or a list of fields).
    async fn scroll(
        &self,
        collection: &str,
        filter: Value,
        with_payload: Value,
    ) -> Result<Vec<Value>, ConnectorError> {
        let path = format!("/collections/{collection}/points/scroll");
        let mut points = Vec::new();
        let mut offset = Value::Null;
        loop {
            let mut body = json!({ "filter": filter, "limit": PAGE, "with_payload": with_payload, "with_vector": false });
            if !offset.is_null() {
                body["offset"] = offset;
            }
            let answer = self.http.json(Method::POST, &path, Some(body)).await?;
            points.extend(
                answer["result"]["points"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
            );
            offset = answer["result"]["next_page_offset"].clone();
            if offset.is_null() {
                return Ok(points);
            }
        }
    }

    /// The ids held under `ids`, each with its payload.
    async fn present(
        &self,
        collection: &str,
        ids: &[PointId],
    ) -> Result<Vec<Value>, ConnectorError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let has =
            json!({ "must": [{ "has_id": ids.iter().map(PointId::to_json).collect::<Vec<_>>() }] });
        self.scroll(collection, has, json!(true)).await
    }

    /// The subjects, with the keys of those known only by reference found again among the
    /// owners the collection's stamps name in the tenant.
    async fn found_again(
        &self,
        collection: &str,
        subjects: &Subjects,
    ) -> Result<Subjects, ConnectorError> {
        if !subjects.any_forgotten() {
            return Ok(subjects.clone());
        }
        let tenant =
            json!({ "must": [{ "key": TENANT, "match": { "value": subjects.tenant() } }] });
        let owners: BTreeSet<String> = self
            .scroll(collection, tenant, json!([SUBJECT]))
            .await?
            .iter()
            .filter_map(|p| p["payload"][SUBJECT].as_str().map(str::to_owned))
            .collect();
        Ok(subjects.found_among(owners.iter().map(String::as_str)))
    }

    /// Everything of the subjects a collection holds: stamped with one of their keys, or known to
    /// lineage and not stamped as another's.
    async fn subjects_points(
        &self,
        collection: &str,
        known: &[PointId],
        subjects: &Subjects,
    ) -> Result<BTreeSet<PointId>, ConnectorError> {
        let mut found = BTreeSet::new();
        let keys = subjects.keys();
        if !keys.is_empty() {
            for p in self
                .scroll(
                    collection,
                    stamped_by(subjects.tenant(), &keys),
                    json!(false),
                )
                .await?
            {
                found.extend(PointId::parse(&p["id"]));
            }
        }
        for p in self.present(collection, known).await? {
            if may_be_subjects(&p["payload"], subjects.tenant(), |s| subjects.include(s)) {
                found.extend(PointId::parse(&p["id"]));
            }
        }
        Ok(found)
    }

    /// The physical step after a collection's points were deleted: the optimizer's vacuum
    /// thresholds are lowered to their least, the optimizations waited for (up to
    /// [`OPTIMIZE_WAIT`]), and the collection's own values put back; what happened is reported
    /// with the segment counts before and after.
    async fn vacuum(&self, collection: &str, physical: &mut Physical) {
        match self.try_vacuum(collection).await {
            Ok(line) => physical.done.push(line),
            Err(e) => physical
                .done
                .push(format!("collection {collection}: optimizer not run ({e})")),
        }
    }

    async fn try_vacuum(&self, collection: &str) -> Result<String, ConnectorError> {
        let path = format!("/collections/{collection}");
        let info = self.http.json(Method::GET, &path, None).await?;
        let optimizer = &info["result"]["config"]["optimizer_config"];
        let previous = json!({ "optimizers_config": {
            "deleted_threshold": optimizer["deleted_threshold"],
            "vacuum_min_vector_number": optimizer["vacuum_min_vector_number"],
        } });
        let before = info["result"]["segments_count"].as_u64().unwrap_or(0);
        let least = json!({ "optimizers_config": { "deleted_threshold": 0.0001, "vacuum_min_vector_number": 100 } });
        self.http.json(Method::PATCH, &path, Some(least)).await?;
        let settled = self.optimized(collection).await;
        // The collection's own thresholds come back whatever happened.
        self.http.json(Method::PATCH, &path, Some(previous)).await?;
        let settled = settled?;
        let after = self.http.json(Method::GET, &path, None).await?["result"]["segments_count"]
            .as_u64()
            .unwrap_or(0);
        Ok(if settled {
            format!(
                "collection {collection}: optimizer run with the least vacuum thresholds, then the collection's own put back ({before} segments before, {after} after; segments under 100 points are never vacuumed)"
            )
        } else {
            format!(
                "collection {collection}: optimizer still running after {} s; the collection's own thresholds put back ({before} segments before, {after} after)",
                OPTIMIZE_WAIT.as_secs()
            )
        })
    }

    /// Whether the collection's optimizations finished within [`OPTIMIZE_WAIT`].
    async fn optimized(&self, collection: &str) -> Result<bool, ConnectorError> {
        let deadline = tokio::time::Instant::now() + OPTIMIZE_WAIT;
        loop {
            let ongoing = self
                .http
                .json(
                    Method::GET,
                    &format!("/collections/{collection}/optimizations"),
                    None,
                )
                .await?;
            let status = self
                .http
                .json(Method::GET, &format!("/collections/{collection}"), None)
                .await?;
            let idle = ongoing["result"]["ongoing"]
                .as_array()
                .is_none_or(Vec::is_empty);
            if idle && status["result"]["status"] == "green" {
                return Ok(true);
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    async fn delete(
        &self,
        collection: &str,
        ids: &BTreeSet<PointId>,
    ) -> Result<(), ConnectorError> {
        let body = json!({ "points": ids.iter().map(PointId::to_json).collect::<Vec<_>>() });
        self.http
            .call(
                Method::POST,
                &format!("/collections/{collection}/points/delete"),
                Some("wait=true"),
                Some(body),
            )
            .await
            .map(|_| ())
    }
}

/// The points lineage holds in the collection.
fn known_in(collection: &str, lineage: &[(String, String)]) -> Vec<PointId> {
    lineage
        .iter()
        .filter(|(c, _)| c == collection)
        .filter_map(|(_, id)| PointId::from_key(id))
        .collect()
}

#[async_trait]
impl Connector for QdrantConnector {
    async fn purge(
        &self,
        subjects: &Subjects,
        lineage: &[(String, String)],
    ) -> Result<PurgeReport, ConnectorError> {
        let mut report = PurgeReport::starting(physical(), self.probes());
        for collection in self.collections().await? {
            let known = known_in(&collection, lineage);
            let subjects = &self.found_again(&collection, subjects).await?;
            let doomed = self.subjects_points(&collection, &known, subjects).await?;
            report.before += doomed.len() as u64;
            if !doomed.is_empty() {
                self.delete(&collection, &doomed).await?;
                self.vacuum(&collection, &mut report.physical).await;
            }
            let left = self.subjects_points(&collection, &known, subjects).await?;
            report.deleted += doomed.difference(&left).count() as u64;
            report.remaining += left.len() as u64;
            if let Some(hits) = report.probe_hits.as_mut() {
                *hits += self.probe_hits(&collection, subjects).await?;
            }
            if !doomed.is_empty() || !known.is_empty() {
                let path = format!("/collections/{collection}/snapshots");
                self.snapshots(
                    &path,
                    &format!("collection {collection}:"),
                    &mut report.physical,
                )
                .await?;
            }
        }
        self.snapshots("/snapshots", "full storage:", &mut report.physical)
            .await?;
        Ok(report)
    }

    async fn count(
        &self,
        subjects: &Subjects,
        lineage: &[(String, String)],
    ) -> Result<u64, ConnectorError> {
        let mut held = 0;
        for collection in self.collections().await? {
            let known = known_in(&collection, lineage);
            let subjects = &self.found_again(&collection, subjects).await?;
            held += self
                .subjects_points(&collection, &known, subjects)
                .await?
                .len() as u64;
        }
        Ok(held)
    }

    /// Deletes the expired items, but not a point Qdrant holds under another owner's stamp than
    /// lineage names: that one is the other owner's.
    async fn delete_items(
        &self,
        collection: &str,
        items: &[ExpiredItem],
    ) -> Result<u64, ConnectorError> {
        let expired = self.owned(collection, items).await?;
        if expired.is_empty() {
            return Ok(0);
        }
        self.delete(collection, &expired).await?;
        let left = self
            .present(collection, &expired.iter().cloned().collect::<Vec<_>>())
            .await?
            .len();
        Ok((expired.len() - left) as u64)
    }

    async fn held_items(
        &self,
        collection: &str,
        items: &[ExpiredItem],
    ) -> Result<u64, ConnectorError> {
        Ok(self.owned(collection, items).await?.len() as u64)
    }
}

impl QdrantConnector {
    /// Of `items`, those the collection holds for the owner lineage names (none when the
    /// collection no longer exists).
    async fn owned(
        &self,
        collection: &str,
        items: &[ExpiredItem],
    ) -> Result<BTreeSet<PointId>, ConnectorError> {
        // Lineage names a point by the name it was written through: a collection, or an alias
        // of one (Qdrant reads either in a point's path).
        if !self.collections().await?.iter().any(|c| c == collection)
            && !self.aliases().await?.iter().any(|a| a == collection)
        {
            return Ok(BTreeSet::new());
        }
        let ids: Vec<PointId> = items
            .iter()
            .filter_map(|i| PointId::from_key(&i.item_id))
            .collect();
        Ok(self
            .present(collection, &ids)
            .await?
            .iter()
            .filter_map(|p| {
                let id = PointId::parse(&p["id"])?;
                items
                    .iter()
                    .any(|i| {
                        i.item_id == id.key()
                            && may_be_subjects(&p["payload"], &i.tenant, |s| s == i.subject)
                    })
                    .then_some(id)
            })
            .collect())
    }
}
