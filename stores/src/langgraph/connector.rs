//! Purging a subject from a LangGraph server: its threads (found through the thread registry and
//! by their stamp) and its store items (everything under the subject's namespace, and the items
//! lineage holds). The server has no bulk delete: each thread and item is deleted on its own.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use hyper::{Method, StatusCode};
use serde_json::{Value, json};

use crate::data::forward::{Route, Upstreams};
use crate::http::StoreHttp;
use crate::kit::stamp::{SUBJECT, TENANT};
use crate::langgraph::adapter::{Namespace, Placement, STORE, THREADS, item_query, parse_item_id};
use crate::purge::{Connector, ConnectorError, Copy, Physical, PurgeReport, Subjects};
use crate::state::ExpiredItem;

/// Threads and items are read in pages of this many, at most this many pages per search.
const PAGE: usize = 500;
const MAX_PAGES: usize = 2_000;

/// What the LangGraph server keeps after its threads and items are deleted; its API removes none
/// of it.
fn physical() -> Physical {
    Physical::default()
        .with(Copy::unknown(
            ".langgraph_api/.langgraph_checkpoint.*.pckl (the in-memory server's checkpoints)",
            "the inputs and outputs of the deleted threads' runs",
            "the in-memory server keeps checkpoint writes after their thread is deleted, through saves and restarts",
            "the server never removes them; only deleting its data directory does",
        ))
        .with(Copy::unknown(
            "the server's storage (a PostgreSQL-backed server's tables and WAL)",
            "the deleted threads' and items' rows",
            "deleted rows stay in the database's files until it reclaims the space",
            "the server's database is not Lethe's to vacuum",
        ))
        .with(Copy::unknown(
            ".langgraph_api/store.pckl and store.vectors.pckl (the server's namespace listing)",
            "the namespace names of the subject's items (its key)",
            "namespace names stay listed, and saved, after their items are gone",
            "the server never forgets a namespace it has seen",
        ))
}

pub struct LangGraphConnector {
    http: StoreHttp,
    /// Where a subject's store items live.
    namespace: Namespace,
    probe: Probe,
}

/// The verification probe: queries built from the subject's keys, searched semantically in the
/// store (when the server has an index), and the similarity from which a hit counts.
#[derive(Debug, Clone, Default)]
pub struct Probe {
    pub queries: Vec<String>,
    pub min_score: f64,
}

type Item = (Vec<String>, String);

impl LangGraphConnector {
    pub fn new(
        route: Route,
        upstreams: Arc<Upstreams>,
        namespace: Namespace,
        probe: Probe,
    ) -> Self {
        LangGraphConnector {
            http: StoreHttp::new(route, upstreams),
            namespace,
            probe,
        }
    }

