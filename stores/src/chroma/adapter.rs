//! Chroma's v2 HTTP API (`/api/v2/...`).
//!
//! Writes are decided record by record and stamped into each record's metadata; reads are
//! narrowed with a `where` Chroma evaluates, then every returned record is decided again and
//! dropped if refused, keeping the parallel arrays aligned. `count` is answered by counting what a
//! narrowed, filtered `get` returns, so it never reveals hidden records.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use hyper::Method;
use lethe_policy::{Overwrite, PolicyView, ReadContext, Stamp, decide_read_item};
use serde_json::{Map, Value, json};

use crate::data::records::{AdapterError, Scope};
use crate::kit::stamp::{
    EXPIRES_AT, OWNER, SUBJECT, TENANT, owner, parse_object, read_stamp, write_stamp,
};
use crate::kit::write::{decide_records, record_facts};

/// Arrays that run parallel to `ids` in requests and responses.
const PARALLEL: [&str; 7] = [
    "ids",
    "embeddings",
    "documents",
    "metadatas",
    "uris",
    "distances",
    "data",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    Add,
    Upsert,
    Update,
}

impl WriteKind {
    /// What each write may do to an id Chroma already holds: `add` leaves it as it is (so it is
    /// refused), `upsert` replaces it, `update` writes nothing else.
    fn overwrite(self) -> Overwrite {
        match self {
            WriteKind::Add => Overwrite::Never,
            WriteKind::Upsert => Overwrite::Allowed,
            WriteKind::Update => Overwrite::Only,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// Service and metadata reads any data-plane caller may make (the client library needs them).
    PassThrough,
    /// Creating, changing or deleting tenants, databases and collections.
    Admin,
    Write {
        collection: String,
        kind: WriteKind,
    },
    Get {
        collection: String,
    },
    Query {
        collection: String,
    },
    Count {
        collection: String,
    },
    Delete {
        collection: String,
    },
    /// A record operation on a collection id written other than Chroma's canonical way: Chroma
    /// would take it as the same collection, lineage would not.
    NonCanonical,
    /// Not passed through: unknown, or an operation Lethe cannot govern (search, functions, reset).
    Refused,
}

/// Chroma's collection ids are UUIDs, which it parses in many spellings (upper case, without
/// hyphens, in braces, as a URN); only the lowercase hyphenated one is accepted here.
fn canonical_collection(segment: &str) -> Option<String> {
    uuid::Uuid::parse_str(segment)
        .ok()
        .map(|u| u.hyphenated().to_string())
        .filter(|canonical| canonical == segment)
}

/// Which endpoint a request is; `path` is the part after the route prefix, without the query.
pub fn classify(method: &Method, path: &str) -> Endpoint {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let get = method == Method::GET;
    let post = method == Method::POST;
    let mutate = matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    match segments.as_slice() {
        ["api", "v2", "heartbeat" | "version" | "pre-flight-checks"]
        | ["api", "v2", "auth", "identity"]
            if get =>
        {
            Endpoint::PassThrough
        }
        ["api", "v2", "tenants"] if post => Endpoint::Admin,
        ["api", "v2", "tenants", _] | ["api", "v2", "tenants", _, "databases"] if get => {
            Endpoint::PassThrough
        }
        ["api", "v2", "tenants", _] | ["api", "v2", "tenants", _, "databases"] if mutate => {
            Endpoint::Admin
        }
        ["api", "v2", "tenants", _, "databases", _] if get => Endpoint::PassThrough,
        ["api", "v2", "tenants", _, "databases", _] if mutate => Endpoint::Admin,
        [
            "api",
            "v2",
            "tenants",
            _,
            "databases",
            _,
            "collections" | "collections_count",
        ] if get => Endpoint::PassThrough,
        ["api", "v2", "tenants", _, "databases", _, "collections"] if post => Endpoint::Admin,
        ["api", "v2", "tenants", _, "databases", _, "collections", _] if get => {
            Endpoint::PassThrough
        }
        ["api", "v2", "tenants", _, "databases", _, "collections", _] if mutate => Endpoint::Admin,
        [
            "api",
            "v2",
            "tenants",
            _,
            "databases",
            _,
            "collections",
            c,
            op,
        ] => {
            let record_op: Option<fn(String) -> Endpoint> = match (*op, post, get) {
                ("add", true, _) => Some(|collection| Endpoint::Write {
                    collection,
                    kind: WriteKind::Add,
                }),
                ("upsert", true, _) => Some(|collection| Endpoint::Write {
                    collection,
                    kind: WriteKind::Upsert,
                }),
                ("update", true, _) => Some(|collection| Endpoint::Write {
                    collection,
                    kind: WriteKind::Update,
                }),
                ("get", true, _) => Some(|collection| Endpoint::Get { collection }),
                ("query", true, _) => Some(|collection| Endpoint::Query { collection }),
                ("delete", true, _) => Some(|collection| Endpoint::Delete { collection }),
                ("count", _, true) => Some(|collection| Endpoint::Count { collection }),
                _ => None,
            };
            match (record_op, canonical_collection(c)) {
                (Some(endpoint), Some(collection)) => endpoint(collection),
                (Some(_), None) => Endpoint::NonCanonical,
                (None, _) if *op == "fork" && post => Endpoint::Admin,
                (None, _) => Endpoint::Refused,
            }
        }
        _ => Endpoint::Refused,
    }
}

/// One record of a write, with the facts its decision needs.
pub type RecordFacts = crate::data::records::RecordFacts<String>;

/// A parsed write, waiting for the policy of its subjects.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedWrite {
    body: Map<String, Value>,
    pub records: Vec<RecordFacts>,
}

impl PlannedWrite {
    pub fn subjects(&self) -> BTreeSet<&str> {
        self.records.iter().map(|r| r.subject.as_str()).collect()
    }

