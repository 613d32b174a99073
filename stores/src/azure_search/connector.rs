//! Purging a subject from Azure AI Search the runbook's way (Azure has no delete by query): the
//! subject's documents found by an OData filter on the stamp (`$select` the key only) and by the
//! keys lineage holds that Azure does not hold under another owner's stamp, deleted by key in
//! batches of at most 1 000, then counted again with the same filter (`count`), and probed for
//! the subject's keys through `search=`.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use hyper::Method;
use serde_json::{Value, json};

use super::adapter::read::{MAX_SKIP, PAGE};
use super::adapter::write::MAX_ACTIONS;
use super::adapter::{
    IndexInfo, SUBJECT, TENANT, canonical_key, index_info, keys_filter, stamp_select,
};
use super::odata::Literal;
use crate::data::forward::{Route, Upstreams};
use crate::http::StoreHttp;
use crate::kit::stamp::may_be_subjects;
use crate::purge::{Connector, ConnectorError, Copy, Physical, PurgeReport, Subjects};
use crate::state::ExpiredItem;

/// The api-version of Lethe's own requests (the newest the adapter knows).
const API: &str = "api-version=2026-04-01";

/// What Azure keeps of deleted documents: they stay in the index's segments until a background
/// merge, which Lethe can neither start nor date.
fn segments(index: &str) -> Copy {
    Copy::unknown(
        &format!("index {index}: its segments"),
        "the deleted documents' fields and vectors",
        "Azure AI Search marks deleted documents and keeps them in the index's segments until a background merge (learn.microsoft.com/azure/search/search-how-to-delete-documents)",
        "merges run when Azure decides; Microsoft documents storage shrinking 24 to 72 hours after deletes (learn.microsoft.com/azure/search/troubleshoot-storage-metrics), with no date per document",
    )
}

/// The data source an indexer feeds an index from: it still holds what the purge deleted from
/// the index, and the indexer's next run brings it back unless it is deleted there too.
fn fed_by(index: &str, indexer: &str, source: &str) -> Copy {
    Copy::unknown(
        &format!("data source {source} (indexer {indexer} feeds index {index})"),
        "the documents the indexer reads into the index, the subject's among them if it read them",
        "Lethe deletes from the index, not from an indexer's source; the next run indexes again what the source still holds",
        "the source is the app's to purge (its own store, or an [[erasure.*]] target); Lethe cannot date it",
    )
}

/// The lexical verification probe: the `texts` (with `{subject}` and `{tenant}`) searched for
/// in the `fields` that hold the documents' text (every searchable field when none is named).
#[derive(Debug, Clone)]
pub struct Probe {
    pub fields: Vec<String>,
    pub texts: Vec<String>,
}

pub struct AzureSearchConnector {
    http: StoreHttp,
    probe: Probe,
}

/// An OData string literal (quotes doubled).
fn text(value: &str) -> String {
    Literal::Str(value.to_owned()).to_string()
}

/// The filter of the subjects' documents by their stamp (`None`: no key to filter on).
fn stamped_by(subjects: &Subjects) -> Option<String> {
    let keys = subjects.keys();
    if keys.is_empty() {
        return None;
    }
    let any: Vec<String> = keys
        .iter()
        .map(|k| format!("{SUBJECT} eq {}", text(k)))
        .collect();
    Some(format!(
        "({TENANT} eq {}) and ({})",
        text(subjects.tenant()),
        any.join(" or ")
    ))
}

impl AzureSearchConnector {
    pub fn new(route: Route, upstreams: Arc<Upstreams>, probe: Probe) -> Self {
        AzureSearchConnector {
            http: StoreHttp::new(route, upstreams),
            probe,
        }
    }

    fn docs(index: &str, rest: &str) -> String {
        format!("/indexes('{index}')/docs{rest}")
    }