    /// Store items semantically close to a probe that belong to the subject: stamped with one of
    /// its keys, under its namespace, or not stamped at all (no owner can be shown, so a person
    /// must look). Other subjects' items are theirs, however close.
    async fn probe(&self, subjects: &Subjects) -> Result<u64, ConnectorError> {
        let tenant = subjects.tenant();
        let mut hits = BTreeSet::new();
        for text in subjects.probes(&self.probe.queries) {
            let search = json!({ "namespace_prefix": [], "query": text, "limit": 50 });
            let (_, answer) = self
                .call(Method::POST, "/store/items/search", None, Some(search))
                .await?;
            for item in answer
                .get("items")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let close = item
                    .get("score")
                    .and_then(Value::as_f64)
                    .is_some_and(|s| s >= self.probe.min_score);
                let namespace: Vec<String> = item
                    .get("namespace")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|l| l.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                let owner = item
                    .get("value")
                    .and_then(|v| Some((v.get(TENANT)?.as_str()?, v.get(SUBJECT)?.as_str()?)));
                let placed = self.namespace.place(tenant, &namespace);
                let belongs = owner.is_none_or(|(t, s)| t == tenant && subjects.include(s))
                    || matches!(placed, Placement::Subject(s) if subjects.include(&s));
                if close && belongs {
                    let key = item.get("key").and_then(Value::as_str).unwrap_or_default();
                    hits.insert((namespace, key.to_owned()));
                }
            }
        }
        Ok(hits.len() as u64)
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        query: Option<&str>,
        body: Option<Value>,
    ) -> Result<(StatusCode, Value), ConnectorError> {
        self.http.call(method, path, query, body).await
    }

    /// Every result of a search, read page by page (`list` finds a page's results in the answer);
    /// too many results stop the purge for review rather than leave some unread.
    async fn search_all(
        &self,
        path: &str,
        search: Value,
        list: impl Fn(&Value) -> Option<&Vec<Value>>,
    ) -> Result<Vec<Value>, ConnectorError> {
        let Value::Object(mut search) = search else {
            return Err(format!("{path}: a search is an object").into());
        };
        let mut results = Vec::new();
        search.insert("limit".into(), json!(PAGE));
        for page in 0..MAX_PAGES {
            search.insert("offset".into(), json!(page * PAGE));
            let body = Value::Object(search.clone());
            let (_, answer) = self.call(Method::POST, path, None, Some(body)).await?;
            let page = list(&answer).cloned().unwrap_or_default();
            let last = page.len() < PAGE;
            results.extend(page);
            if last {
                return Ok(results);
            }
        }
        Err(format!(
            "{}: more than {} results; purge stopped for review",
            self.http.route().name,
            PAGE * MAX_PAGES
        )
        .into())
    }

    /// The subjects, with the keys of those known only by reference found again among the
    /// subject labels of the namespaces the server lists (restored items keep their namespace).
    async fn found_again(&self, subjects: &Subjects) -> Result<Subjects, ConnectorError> {
        if !subjects.any_forgotten() {
            return Ok(subjects.clone());
        }
        let (prefix, depth) = self.namespace.above_subject(subjects.tenant());
        let listing = json!({ "prefix": prefix, "max_depth": depth });
        let namespaces = self
            .search_all("/store/namespaces", listing, |a| {
                a.get("namespaces")?.as_array()
            })
            .await?;
        let owners: Vec<String> = namespaces
            .iter()
            .filter_map(|n| {
                let labels: Vec<String> = n
                    .as_array()?
                    .iter()
                    .filter_map(|l| l.as_str().map(str::to_owned))
                    .collect();
                labels.get(depth - 1).cloned()
            })
            .collect();
        Ok(subjects.found_among(owners.iter().map(String::as_str)))
    }

    /// The threads stamped with one of the subjects' keys (those known only by reference are
    /// found through the thread registry).
    async fn stamped_threads(
        &self,
        subjects: &Subjects,
    ) -> Result<BTreeSet<String>, ConnectorError> {
        let mut found = BTreeSet::new();
        for key in &subjects.keys() {
            let search = json!({ "metadata": { TENANT: subjects.tenant(), SUBJECT: key }, "select": ["thread_id"] });
            let threads = self
                .search_all("/threads/search", search, Value::as_array)
                .await?;
            found.extend(
                threads
                    .iter()
                    .filter_map(|t| t.get("thread_id")?.as_str().map(str::to_owned)),
            );
        }
        Ok(found)
    }

    async fn thread_exists(&self, id: &str) -> Result<bool, ConnectorError> {
        let (status, _) = self
            .call(Method::GET, &format!("/threads/{id}"), None, None)
            .await?;
        Ok(status.is_success())
    }

    /// The items under one of the subjects' namespaces.
    async fn namespace_items(
        &self,
        prefixes: &[Vec<String>],
    ) -> Result<BTreeSet<Item>, ConnectorError> {
        let mut found = BTreeSet::new();
        for prefix in prefixes {
            let search = json!({ "namespace_prefix": prefix });
            let items = self
                .search_all("/store/items/search", search, |a| {
                    a.get("items")?.as_array()
                })
                .await?;
            for item in &items {
                let namespace: Option<Vec<String>> = item
                    .get("namespace")
                    .and_then(Value::as_array)
                    .and_then(|a| a.iter().map(|l| l.as_str().map(str::to_owned)).collect());
                let key = item.get("key").and_then(Value::as_str);
                if let (Some(namespace), Some(key)) = (namespace, key) {
                    found.insert((namespace, key.to_owned()));
                }
            }
        }
        Ok(found)
    }

    async fn item_exists(&self, (namespace, key): &Item) -> Result<bool, ConnectorError> {
        let query = item_query(namespace, key, None);
        let (status, answer) = self
            .call(Method::GET, "/store/items", Some(&query), None)
            .await?;
        Ok(status.is_success() && !answer.is_null())
    }

    async fn delete_thread(&self, id: &str) -> Result<bool, ConnectorError> {
        let (status, _) = self
            .call(Method::DELETE, &format!("/threads/{id}"), None, None)
            .await?;
        Ok(status.is_success())
    }

    async fn delete_item(&self, (namespace, key): &Item) -> Result<(), ConnectorError> {
        let body = json!({ "namespace": namespace, "key": key });
        self.call(Method::DELETE, "/store/items", None, Some(body))
            .await
            .map(|_| ())
    }

    /// What is left of the subject: threads lineage registered that still exist, stamped
    /// threads, items lineage registered that still exist, and items under its namespaces.
    async fn left(
        &self,
        subjects: &Subjects,
        lineage: &[(String, String)],
    ) -> Result<(BTreeSet<String>, BTreeSet<Item>), ConnectorError> {
        let mut threads = self.stamped_threads(subjects).await?;
        let registered: BTreeSet<&String> = lineage
            .iter()
            .filter(|(c, _)| c == THREADS)
            .map(|(_, id)| id)
            .collect();
        for id in registered {
            if !threads.contains(id) && self.thread_exists(id).await? {
                threads.insert(id.clone());
            }
        }
        let prefixes: Vec<Vec<String>> = subjects
            .keys()
            .iter()
            .map(|key| self.namespace.render(subjects.tenant(), key))
            .collect();
        let mut items = self.namespace_items(&prefixes).await?;
        let registered_items: BTreeSet<Item> = lineage
            .iter()
            .filter(|(c, _)| c == STORE)
            .filter_map(|(_, id)| parse_item_id(id))
            .collect();
        for item in registered_items {
            if !items.contains(&item) && self.item_exists(&item).await? {
                items.insert(item.clone());
            }
        }
        Ok((threads, items))
    }
}

