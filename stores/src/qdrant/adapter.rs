//! Qdrant's REST API (1.16): pure functions over its JSON.
//!
//! Points are decided one by one and stamped in their payload. Every read is narrowed with a
//! filter Qdrant evaluates: the client's filter, nested whole, AND the caller's tenant, bound
//! subject and unexpired points, at the top and in every `prefetch`. Every returned point is then
//! decided again. Retrievals by id, counts and deletes are answered from a narrowed scroll, so
//! they never reveal or touch a point the caller may not see. Point ids must be canonical
//! (unsigned integers, or lowercase hyphenated UUIDs): Qdrant takes five spellings of one UUID
//! for one point.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use hyper::Method;
use lethe_policy::{Overwrite, PolicyView, Stamp};
use serde_json::{Map, Value, json};

use crate::data::records::{AdapterError, Scope};
use crate::kit::stamp::{
    EXPIRES_AT, SUBJECT, TENANT, parse_object, read_stamp, string_field, write_stamp,
};
use crate::kit::text::text_of_fields;
use crate::kit::write::{decide_records, record_facts};
use edit::EditKind;
use read::{SearchKind, SearchShape};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// The version check, health, and collection reads.
    PassThrough,
    /// Creating, changing and deleting collections, their indexes and aliases.
    Admin,
    /// Creating a collection (admin): Lethe then indexes the stamp, which every read filters on.
    CreateCollection {
        collection: String,
    },
    /// A collection name or point id not in its canonical form.
    NonCanonical,
    Upsert {
        collection: String,
    },
    /// A search of any API (`query`, `search`, `recommend`, `discover`), single or groups.
    Search {
        collection: String,
        shape: SearchShape,
    },
    /// A batch of searches of one API.
    SearchBatch {
        collection: String,
        shape: SearchShape,
    },
    /// The distance matrix of a sample of points, as pairs or as offsets.
    Matrix {
        collection: String,
        pairs: bool,
    },
    /// Counts of a payload key's values.
    Facet {
        collection: String,
    },
    Scroll {
        collection: String,
    },
    Count {
        collection: String,
    },
    Retrieve {
        collection: String,
    },
    GetPoint {
        collection: String,
        id: PointId,
    },
    Delete {
        collection: String,
    },
    /// A payload or vector edit of points named by id or selected by filter.
    Edit {
        collection: String,
        kind: EditKind,
    },
    /// `points/batch`: upserts, deletes and edits in order.
    Batch {
        collection: String,
    },
    /// Everything else: snapshots, shards, cluster and debug endpoints.
    Refused,
}