    /// Every index made through Lethe (with the stamp fields), with its key field.
    async fn indexes(&self) -> Result<Vec<(String, IndexInfo)>, ConnectorError> {
        let (_, listed) = self
            .http
            .call(Method::GET, "/indexes", Some(API), None)
            .await?;
        let mut found = Vec::new();
        for definition in listed["value"].as_array().into_iter().flatten() {
            let (Some(name), Ok(info)) = (definition["name"].as_str(), index_info(definition))
            else {
                continue;
            };
            if info.stamped {
                found.push((name.to_owned(), info));
            }
        }
        Ok(found)
    }

    /// Every indexer, as (name, data source, target index).
    async fn indexers(&self) -> Result<Vec<(String, String, String)>, ConnectorError> {
        let (_, listed) = self
            .http
            .call(Method::GET, "/indexers", Some(API), None)
            .await?;
        Ok(listed["value"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| {
                let text = |k: &str| i[k].as_str().map(str::to_owned);
                Some((
                    text("name")?,
                    text("dataSourceName")?,
                    text("targetIndexName")?,
                ))
            })
            .collect())
    }

    async fn search(&self, index: &str, body: Value) -> Result<Value, ConnectorError> {
        let (_, answer) = self
            .http
            .call(
                Method::POST,
                &Self::docs(index, "/search.post.search"),
                Some(API),
                Some(body),
            )
            .await?;
        Ok(answer)
    }

    /// The documents (key and stamp) matching `filter` (and `search`, in `fields`), page by
    /// page, as far as Azure pages; and whether more may match beyond that.
    async fn documents(
        &self,
        index: &str,
        info: &IndexInfo,
        filter: Option<&str>,
        search: Option<(&str, &[String])>,
    ) -> Result<(Vec<Value>, bool), ConnectorError> {
        let mut found = Vec::new();
        let mut skip = 0;
        loop {
            let mut body = json!({
                "search": "*", "select": stamp_select(&info.key).join(","), "top": PAGE, "skip": skip,
            });
            if let Some(filter) = filter {
                body["filter"] = json!(filter);
            }
            if let Some((text, fields)) = search {
                body["search"] = json!(text);
                if !fields.is_empty() {
                    body["searchFields"] = json!(fields.join(","));
                }
            }
            let answer = self.search(index, body).await?;
            let page = answer["value"].as_array().cloned().unwrap_or_default();
            let full = page.len() == PAGE;
            found.extend(page);
            if !full {
                return Ok((found, false));
            }
            skip += PAGE;
            if skip > MAX_SKIP {
                return Ok((found, true));
            }
        }
    }

    /// How many documents match `filter`, as Azure counts them.
    async fn counted(&self, index: &str, filter: &str) -> Result<u64, ConnectorError> {
        let answer = self
            .search(
                index,
                json!({ "search": "*", "filter": filter, "count": true, "top": 0 }),
            )
            .await?;
        answer["@odata.count"]
            .as_u64()
            .ok_or_else(|| ConnectorError::Unavailable(format!("{index}: Azure answered no count")))
    }