    /// Each record's document (empty where it has none), in the records' order.
    pub fn documents(&self) -> Vec<&str> {
        let documents = self.body.get("documents").and_then(Value::as_array);
        (0..self.records.len())
            .map(|i| {
                documents
                    .and_then(|d| d.get(i))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
            })
            .collect()
    }
    pub fn ids(&self) -> Vec<String> {
        self.records.iter().map(|r| r.id.clone()).collect()
    }
}

/// Checks that every parallel array present (and not null) has exactly `len` entries and, for
/// nested answers, that each query's entries line up with that query's ids.
fn check_parallel(map: &Map<String, Value>, len: usize, nested: bool) -> Result<(), String> {
    let ids = map.get("ids");
    for key in PARALLEL {
        let Some(value) = map.get(key).filter(|v| !v.is_null()) else {
            continue;
        };
        let Some(items) = value.as_array().filter(|a| a.len() == len) else {
            return Err(format!("{key} must be an array of {len} entries, like ids"));
        };
        if nested {
            for (q, inner) in items.iter().enumerate().filter(|(_, v)| !v.is_null()) {
                let ids_len = ids
                    .and_then(|v| v.get(q))
                    .and_then(Value::as_array)
                    .map(Vec::len);
                if ids_len.is_none() || inner.as_array().map(Vec::len) != ids_len {
                    return Err(format!("{key}[{q}] is not aligned with ids[{q}]"));
                }
            }
        }
    }
    Ok(())
}

/// Parses an `add`, `upsert` or `update` body and finds each record's subject, purpose and
/// category (from the request, else from the record's `lethe_*` metadata).
pub fn plan_write(body: &[u8], scope: &Scope<'_>) -> Result<PlannedWrite, AdapterError> {
    let map = parse_object(body)?;
    let ids: Vec<String> = match map.get("ids") {
        Some(Value::Array(ids)) if !ids.is_empty() => ids
            .iter()
            .map(|id| id.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(|| AdapterError::Invalid("ids must be strings".into()))?,
        _ => {
            return Err(AdapterError::Invalid(
                "ids must be a non-empty array".into(),
            ));
        }
    };
    check_parallel(&map, ids.len(), false).map_err(AdapterError::Invalid)?;
    // Chroma keeps one of two records under one id without a word.
    if ids.iter().collect::<BTreeSet<_>>().len() != ids.len() {
        return Err(AdapterError::Invalid("ids must be unique".into()));
    }
    let metadatas = map.get("metadatas").and_then(Value::as_array);
    let mut records = Vec::with_capacity(ids.len());
    for (index, id) in ids.into_iter().enumerate() {
        let meta = match metadatas.and_then(|m| m.get(index)) {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) => Some(m),
            Some(_) => {
                return Err(AdapterError::Invalid(format!(
                    "metadatas[{index}] must be an object or null"
                )));
            }
        };
        records.push(record_facts(index, id, scope, meta, None)?);
    }
    Ok(PlannedWrite { body: map, records })
}

/// The body of the `get` that reads what Chroma holds under a write's ids, just before the write.
pub fn held_query(planned: &PlannedWrite) -> Vec<u8> {
    json!({ "ids": planned.ids(), "include": ["metadatas"] })
        .to_string()
        .into_bytes()
}

/// What that `get` answered: the stamp each held id carries (`None`: held, but not stamped).
/// Ids Chroma does not hold are absent.
pub fn held_stamps(answer: &[u8]) -> Result<BTreeMap<String, Option<Stamp>>, AdapterError> {
    let map: Map<String, Value> = serde_json::from_slice(answer)
        .map_err(|_| AdapterError::UpstreamInvalid("not JSON".into()))?;
    let ids = map
        .get("ids")
        .and_then(Value::as_array)
        .ok_or_else(|| AdapterError::UpstreamInvalid("ids missing".into()))?;
    check_parallel(&map, ids.len(), false).map_err(AdapterError::UpstreamInvalid)?;
    let metadatas = map.get("metadatas").and_then(Value::as_array);
    ids.iter()
        .enumerate()
        .map(|(i, id)| {
            let id = id
                .as_str()
                .ok_or_else(|| AdapterError::UpstreamInvalid("ids must be strings".into()))?;
            let stamp = metadatas.and_then(|m| m.get(i)).and_then(read_stamp);
            Ok((id.to_owned(), stamp))
        })
        .collect()
}

/// A write every record of which was allowed: the body to forward (`None` when nothing is left
/// to write), and the stamp of each record written.
#[derive(Debug, Clone, PartialEq)]
pub struct StampedWrite {
    pub body: Option<Vec<u8>>,
    pub stamps: Vec<(String, Stamp)>,
}

/// Whether every record could be written at all (an active subject, consent, a retention
/// rule), before anything is asked of the store: a refused write never reaches it.
pub fn check_write(
    planned: &PlannedWrite,
    tenant: &str,
    view: &impl PolicyView,
    now: DateTime<Utc>,
) -> Result<(), AdapterError> {
    let free = BTreeMap::new();
    decide_records(
        &planned.records,
        tenant,
        view,
        &free,
        Overwrite::Allowed,
        now,
    )
    .map(|_| ())
}

/// Decides every record on what Chroma holds under its id (`held`, from [`held_stamps`]) and,
/// when all are allowed, returns the body with each record's stamp written into its metadata. An
/// `update` of an id Chroma does not hold is taken out of the body: it claims nothing.
pub fn apply_write(
    planned: PlannedWrite,
    tenant: &str,
    view: &impl PolicyView,
    held: &BTreeMap<String, Option<Stamp>>,
    kind: WriteKind,
    now: DateTime<Utc>,
) -> Result<StampedWrite, AdapterError> {
    let PlannedWrite { mut body, records } = planned;
    let decided = decide_records(&records, tenant, view, held, kind.overwrite(), now)?;
    let keep: Vec<bool> = decided.iter().map(Option::is_some).collect();
    let metadatas = body.entry("metadatas").or_insert(Value::Null);
    if !metadatas.is_array() {
        *metadatas = Value::Array(vec![Value::Null; records.len()]);
    }
    if let Value::Array(metas) = metadatas {
        for (meta, stamp) in metas.iter_mut().zip(&decided) {
            let Some(stamp) = stamp else { continue };
            if !meta.is_object() {
                *meta = Value::Object(Map::new());
            }
            if let Value::Object(m) = meta {
                write_stamp(m, stamp);
                m.insert(OWNER.into(), json!(owner(&stamp.tenant, &stamp.subject)));
            }
        }
    }
    retain_parallel(&mut body, &keep);
    let stamps: Vec<(String, Stamp)> = records
        .into_iter()
        .zip(decided)
        .filter_map(|(r, stamp)| Some((r.id, stamp?)))
        .collect();
    if stamps.is_empty() {
        return Ok(StampedWrite { body: None, stamps });
    }
    let bytes = serde_json::to_vec(&body).map_err(|e| AdapterError::Invalid(e.to_string()))?;
    Ok(StampedWrite {
        body: Some(bytes),
        stamps,
    })
}

/// How a read's response must be cut back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadPlan {
    /// The collection read (its records are decided as the items they are).
    pub collection: String,
    /// `query` answers arrays nested per query; `get` answers flat arrays.
    pub nested: bool,
    /// Lethe asked for metadatas the client did not; they are removed from the answer.
    pub strip_metadatas: bool,
}

