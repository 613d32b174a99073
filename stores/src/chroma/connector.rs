//! Purging a subject from Chroma: by the stamp in every collection, and by the ids lineage holds.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use hyper::Method;
use serde_json::{Value, json};

use crate::chroma::adapter::stamped_by;
use crate::data::forward::{Route, Upstreams};
use crate::http::StoreHttp;
use crate::kit::stamp::may_be_subjects;
use crate::kit::stamp::{OWNER, SUBJECT, TENANT, owner, read_stamp};
use crate::purge::{Connector, ConnectorError, Copy, Physical, PurgeReport, Subjects};
use crate::state::ExpiredItem;

/// The most ids one call names: Chroma answers 500 to a `get` naming more than 32 763 ids
/// ("too many SQL variables", measured on 1.5), and smaller calls let the app's own requests in
/// between.
const BATCH: usize = 1000;

/// One collection: the path of its record operations.
struct Place {
    id: String,
    base: String,
}

impl Place {
    fn op(&self, op: &str) -> String {
        format!("{}/{op}", self.base)
    }
}

/// What a single-node Chroma server (1.5) keeps of deleted records, as measured: nothing its
/// HTTP API offers rewrites it. Rebuilding a collection from its live records (delete, create,
/// add) leaves the old collection's segment directory on disk, vectors and all, across restarts;
/// `chroma vacuum`, run by an operator with the server stopped, clears `chroma.sqlite3` but not
/// the HNSW files. No date can be given for any of it.
fn physical() -> Physical {
    Physical::default()
        .with(Copy::unknown(
            "chroma.sqlite3 (free pages)",
            "documents and metadata of the deleted records",
            "SQLite keeps a deleted row's bytes in free pages until it reuses them, and the server never vacuums its database",
            "until an operator runs `chroma vacuum --path <dir>` with the server stopped (measured: it clears them), or later writes reuse the pages",
        ))
        .with(Copy::unknown(
            "chroma.sqlite3 (embeddings_queue, Chroma's write-ahead log)",
            "the records as they were written, vectors included",
            "Chroma purges its log after compaction, on its own schedule",
            "Chroma exposes neither its compaction schedule nor a way to trigger it; `chroma vacuum` with the server stopped prunes it",
        ))
        .with(Copy::unknown(
            "<collection segment>/data_level0.bin (HNSW index)",
            "the deleted records' vectors",
            "the HNSW index marks deleted vectors but keeps their bytes; neither `chroma vacuum` nor rebuilding the collection removes them (a deleted collection's segment directory stays on disk)",
            "the index file is rewritten only if its slots are reused by later additions",
        ))
        .with(Copy::unknown(
            "<collection segment>/index_metadata.pickle (HNSW id map)",
            "the deleted records' ids (which name the subject where the client made them so)",
            "the index keeps the id of each label it marked deleted",
            "the map is rewritten with the index, on Chroma's schedule",
        ))
}

pub struct ChromaConnector {
    http: StoreHttp,
    /// The Chroma tenants whose every database is searched.
    tenants: Vec<String>,
    /// Verification probes: texts with `{subject}` (and `{tenant}`) searched for in every
    /// document after the purge.
    probes: Vec<String>,
}

impl ChromaConnector {
    pub fn new(
        route: Route,
        upstreams: Arc<Upstreams>,
        tenants: Vec<String>,
        probes: Vec<String>,
    ) -> Self {
        ChromaConnector {
            http: StoreHttp::new(route, upstreams),
            tenants,
            probes,
        }
    }