/// A collection name as Lethe lets it through: letters, digits, `_`, `-` and `.`, at most 255
/// bytes, not `.` or `..`.
pub fn canonical_collection(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

fn search_kind(api: &str) -> Option<SearchKind> {
    match api {
        "query" => Some(SearchKind::Query),
        "search" => Some(SearchKind::Search),
        "recommend" => Some(SearchKind::Recommend),
        "discover" => Some(SearchKind::Discover),
        _ => None,
    }
}

pub fn classify(method: &Method, path: &str) -> Endpoint {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let get = method == Method::GET;
    match segments.as_slice() {
        [""] | ["readyz"] | ["healthz"] | ["livez"] if get => Endpoint::PassThrough,
        ["collections"] | ["aliases"] if get => Endpoint::PassThrough,
        ["collections", "aliases"] if method == Method::POST => Endpoint::Admin,
        ["collections", c, rest @ ..] if !canonical_collection(c) => {
            let _ = rest;
            Endpoint::NonCanonical
        }
        ["collections", _] | ["collections", _, "exists"] | ["collections", _, "aliases"]
            if get =>
        {
            Endpoint::PassThrough
        }
        ["collections", c] if method == Method::PUT => Endpoint::CreateCollection {
            collection: (*c).to_owned(),
        },
        ["collections", _] if matches!(*method, Method::PATCH | Method::DELETE) => Endpoint::Admin,
        ["collections", _, "index"] if method == Method::PUT => Endpoint::Admin,
        ["collections", _, "index", _] if method == Method::DELETE => Endpoint::Admin,
        ["collections", c, "points"] => {
            let collection = (*c).to_owned();
            match *method {
                Method::PUT => Endpoint::Upsert { collection },
                Method::POST => Endpoint::Retrieve { collection },
                _ => Endpoint::Refused,
            }
        }
        ["collections", c, "points", id] if get => match PointId::parse_segment(id) {
            Some(id) => Endpoint::GetPoint {
                collection: (*c).to_owned(),
                id,
            },
            None => Endpoint::NonCanonical,
        },
        ["collections", c, "facet"] if method == Method::POST => Endpoint::Facet {
            collection: (*c).to_owned(),
        },
        ["collections", c, "points", "search", "matrix", form] if method == Method::POST => {
            match *form {
                "pairs" | "offsets" => Endpoint::Matrix {
                    collection: (*c).to_owned(),
                    pairs: *form == "pairs",
                },
                _ => Endpoint::Refused,
            }
        }
        ["collections", c, "points", api, rest @ ..]
            if method == Method::POST && search_kind(api).is_some() && rest.len() <= 1 =>
        {
            search_endpoint(c, api, rest)
        }
        ["collections", c, "points", what, end @ ("delete" | "clear")]
            if method == Method::POST =>
        {
            match (*what, *end) {
                ("payload", "delete") => edit(c, EditKind::DeletePayload),
                ("payload", _) => edit(c, EditKind::ClearPayload),
                ("vectors", "delete") => edit(c, EditKind::DeleteVectors),
                _ => Endpoint::Refused,
            }
        }
        ["collections", c, "points", "payload"] if method == Method::PUT => {
            edit(c, EditKind::OverwritePayload)
        }
        ["collections", c, "points", "vectors"] if method == Method::PUT => {
            edit(c, EditKind::UpdateVectors)
        }
        ["collections", c, "points", op] if method == Method::POST => {
            let collection = (*c).to_owned();
            match *op {
                "scroll" => Endpoint::Scroll { collection },
                "count" => Endpoint::Count { collection },
                "delete" => Endpoint::Delete { collection },
                "payload" => edit(c, EditKind::SetPayload),
                "batch" => Endpoint::Batch { collection },
                _ => Endpoint::Refused,
            }
        }
        _ => Endpoint::Refused,
    }
}

fn edit(collection: &str, kind: EditKind) -> Endpoint {
    Endpoint::Edit {
        collection: collection.to_owned(),
        kind,
    }
}

/// `POST /collections/{c}/points/{api}[/batch|/groups]`: a search of one of the kinds Lethe
/// serves, one or a batch, grouped or not (a discovery has no groups).
fn search_endpoint(collection: &str, api: &str, rest: &[&str]) -> Endpoint {
    let Some(kind) = search_kind(api) else {
        return Endpoint::Refused;
    };
    let collection = collection.to_owned();
    let shape = |groups| SearchShape { kind, groups };
    match rest {
        [] => Endpoint::Search {
            collection,
            shape: shape(false),
        },
        ["batch"] => Endpoint::SearchBatch {
            collection,
            shape: shape(false),
        },
        ["groups"] if kind != SearchKind::Discover => Endpoint::Search {
            collection,
            shape: shape(true),
        },
        _ => Endpoint::Refused,
    }
}

/// The payload indexes of the stamp keys every read filters on (measured on 1.16.3: without
/// them a filtered query costs Qdrant about 3 times an unfiltered one), as
/// `PUT /collections/{c}/index` bodies.
pub fn stamp_indexes() -> [Value; 3] {
    [
        json!({ "field_name": TENANT, "field_schema": "keyword" }),
        json!({ "field_name": SUBJECT, "field_schema": "keyword" }),
        json!({ "field_name": EXPIRES_AT, "field_schema": "integer" }),
    ]
}

/// A point id in its canonical form: an unsigned integer, or a lowercase hyphenated UUID.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum PointId {
    Number(u64),
    Uuid(String),
}

impl PointId {
    /// The id as the client wrote it in JSON, if canonical.
    pub fn parse(value: &Value) -> Option<PointId> {
        match value {
            Value::Number(n) => n.as_u64().map(PointId::Number),
            Value::String(s) => canonical_uuid(s).then(|| PointId::Uuid(s.clone())),
            _ => None,
        }
    }