/// A record a read answered with: its id, its stamp's subject, its document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedRecord {
    pub id: String,
    pub owner: String,
    pub document: String,
}

/// The `where` that finds the records stamped as any of a subject's keys in a tenant (what an
/// erasure purges).
pub fn stamped_by(tenant: &str, keys: &[String]) -> Value {
    json!({"$and": [{ TENANT: { "$eq": tenant } }, { SUBJECT: { "$in": keys } }]})
}

/// The conditions Lethe adds to a read: for a subject, its [`OWNER`] key alone; else the
/// caller's tenant and not expired. Chroma evaluates every clause over the metadata of every
/// collection on the server, so each must be selective: measured with 100 000 stamped records
/// elsewhere on the server, a query narrowed by tenant, subject and expiry took 129 ms, by owner
/// 4.5 ms. Every record answered is decided again on its stamp (tenant, subject, expiry,
/// consent), so the owner key only finds candidates: a record past its deadline and not yet
/// swept takes a place in the top k and is withheld.
pub fn read_conditions(tenant: &str, subject: Option<&str>, now: DateTime<Utc>) -> Vec<Value> {
    match subject {
        Some(_) => vec![found_by(tenant, subject)],
        None => vec![
            found_by(tenant, None),
            json!({ EXPIRES_AT: { "$gt": now.timestamp() } }),
        ],
    }
}