#[async_trait]
impl Connector for LangGraphConnector {
    async fn purge(
        &self,
        subjects: &Subjects,
        lineage: &[(String, String)],
    ) -> Result<PurgeReport, ConnectorError> {
        let subjects = &self.found_again(subjects).await?;
        let (threads, items) = self.left(subjects, lineage).await?;
        let mut deleted = 0;
        for id in &threads {
            if self.delete_thread(id).await? {
                deleted += 1;
            }
        }
        for item in &items {
            self.delete_item(item).await?;
            deleted += 1;
        }
        let (threads_left, items_left) = self.left(subjects, lineage).await?;
        let probe_hits = if self.probe.queries.is_empty() {
            None
        } else {
            Some(self.probe(subjects).await?)
        };
        Ok(PurgeReport {
            probe_hits,
            before: (threads.len() + items.len()) as u64,
            deleted,
            remaining: (threads_left.len() + items_left.len()) as u64,
            physical: physical(),
        })
    }

    async fn count(
        &self,
        subjects: &Subjects,
        lineage: &[(String, String)],
    ) -> Result<u64, ConnectorError> {
        let subjects = &self.found_again(subjects).await?;
        let (threads, items) = self.left(subjects, lineage).await?;
        Ok((threads.len() + items.len()) as u64)
    }

    async fn delete_items(
        &self,
        collection: &str,
        items: &[ExpiredItem],
    ) -> Result<u64, ConnectorError> {
        let mut deleted = 0;
        for id in items.iter().map(|i| &i.item_id) {
            if collection == THREADS {
                if self.delete_thread(id).await? {
                    deleted += 1;
                }
            } else if let Some(item) = parse_item_id(id).filter(|_| collection == STORE) {
                self.delete_item(&item).await?;
                deleted += 1;
            } else {
                return Err(
                    format!("{collection}/{id} is not a LangGraph thread or store item").into(),
                );
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
            let exists = if collection == THREADS {
                self.thread_exists(id).await?
            } else if let Some(item) = parse_item_id(id).filter(|_| collection == STORE) {
                self.item_exists(&item).await?
            } else {
                return Err(
                    format!("{collection}/{id} is not a LangGraph thread or store item").into(),
                );
            };
            held += u64::from(exists);
        }
        Ok(held)
    }
}