    /// The id in a path: digits, or a canonical UUID.
    fn parse_segment(segment: &str) -> Option<PointId> {
        if !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit()) {
            return segment.parse().ok().map(PointId::Number);
        }
        canonical_uuid(segment).then(|| PointId::Uuid(segment.to_owned()))
    }

    pub fn to_json(&self) -> Value {
        match self {
            PointId::Number(n) => json!(n),
            PointId::Uuid(u) => json!(u),
        }
    }

    /// The id as lineage keeps it (a number in decimal; Qdrant has no numeric-string ids, so the
    /// two never meet).
    pub fn key(&self) -> String {
        match self {
            PointId::Number(n) => n.to_string(),
            PointId::Uuid(u) => u.clone(),
        }
    }

    /// A lineage key read back as an id.
    pub fn from_key(key: &str) -> Option<PointId> {
        PointId::parse_segment(key)
    }
}

fn canonical_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_digit() || (b'a'..=b'f').contains(c),
        })
}

fn invalid(message: impl Into<String>) -> AdapterError {
    AdapterError::Invalid(message.into())
}

/// Refuses a body key Lethe does not govern (Qdrant ignores unknown ones silently).
fn only_keys(map: &Map<String, Value>, allowed: &[&str], what: &str) -> Result<(), AdapterError> {
    match map.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(key) => Err(invalid(format!(
            "{what}: {key} is not supported through Lethe"
        ))),
        None => Ok(()),
    }
}

/// Whose each point of an answer is (its stamp's subject), by id: read before the answer is cut
/// to what the client asked for.
pub fn owners_of(answer: &Value) -> BTreeMap<String, String> {
    let mut owners = BTreeMap::new();
    each_point(answer, &mut |point| {
        let id = point.get("id").and_then(PointId::parse);
        let stamp = point.get("payload").and_then(read_stamp);
        if let (Some(id), Some(stamp)) = (id, stamp) {
            owners.insert(id.key(), stamp.subject);
        }
    });
    owners
}

/// The points a decided answer serves: (id, whose it is, the text it reached the client with).
pub fn served_points(
    decided: &Value,
    owners: &BTreeMap<String, String>,
    text_fields: &[String],
) -> Vec<(String, String, String)> {
    let mut served = Vec::new();
    each_point(decided, &mut |point| {
        let Some(id) = point.get("id").and_then(PointId::parse).map(|id| id.key()) else {
            return;
        };
        if let Some(owner) = owners.get(&id) {
            let payload = point.get("payload").and_then(Value::as_object);
            served.push((id, owner.clone(), text_of_fields(payload, text_fields)));
        }
    });
    served
}

/// The conditions every read carries: the caller's tenant, its bound subject, not expired.
fn scope_conditions(tenant: &str, bound: Option<&str>, now: Option<DateTime<Utc>>) -> Vec<Value> {
    let mut conditions = vec![json!({ "key": TENANT, "match": { "value": tenant } })];
    if let Some(subject) = bound {
        conditions.push(json!({ "key": SUBJECT, "match": { "value": subject } }));
    }
    if let Some(now) = now {
        conditions.push(json!({ "key": EXPIRES_AT, "range": { "gt": now.timestamp() } }));
    }
    conditions
}

/// The client's filter (kept whole, as one nested condition: adding to its `should` would widen
/// it) AND the scope's conditions.
fn narrowed(filter: Option<&Value>, conditions: &[Value]) -> Result<Value, AdapterError> {
    let mut must = Vec::with_capacity(conditions.len() + 1);
    match filter {
        None | Some(Value::Null) => {}
        Some(f @ Value::Object(_)) => must.push(f.clone()),
        Some(_) => return Err(invalid("filter must be an object")),
    }
    must.extend(conditions.iter().cloned());
    Ok(json!({ "must": must }))
}

/// What the client asked to see of each point's payload; Lethe always reads the payload (the
/// stamp decides) and cuts the answer back to this.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PayloadWanted {
    #[default]
    None,
    All,
    /// Payload key paths, cut as Qdrant cuts them.
    Keys(Vec<String>),
}