/// The conditions that find what a delete may remove (expired records too): the subject's
/// [`OWNER`] key, else the caller's tenant. The answer's stamps decide ([`owned_ids`]).
pub fn delete_conditions(tenant: &str, subject: Option<&str>) -> Vec<Value> {
    vec![found_by(tenant, subject)]
}

/// The one selective clause that finds a subject's records, or a tenant's.
fn found_by(tenant: &str, subject: Option<&str>) -> Value {
    match subject {
        Some(subject) => json!({ OWNER: { "$eq": owner(tenant, subject) } }),
        None => json!({ TENANT: { "$eq": tenant } }),
    }
}

/// `original AND conditions`, in the shape Chroma accepts (`$and` needs two or more operands).
fn narrowed_where(original: Option<Value>, mut conditions: Vec<Value>) -> Value {
    match original {
        Some(Value::Object(o)) if !o.is_empty() => conditions.insert(0, Value::Object(o)),
        _ => {}
    }
    if conditions.len() == 1 {
        conditions.pop().unwrap_or(Value::Null)
    } else {
        json!({ "$and": conditions })
    }
}

/// Rewrites a `get` or `query` body of `collection`: narrowed `where`, and metadatas included
/// (needed to decide).
pub fn narrow_read(
    body: &[u8],
    collection: &str,
    nested: bool,
    tenant: &str,
    bound_subject: Option<&str>,
    now: DateTime<Utc>,
) -> Result<(Vec<u8>, ReadPlan), AdapterError> {
    let mut map = parse_object(body)?;
    match map.get("where") {
        None | Some(Value::Null | Value::Object(_)) => {}
        Some(_) => return Err(AdapterError::Invalid("where must be an object".into())),
    }
    let original = map.remove("where");
    map.insert(
        "where".into(),
        narrowed_where(original, read_conditions(tenant, bound_subject, now)),
    );
    let strip_metadatas = match map.get_mut("include") {
        None | Some(Value::Null) => false,
        Some(Value::Array(include)) => {
            if include.iter().any(|v| !v.is_string()) {
                return Err(AdapterError::Invalid(
                    "include must list field names".into(),
                ));
            }
            let missing = !include.iter().any(|v| v == "metadatas");
            if missing {
                include.push(json!("metadatas"));
            }
            missing
        }
        Some(_) => return Err(AdapterError::Invalid("include must be an array".into())),
    };
    let bytes = serde_json::to_vec(&map).map_err(|e| AdapterError::Invalid(e.to_string()))?;
    Ok((
        bytes,
        ReadPlan {
            collection: collection.to_owned(),
            nested,
            strip_metadatas,
        },
    ))
}