    /// Every collection of every database of the configured Chroma tenants.
    async fn collections(&self) -> Result<Vec<Place>, ConnectorError> {
        let names = |answer: &Value, key: &str| -> Vec<String> {
            answer
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|c| c.get(key)?.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut places = Vec::new();
        for tenant in &self.tenants {
            let tenant_path = format!("/api/v2/tenants/{tenant}/databases");
            let databases = self.call(Method::GET, &tenant_path, None).await?;
            for database in names(&databases, "name") {
                let database_path = format!("{tenant_path}/{database}/collections");
                let collections = self.call(Method::GET, &database_path, None).await?;
                for id in names(&collections, "id") {
                    places.push(Place {
                        base: format!("{database_path}/{id}"),
                        id,
                    });
                }
            }
        }
        Ok(places)
    }

    /// Records whose document contains a probe built from one of the subject's keys and that
    /// belong to the subject: stamped with one of its keys, or not stamped at all (no owner can be
    /// shown, so a person must look). Records of other subjects that mention it are not counted.
    async fn probe(&self, place: &Place, subjects: &Subjects) -> Result<u64, ConnectorError> {
        let tenant = subjects.tenant();
        let mut hits = BTreeSet::new();
        for text in subjects.probes(&self.probes) {
            let answer = self
                .call(
                    Method::POST,
                    &place.op("get"),
                    Some(json!({"where_document": {"$contains": text}, "include": ["metadatas"]})),
                )
                .await?;
            let metadatas = answer.get("metadatas").and_then(Value::as_array);
            for (i, id) in ids(&answer).into_iter().enumerate() {
                let meta = metadatas.and_then(|m| m.get(i)).unwrap_or(&Value::Null);
                if may_be_subjects(meta, tenant, |s| subjects.include(s)) {
                    hits.insert(id);
                }
            }
        }
        Ok(hits.len() as u64)
    }

    /// Deletes `ids` from a collection, [`BATCH`] at a time (Chroma answers how many ids it was
    /// asked to delete, not how many it held: callers count again).
    async fn delete_in(&self, place: &Place, ids: &[String]) -> Result<(), ConnectorError> {
        for batch in ids.chunks(BATCH) {
            self.call(
                Method::POST,
                &place.op("delete"),
                Some(json!({"ids": batch})),
            )
            .await?;
        }
        Ok(())
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, ConnectorError> {
        self.http.json(method, path, body).await
    }

    /// The ids in a collection whose stamp names one of the subjects' keys (none can be searched
    /// for once only their references are known: lineage finds those records).
    async fn stamped(
        &self,
        place: &Place,
        subjects: &Subjects,
    ) -> Result<Vec<String>, ConnectorError> {
        let keys = subjects.keys();
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let filter = stamped_by(subjects.tenant(), &keys);
        let answer = self
            .call(
                Method::POST,
                &place.op("get"),
                Some(json!({"where": filter, "include": []})),
            )
            .await?;
        Ok(ids(&answer))
    }

    /// The subjects, with the keys of those known only by reference found again among the
    /// owners the collection's stamps name in the tenant (read page by page).
    async fn found_again(
        &self,
        place: &Place,
        subjects: &Subjects,
    ) -> Result<Subjects, ConnectorError> {
        const PAGE: usize = 1000;
        if !subjects.any_forgotten() {
            return Ok(subjects.clone());
        }
        let mut owners = BTreeSet::new();
        for page in 0.. {
            let answer = self
                .call(
                    Method::POST,
                    &place.op("get"),
                    Some(json!({
                        "where": { TENANT: { "$eq": subjects.tenant() } },
                        "include": ["metadatas"],
                        "limit": PAGE,
                        "offset": page * PAGE,
                    })),
                )
                .await?;
            let metadatas = answer
                .get("metadatas")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            owners.extend(
                metadatas
                    .iter()
                    .filter_map(|m| m.get(SUBJECT)?.as_str().map(str::to_owned)),
            );
            if metadatas.len() < PAGE {
                break;
            }
        }
        Ok(subjects.found_among(owners.iter().map(String::as_str)))
    }

    /// What a collection holds under `ids_wanted`: each present id with its metadata.
    async fn present(
        &self,
        place: &Place,
        ids_wanted: &[String],
    ) -> Result<Vec<(String, Value)>, ConnectorError> {
        let mut present = Vec::new();
        for batch in ids_wanted.chunks(BATCH) {
            let answer = self
                .call(
                    Method::POST,
                    &place.op("get"),
                    Some(json!({"ids": batch, "include": ["metadatas"]})),
                )
                .await?;
            let metadatas = answer.get("metadatas").and_then(Value::as_array);
            present.extend(ids(&answer).into_iter().enumerate().map(|(i, id)| {
                let meta = metadatas.and_then(|m| m.get(i)).cloned();
                (id, meta.unwrap_or(Value::Null))
            }));
        }
        Ok(present)
    }

    /// Of the ids lineage holds for the subject, those still present that are not stamped as
    /// someone else's: lineage is an index, the stamp in the store decides.
    async fn known_left(
        &self,
        place: &Place,
        known: &[String],
        subjects: &Subjects,
    ) -> Result<Vec<String>, ConnectorError> {
        Ok(self
            .present(place, known)
            .await?
            .into_iter()
            .filter(|(_, meta)| may_be_subjects(meta, subjects.tenant(), |s| subjects.include(s)))
            .map(|(id, _)| id)
            .collect())
    }

    /// Everything of the subject a collection holds: stamped with one of `keys`, or known to
    /// lineage and not stamped as another's.
    async fn subjects_records(
        &self,
        place: &Place,
        known: &[String],
        subjects: &Subjects,
    ) -> Result<BTreeSet<String>, ConnectorError> {
        let mut found: BTreeSet<String> =
            self.stamped(place, subjects).await?.into_iter().collect();
        found.extend(self.known_left(place, known, subjects).await?);
        Ok(found)
    }
}

/// The ids lineage holds in the collection.
fn known_in(place: &Place, lineage: &[(String, String)]) -> Vec<String> {
    lineage
        .iter()
        .filter(|(c, _)| *c == place.id)
        .map(|(_, id)| id.clone())
        .collect()
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
        subjects: &Subjects,
        lineage: &[(String, String)],
    ) -> Result<PurgeReport, ConnectorError> {
        let mut report = PurgeReport::starting(physical(), !self.probes.is_empty());
        for place in &self.collections().await? {
            let known = known_in(place, lineage);
            let subjects = &self.found_again(place, subjects).await?;
            let doomed = self.subjects_records(place, &known, subjects).await?;
            report.before += doomed.len() as u64;
            if !doomed.is_empty() {
                let doomed: Vec<String> = doomed.iter().cloned().collect();
                self.delete_in(place, &doomed).await?;
            }
            // Counted again in the store: Chroma's answer counts the ids asked for, not the
            // records it deleted.
            let left = self.subjects_records(place, &known, subjects).await?;
            report.deleted += doomed.difference(&left).count() as u64;
            report.remaining += left.len() as u64;
            if let Some(hits) = report.probe_hits.as_mut() {
                *hits += self.probe(place, subjects).await?;
            }
        }
        Ok(report)
    }

    async fn count(
        &self,
        subjects: &Subjects,
        lineage: &[(String, String)],
    ) -> Result<u64, ConnectorError> {
        let mut held = 0;
        for place in &self.collections().await? {
            let known = known_in(place, lineage);
            let subjects = &self.found_again(place, subjects).await?;
            held += self.subjects_records(place, &known, subjects).await?.len() as u64;
        }
        Ok(held)
    }

    /// Deletes the expired items wherever their collection is (one that no longer exists holds
    /// nothing any more), but not a record Chroma holds under another owner's stamp than lineage
    /// names: that one is the other owner's.
    async fn delete_items(
        &self,
        collection: &str,
        items: &[ExpiredItem],
    ) -> Result<u64, ConnectorError> {
        let Some(place) = self.place(collection).await? else {
            return Ok(0);
        };
        let expired = self.owned(&place, items).await?;
        if expired.is_empty() {
            return Ok(0);
        }
        self.delete_in(&place, &expired).await?;
        let left = self.present(&place, &expired).await?.len();
        Ok((expired.len() - left) as u64)
    }

    async fn held_items(
        &self,
        collection: &str,
        items: &[ExpiredItem],
    ) -> Result<u64, ConnectorError> {
        match self.place(collection).await? {
            Some(place) => Ok(self.owned(&place, items).await?.len() as u64),
            None => Ok(0),
        }
    }

    /// Gives every stamped record the owner key its stamp names (records stamped before reads
    /// were found by it, or whose key disagrees with their stamp), [`BATCH`] at a time. Until
    /// then a subject's reads do not find them: hidden, never served to anyone else. A record
    /// restamped between this page's read and its update keeps the older owner key until it is
    /// written again: hidden from its new owner, and never served on the key alone.
    async fn upgrade(&self) -> Result<u64, ConnectorError> {
        let mut changed = 0;
        for place in &self.collections().await? {
            for page in 0.. {
                let answer = self
                    .call(
                        Method::POST,
                        &place.op("get"),
                        Some(json!({"include": ["metadatas"], "limit": BATCH, "offset": page * BATCH})),
                    )
                    .await?;
                let found = ids(&answer);
                let metadatas = answer.get("metadatas").and_then(Value::as_array);
                let (stale, keys): (Vec<String>, Vec<Value>) = found
                    .iter()
                    .enumerate()
                    .filter_map(|(i, id)| {
                        let meta = metadatas?.get(i)?;
                        let stamp = read_stamp(meta)?;
                        let key = owner(&stamp.tenant, &stamp.subject);
                        (meta.get(OWNER).and_then(Value::as_str) != Some(key.as_str()))
                            .then(|| (id.clone(), json!({ OWNER: key })))
                    })
                    .unzip();
                if !stale.is_empty() {
                    // Chroma merges an update's metadata into the record's.
                    self.call(
                        Method::POST,
                        &place.op("update"),
                        Some(json!({"ids": stale, "metadatas": keys})),
                    )
                    .await?;
                    changed += stale.len() as u64;
                }
                if found.len() < BATCH {
                    break;
                }
            }
        }
        Ok(changed)
    }
}

impl ChromaConnector {
    /// The collection with this id, if it still exists.
    async fn place(&self, collection: &str) -> Result<Option<Place>, ConnectorError> {
        Ok(self
            .collections()
            .await?
            .into_iter()
            .find(|p| p.id == collection))
    }

    /// Of `items`, those the collection holds for the owner lineage names.
    async fn owned(
        &self,
        place: &Place,
        items: &[ExpiredItem],
    ) -> Result<Vec<String>, ConnectorError> {
        let ids: Vec<String> = items.iter().map(|i| i.item_id.clone()).collect();
        Ok(self
            .present(place, &ids)
            .await?
            .into_iter()
            .filter(|(id, meta)| {
                items.iter().any(|i| {
                    i.item_id == *id && may_be_subjects(meta, &i.tenant, |s| s == i.subject)
                })
            })
            .map(|(id, _)| id)
            .collect())
    }
}