    /// The documents held under `keys` (canonical ones), each with its key and stamp.
    async fn present(
        &self,
        index: &str,
        info: &IndexInfo,
        keys: &[String],
    ) -> Result<Vec<Value>, ConnectorError> {
        let keys: Vec<String> = keys.iter().filter(|k| canonical_key(k)).cloned().collect();
        let mut found = Vec::new();
        for chunk in keys.chunks(PAGE) {
            let body = json!({
                "search": "*", "filter": keys_filter(&info.key, chunk),
                "select": stamp_select(&info.key).join(","), "top": chunk.len(),
            });
            found.extend(
                self.search(index, body).await?["value"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
            );
        }
        Ok(found)
    }

    fn key_of(info: &IndexInfo, doc: &Value) -> Option<String> {
        doc[&info.key].as_str().map(str::to_owned)
    }

    /// The subjects, with the keys of those known only by reference found again among the
    /// owners the index's stamps name in the tenant.
    async fn found_again(
        &self,
        index: &str,
        info: &IndexInfo,
        subjects: &Subjects,
    ) -> Result<Subjects, ConnectorError> {
        if !subjects.any_forgotten() {
            return Ok(subjects.clone());
        }
        let tenant = format!("{TENANT} eq {}", text(subjects.tenant()));
        let (docs, _) = self.documents(index, info, Some(&tenant), None).await?;
        let owners: BTreeSet<String> = docs
            .iter()
            .filter_map(|d| d[SUBJECT].as_str().map(str::to_owned))
            .collect();
        Ok(subjects.found_among(owners.iter().map(String::as_str)))
    }

    /// What `index` holds of `subjects`: the documents found (by stamp and by lineage's ids),
    /// and how many that is, verified as the runbook verifies: the subject's filter counted by
    /// Azure, the larger of the two. The purge's check and the dry run measure alike.
    async fn held_in(
        &self,
        index: &str,
        info: &IndexInfo,
        known: &[String],
        subjects: &Subjects,
    ) -> Result<(BTreeSet<String>, u64), ConnectorError> {
        let (found, _) = self
            .subjects_documents(index, info, known, subjects)
            .await?;
        let counted = match stamped_by(subjects) {
            Some(filter) => self.counted(index, &filter).await?,
            None => 0,
        };
        let held = (found.len() as u64).max(counted);
        Ok((found, held))
    }

    /// Everything of the subjects an index holds: stamped with one of their keys, or known to
    /// lineage and not stamped as another's; and whether more are stamped so than Azure pages.
    async fn subjects_documents(
        &self,
        index: &str,
        info: &IndexInfo,
        known: &[String],
        subjects: &Subjects,
    ) -> Result<(BTreeSet<String>, bool), ConnectorError> {
        let mut found = BTreeSet::new();
        let mut more = false;
        if let Some(filter) = stamped_by(subjects) {
            let (docs, beyond) = self.documents(index, info, Some(&filter), None).await?;
            found.extend(docs.iter().filter_map(|d| Self::key_of(info, d)));
            more = beyond;
        }
        for doc in self.present(index, info, known).await? {
            if may_be_subjects(&doc, subjects.tenant(), |s| subjects.include(s)) {
                found.extend(Self::key_of(info, &doc));
            }
        }
        Ok((found, more))
    }

    /// Deletes by key, at most [`MAX_ACTIONS`] a batch; an action Azure did not carry out is
    /// an error.
    async fn delete(
        &self,
        index: &str,
        info: &IndexInfo,
        keys: &BTreeSet<String>,
    ) -> Result<(), ConnectorError> {
        let keys: Vec<&String> = keys.iter().collect();
        for chunk in keys.chunks(MAX_ACTIONS) {
            let actions: Vec<Value> = chunk
                .iter()
                .map(|k| json!({ "@search.action": "delete", info.key.as_str(): k }))
                .collect();
            let (_, answer) = self
                .http
                .call(
                    Method::POST,
                    &Self::docs(index, "/search.index"),
                    Some(API),
                    Some(json!({ "value": actions })),
                )
                .await?;
            let failed = answer["value"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|r| r["status"] != true)
                .count();
            if failed > 0 {
                return Err(ConnectorError::Unavailable(format!(
                    "{index}: Azure did not delete {failed} of {} documents",
                    chunk.len()
                )));
            }
        }
        Ok(())
    }

    /// Documents whose text fields contain a probe built from one of the subject's keys and
    /// that are the subject's (stamped so) or no one's (a person must look).
    async fn probe_hits(
        &self,
        index: &str,
        info: &IndexInfo,
        subjects: &Subjects,
    ) -> Result<u64, ConnectorError> {
        let tenant = subjects.tenant();
        let mut hits = BTreeSet::new();
        for probe in subjects.probes(&self.probe.texts) {
            // A phrase in the simple syntax: its own quotes and escapes dropped.
            let phrase = format!("\"{}\"", probe.replace(['"', '\\'], " "));
            let (docs, _) = self
                .documents(index, info, None, Some((&phrase, &self.probe.fields)))
                .await?;
            hits.extend(
                docs.iter()
                    .filter(|d| may_be_subjects(d, tenant, |s| subjects.include(s)))
                    .filter_map(|d| Self::key_of(info, d)),
            );
        }
        Ok(hits.len() as u64)
    }

    /// Of `items`, those the index holds for the owner lineage names (none when the index no
    /// longer exists).
    async fn owned(
        &self,
        index: &str,
        items: &[ExpiredItem],
    ) -> Result<(IndexInfo, BTreeSet<String>), ConnectorError> {
        let Some((_, info)) = self.indexes().await?.into_iter().find(|(n, _)| n == index) else {
            return Ok((
                IndexInfo {
                    key: String::new(),
                    stamped: false,
                    subjects_facetable: false,
                },
                BTreeSet::new(),
            ));
        };
        let keys: Vec<String> = items.iter().map(|i| i.item_id.clone()).collect();
        let owned = self
            .present(index, &info, &keys)
            .await?
            .iter()
            .filter_map(|doc| {
                let key = Self::key_of(&info, doc)?;
                items
                    .iter()
                    .any(|i| {
                        i.item_id == key && may_be_subjects(doc, &i.tenant, |s| s == i.subject)
                    })
                    .then_some(key)
            })
            .collect();
        Ok((info, owned))
    }
}

/// The keys lineage holds in the index.
fn known_in(index: &str, lineage: &[(String, String)]) -> Vec<String> {
    lineage
        .iter()
        .filter(|(c, _)| c == index)
        .map(|(_, key)| key.clone())
        .collect()
}

#[async_trait]
impl Connector for AzureSearchConnector {
    async fn purge(
        &self,
        subjects: &Subjects,
        lineage: &[(String, String)],
    ) -> Result<PurgeReport, ConnectorError> {
        let mut report = PurgeReport::starting(Physical::default(), !self.probe.texts.is_empty());
        let indexers = self.indexers().await?;
        for (index, info) in self.indexes().await? {
            let known = known_in(&index, lineage);
            let subjects = &self.found_again(&index, &info, subjects).await?;
            let mut deleted_here = BTreeSet::new();
            // Azure pages no further than 100 000 documents: past that, the next round finds the
            // rest once the first are gone.
            loop {
                let (doomed, more) = self
                    .subjects_documents(&index, &info, &known, subjects)
                    .await?;
                let doomed: BTreeSet<String> = doomed.difference(&deleted_here).cloned().collect();
                if doomed.is_empty() {
                    break;
                }
                self.delete(&index, &info, &doomed).await?;
                deleted_here.extend(doomed);
                if !more {
                    break;
                }
            }
            let (left, remaining) = self.held_in(&index, &info, &known, subjects).await?;
            report.before += deleted_here.union(&left).count() as u64;
            report.deleted += deleted_here.difference(&left).count() as u64;
            report.remaining += remaining;
            if let Some(hits) = report.probe_hits.as_mut() {
                *hits += self.probe_hits(&index, &info, subjects).await?;
            }
            if !deleted_here.is_empty() {
                report.physical.remaining.push(segments(&index));
                for (indexer, source, _) in
                    indexers.iter().filter(|(_, _, target)| *target == index)
                {
                    report
                        .physical
                        .remaining
                        .push(fed_by(&index, indexer, source));
                }
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
        for (index, info) in self.indexes().await? {
            let known = known_in(&index, lineage);
            let subjects = &self.found_again(&index, &info, subjects).await?;
            held += self.held_in(&index, &info, &known, subjects).await?.1;
        }
        Ok(held)
    }

    /// Deletes the expired documents, but not one Azure holds under another owner's stamp than
    /// lineage names: that one is the other owner's.
    async fn delete_items(
        &self,
        index: &str,
        items: &[ExpiredItem],
    ) -> Result<u64, ConnectorError> {
        let (info, expired) = self.owned(index, items).await?;
        if expired.is_empty() {
            return Ok(0);
        }
        self.delete(index, &info, &expired).await?;
        let keys: Vec<String> = expired.iter().cloned().collect();
        let left = self.present(index, &info, &keys).await?.len();
        Ok((expired.len() - left) as u64)
    }

    async fn held_items(&self, index: &str, items: &[ExpiredItem]) -> Result<u64, ConnectorError> {
        Ok(self.owned(index, items).await?.1.len() as u64)
    }
}