/// The body of the `get` Lethe sends to count ([`read_conditions`]) or to delete
/// ([`delete_conditions`]) within the caller's scope.
pub fn scoped_get(
    ids: Option<Value>,
    original_where: Option<Value>,
    conditions: Vec<Value>,
) -> Vec<u8> {
    let mut body = Map::new();
    if let Some(ids) = ids.filter(|v| !v.is_null()) {
        body.insert("ids".into(), ids);
    }
    body.insert("where".into(), narrowed_where(original_where, conditions));
    body.insert("include".into(), json!(["metadatas"]));
    serde_json::to_vec(&Value::Object(body)).unwrap_or_default()
}

/// Parses a `delete` body into its `ids` and `where` (a `where_document` is refused: Lethe
/// cannot scope it).
pub fn parse_delete(body: &[u8]) -> Result<(Option<Value>, Option<Value>), AdapterError> {
    let mut map = parse_object(body)?;
    if map.get("where_document").is_some_and(|v| !v.is_null()) {
        return Err(AdapterError::Invalid(
            "where_document is not supported through Lethe; delete by ids or where".into(),
        ));
    }
    let ids = map.remove("ids").filter(|v| !v.is_null());
    if ids
        .as_ref()
        .is_some_and(|v| !v.as_array().is_some_and(|a| a.iter().all(Value::is_string)))
    {
        return Err(AdapterError::Invalid(
            "ids must be an array of strings".into(),
        ));
    }
    let filter = map.remove("where").filter(|v| !v.is_null());
    if filter.as_ref().is_some_and(|v| !v.is_object()) {
        return Err(AdapterError::Invalid("where must be an object".into()));
    }
    if ids.is_none() && filter.is_none() {
        return Err(AdapterError::Invalid(
            "name the records to delete with ids or where".into(),
        ));
    }
    Ok((ids, filter))
}

/// The ids of a scoped `get`'s answer whose stamp names the caller's tenant and, when it has
/// one, its subject: what the owner key found, the stamp Chroma holds decides a delete.
pub fn owned_ids(
    response: &[u8],
    tenant: &str,
    subject: Option<&str>,
) -> Result<Vec<String>, AdapterError> {
    let invalid = || AdapterError::UpstreamInvalid("ids missing".into());
    let map: Map<String, Value> = serde_json::from_slice(response)
        .map_err(|_| AdapterError::UpstreamInvalid("not JSON".into()))?;
    let ids = map
        .get("ids")
        .and_then(Value::as_array)
        .ok_or_else(invalid)?;
    let metadatas = map.get("metadatas").and_then(Value::as_array);
    let text = |meta: &Value, key: &str| meta.get(key).and_then(Value::as_str).map(str::to_owned);
    ids.iter()
        .enumerate()
        .filter_map(|(i, id)| {
            let meta = metadatas.and_then(|m| m.get(i)).unwrap_or(&Value::Null);
            let owned = text(meta, TENANT).as_deref() == Some(tenant)
                && subject.is_none_or(|s| text(meta, SUBJECT).as_deref() == Some(s));
            owned.then(|| id.as_str().map(str::to_owned).ok_or_else(invalid))
        })
        .collect()
}

/// The (tenant, subject) pairs whose stamps appear in a read's response: their policy must be
/// loaded before [`filter_read`].
pub fn subjects_in(response: &Value) -> BTreeSet<(String, String)> {
    let mut found = BTreeSet::new();
    let mut visit = |meta: &Value| {
        if let Some(stamp) = read_stamp(meta) {
            found.insert((stamp.tenant, stamp.subject));
        }
    };
    if let Some(Value::Array(metas)) = response.get("metadatas") {
        for meta in metas {
            match meta {
                Value::Array(inner) => inner.iter().for_each(&mut visit),
                other => visit(other),
            }
        }
    }
    found
}

/// Keeps the entries at `keep` of every parallel array in `map`.
fn retain_parallel(map: &mut Map<String, Value>, keep: &[bool]) {
    for key in PARALLEL {
        if let Some(Value::Array(items)) = map.get_mut(key) {
            let mut flags = keep.iter();
            items.retain(|_| flags.next().copied().unwrap_or(false));
        }
    }
}