impl PayloadWanted {
    fn of(value: Option<&Value>, default: PayloadWanted) -> Result<PayloadWanted, AdapterError> {
        match value {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(false)) => Ok(PayloadWanted::None),
            Some(Value::Bool(true)) => Ok(PayloadWanted::All),
            Some(Value::Array(keys)) => {
                let keys = keys
                    .iter()
                    .map(|k| k.as_str().map(str::to_owned))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| invalid("with_payload: a list of keys must hold strings"))?;
                if keys.iter().any(|k| key_path::parse(k).is_err()) {
                    return Err(invalid(
                        "with_payload: every key must be a payload key path Qdrant accepts",
                    ));
                }
                Ok(PayloadWanted::Keys(keys))
            }
            Some(_) => Err(invalid(
                "with_payload must be true, false or a list of keys through Lethe",
            )),
        }
    }

    fn cut(&self, point: &mut Map<String, Value>) {
        match self {
            PayloadWanted::All => {}
            PayloadWanted::None => {
                point.remove("payload");
            }
            PayloadWanted::Keys(keys) => {
                if let Some(Value::Object(p)) = point.get_mut("payload") {
                    // As Qdrant cuts it: quoted keys, nested paths and `[]` read as Qdrant reads them.
                    let paths: Vec<key_path::Path<'_>> = keys
                        .iter()
                        .filter_map(|k| key_path::parse(k).ok())
                        .collect();
                    *p = key_path::include(p, &paths);
                }
            }
        }
    }
}

/// What a read must decide before it is sent, and how its answer is cut back.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReadPlan {
    /// The collection read: its points are decided as the items they are.
    pub collection: String,
    /// Which of the points' payloads the client wanted.
    pub payload: PayloadWanted,
    /// The points the request names (as a query vector or an example), by collection (`None`:
    /// the request's own): each must be the caller's to read.
    pub refs: Vec<(Option<String>, PointId)>,
    /// What the client wanted of each group's looked-up point, if it asked for one, and the
    /// collection it is looked up in.
    pub lookup: Option<PayloadWanted>,
    pub lookup_collection: String,
}

/// Narrows a `points/scroll` body.
pub fn narrow_scroll_body(
    body: &[u8],
    tenant: &str,
    bound: Option<&str>,
    now: DateTime<Utc>,
) -> Result<(Vec<u8>, ReadPlan), AdapterError> {
    let mut map = parse_object(body)?;
    only_keys(
        &map,
        &[
            "filter",
            "limit",
            "offset",
            "with_payload",
            "with_vector",
            "order_by",
        ],
        "scroll",
    )?;
    let payload = PayloadWanted::of(map.get("with_payload"), PayloadWanted::All)?;
    let filter = narrowed(
        map.get("filter"),
        &scope_conditions(tenant, bound, Some(now)),
    )?;
    map.insert("filter".into(), filter);
    map.insert("with_payload".into(), json!(true));
    Ok((
        serde_json::to_vec(&map).unwrap_or_default(),
        ReadPlan {
            payload,
            ..ReadPlan::default()
        },
    ))
}

/// Which points a retrieval, count or delete names: these ids, or those a filter selects.
#[derive(Debug, Clone, Copy, Default)]
pub struct Selection<'a> {
    pub ids: Option<&'a [PointId]>,
    pub filter: Option<&'a Value>,
}

/// A scroll of the points in scope among the `selection`, reading the stamps and the vectors if
/// asked; one page of `limit` from `offset`.
pub fn scoped_scroll(
    Selection { ids, filter }: Selection<'_>,
    tenant: &str,
    bound: Option<&str>,
    now: Option<DateTime<Utc>>,
    limit: usize,
    offset: Option<&Value>,
    with_vector: &Value,
) -> Result<Vec<u8>, AdapterError> {
    let mut conditions = scope_conditions(tenant, bound, now);
    if let Some(ids) = ids {
        conditions.push(json!({ "has_id": ids.iter().map(PointId::to_json).collect::<Vec<_>>() }));
    }
    let mut body = json!({
        "filter": narrowed(filter, &conditions)?,
        "limit": limit,
        "with_payload": true,
        "with_vector": with_vector,
    });
    if let Some(offset) = offset.filter(|o| !o.is_null()) {
        body["offset"] = offset.clone();
    }
    Ok(body.to_string().into_bytes())
}