/// Drops every record the caller may not read (its stamp refused, or hidden by an erasure's
/// closure), keeping the parallel arrays aligned (per query for `query`). Fails closed: an
/// answer whose arrays do not line up is not passed on. The metadatas Lethe asked for stay until
/// [`strip_added`].
pub fn filter_read(
    response: Value,
    plan: &ReadPlan,
    view: &impl PolicyView,
    ctx: &ReadContext<'_>,
    now: DateTime<Utc>,
) -> Result<Value, AdapterError> {
    let Value::Object(mut map) = response else {
        return Err(AdapterError::UpstreamInvalid("not a JSON object".into()));
    };
    let decide = |id: Option<&Value>, meta: Option<&Value>| {
        let stamp = meta.and_then(read_stamp);
        let id = id.and_then(Value::as_str).unwrap_or_default();
        decide_read_item(view, ctx, &plan.collection, id, stamp.as_ref(), now).is_ok()
    };
    let ids = map
        .get("ids")
        .and_then(Value::as_array)
        .map(Vec::len)
        .ok_or_else(|| AdapterError::UpstreamInvalid("ids missing".into()))?;
    check_parallel(&map, ids, plan.nested).map_err(AdapterError::UpstreamInvalid)?;
    if plan.nested {
        // Split each query's slice out, filter it as a flat answer, put it back.
        for q in 0..ids {
            let mut slice = Map::new();
            for key in PARALLEL {
                if let Some(Value::Array(outer)) = map.get_mut(key)
                    && let Some(inner) = outer.get_mut(q)
                {
                    slice.insert(key.into(), inner.take());
                }
            }
            let keep = kept(&slice, &decide);
            retain_parallel(&mut slice, &keep);
            for (key, value) in slice {
                if let Some(Value::Array(outer)) = map.get_mut(&key)
                    && let Some(slot) = outer.get_mut(q)
                {
                    *slot = value;
                }
            }
        }
    } else {
        let keep = kept(&map, &decide);
        retain_parallel(&mut map, &keep);
    }
    Ok(Value::Object(map))
}

/// Which records of a flat answer `decide` keeps.
fn kept(
    flat: &Map<String, Value>,
    decide: &impl Fn(Option<&Value>, Option<&Value>) -> bool,
) -> Vec<bool> {
    let ids = flat.get("ids").and_then(Value::as_array);
    let metas = flat.get("metadatas").and_then(Value::as_array);
    (0..ids.map_or(0, Vec::len))
        .map(|i| decide(ids.and_then(|a| a.get(i)), metas.and_then(|m| m.get(i))))
        .collect()
}

/// The records a filtered answer serves, every query's of a `query`.
pub fn served(answer: &Value, plan: &ReadPlan) -> Vec<ServedRecord> {
    let lists = |key: &str| -> Vec<Option<&Vec<Value>>> {
        match answer.get(key).and_then(Value::as_array) {
            Some(outer) if plan.nested => outer.iter().map(Value::as_array).collect(),
            Some(flat) => vec![Some(flat)],
            None => Vec::new(),
        }
    };
    let (ids, metas, documents) = (lists("ids"), lists("metadatas"), lists("documents"));
    let mut served = Vec::new();
    fn at<'v>(lists: &[Option<&'v Vec<Value>>], q: usize, i: usize) -> Option<&'v Value> {
        lists.get(q).copied().flatten().and_then(|l| l.get(i))
    }
    for (q, ids) in ids.iter().enumerate() {
        let Some(ids) = ids else { continue };
        for (i, id) in ids.iter().enumerate() {
            let stamp = at(&metas, q, i).and_then(read_stamp);
            let (Some(id), Some(stamp)) = (id.as_str(), stamp) else {
                continue;
            };
            let document = at(&documents, q, i).and_then(Value::as_str);
            served.push(ServedRecord {
                id: id.to_owned(),
                owner: stamp.subject,
                document: document.unwrap_or_default().to_owned(),
            });
        }
    }
    served
}

/// Takes the metadatas Lethe asked for, and the client did not, out of a filtered answer.
pub fn strip_added(answer: &mut Value, plan: &ReadPlan) {
    if !plan.strip_metadatas {
        return;
    }
    if let Value::Object(map) = answer {
        map.insert("metadatas".into(), Value::Null);
        if let Some(Value::Array(include)) = map.get_mut("include") {
            include.retain(|v| v != "metadatas");
        }
    }
}

pub mod isolate;

#[cfg(test)]
mod tests;