/// A retrieval by ids (`POST .../points`): its ids, what payload it wants and whether vectors.
pub fn parse_retrieve(body: &[u8]) -> Result<(Vec<PointId>, PayloadWanted, Value), AdapterError> {
    let map = parse_object(body)?;
    only_keys(&map, &["ids", "with_payload", "with_vector"], "retrieve")?;
    let ids = canonical_ids(map.get("ids"), "ids")?;
    // The REST API's default is no payload.
    let payload = PayloadWanted::of(map.get("with_payload"), PayloadWanted::None)?;
    let with_vector = map.get("with_vector").cloned().unwrap_or(json!(false));
    Ok((ids, payload, with_vector))
}

fn canonical_ids(value: Option<&Value>, what: &str) -> Result<Vec<PointId>, AdapterError> {
    let Some(Value::Array(ids)) = value else {
        return Err(invalid(format!("{what} must be a list of point ids")));
    };
    let ids: Option<BTreeSet<PointId>> = ids.iter().map(PointId::parse).collect();
    ids.map(|ids| ids.into_iter().collect()).ok_or_else(|| {
        invalid(format!(
            "{what}: point ids are unsigned integers or lowercase, hyphenated UUIDs"
        ))
    })
}

/// What a delete names: ids, or a filter (never both: Qdrant would ignore the filter).
pub fn parse_delete(body: &[u8]) -> Result<(Option<Vec<PointId>>, Option<Value>), AdapterError> {
    let map = parse_object(body)?;
    only_keys(&map, &["points", "filter"], "delete")?;
    match (map.get("points"), map.get("filter")) {
        (Some(points), None) => Ok((Some(canonical_ids(Some(points), "points")?), None)),
        (None, Some(filter @ Value::Object(_))) => Ok((None, Some(filter.clone()))),
        _ => Err(invalid("delete: name either points or a filter")),
    }
}

/// The filter of a count (`exact` is Lethe's to decide: it counts what it may show).
pub fn parse_count(body: &[u8]) -> Result<Option<Value>, AdapterError> {
    let map = parse_object(body)?;
    only_keys(&map, &["filter", "exact"], "count")?;
    match map.get("filter") {
        None | Some(Value::Null) => Ok(None),
        Some(f @ Value::Object(_)) => Ok(Some(f.clone())),
        Some(_) => Err(invalid("count: filter must be an object")),
    }
}

/// The `(tenant, subject)` of every stamped point anywhere in an answer (hits, groups, lookups,
/// batches).
pub fn subjects_in(answer: &Value) -> BTreeSet<(String, String)> {
    fn visit(value: &Value, found: &mut BTreeSet<(String, String)>) {
        match value {
            Value::Object(m) => {
                if let Some(stamp) = m.get("payload").and_then(read_stamp) {
                    found.insert((stamp.tenant, stamp.subject));
                }
                m.values().for_each(|v| visit(v, found));
            }
            Value::Array(xs) => xs.iter().for_each(|v| visit(v, found)),
            _ => {}
        }
    }
    let mut found = BTreeSet::new();
    if let Some(result) = answer.get("result") {
        visit(result, &mut found);
    }
    found
}

/// The ids of the points in an answer.
pub fn ids_in(answer: &[u8]) -> Result<Vec<PointId>, AdapterError> {
    let value: Value = serde_json::from_slice(answer)
        .map_err(|_| AdapterError::UpstreamInvalid("not JSON".into()))?;
    answer_points(&value)?
        .iter()
        .map(|p| {
            p.get("id").and_then(PointId::parse).ok_or_else(|| {
                AdapterError::UpstreamInvalid("a point without a canonical id".into())
            })
        })
        .collect()
}

/// A scroll answer's next page, if any.
pub fn next_page(answer: &Value) -> Option<Value> {
    answer
        .get("result")?
        .get("next_page_offset")
        .filter(|o| !o.is_null())
        .cloned()
}

/// The filter that finds the points stamped as any of a subject's keys in a tenant.
pub fn stamped_by(tenant: &str, keys: &[String]) -> Value {
    json!({ "must": [
        { "key": TENANT, "match": { "value": tenant } },
        { "key": SUBJECT, "match": { "any": keys } },
    ] })
}

pub mod edit;
pub mod isolate;
pub mod key_path;
pub mod read;
mod upsert;

pub use upsert::{
    PlannedUpsert, PointFacts, StampedUpsert, apply_upsert, check_upsert, held_query, held_stamps,
    plan_upsert,
};
use upsert::{answer_points, each_point, plan_upsert_map, stamp_points};

#[cfg(test)]
mod tests;
