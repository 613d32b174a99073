//! Searches: `query` (single, batch, groups) and the older `search`, `recommend` and `discover`
//! routes the server still serves (single, batch, groups).
//!
//! Every request is narrowed where it filters: at the top and in every `prefetch`. A point the
//! request names (an id as the query vector, a recommend or discover example, in this
//! collection or in `lookup_from`'s) is collected so that it is decided before the request is
//! sent; a group's `with_lookup` point is decided in the answer like every hit.

use chrono::{DateTime, Utc};
use lethe_policy::{PolicyView, ReadContext, decide_read_item};
use serde_json::{Map, Value, json};

use super::{
    PayloadWanted, PointId, ReadPlan, canonical_collection, invalid, key_path, narrowed, only_keys,
    scope_conditions,
};
use crate::data::records::AdapterError;
use crate::kit::stamp::{parse_object, read_stamp};

/// Which search API a request speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchKind {
    Query,
    Search,
    Recommend,
    Discover,
}

/// One search endpoint: its API and whether it answers groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SearchShape {
    pub kind: SearchKind,
    pub groups: bool,
}

impl SearchShape {
    /// The keys a request (or, for `query`, a prefetch) may carry.
    fn keys(self, prefetch: bool) -> Vec<&'static str> {
        let mut keys = match self.kind {
            SearchKind::Query if prefetch => vec![
                "prefetch",
                "query",
                "using",
                "filter",
                "params",
                "score_threshold",
                "limit",
                "lookup_from",
            ],
            SearchKind::Query => vec![
                "prefetch",
                "query",
                "using",
                "filter",
                "params",
                "score_threshold",
                "limit",
                "offset",
                "with_payload",
                "with_vector",
                "lookup_from",
            ],
            SearchKind::Search => vec![
                "vector",
                "filter",
                "params",
                "limit",
                "offset",
                "with_payload",
                "with_vector",
                "score_threshold",
            ],
            SearchKind::Recommend => vec![
                "positive",
                "negative",
                "strategy",
                "filter",
                "params",
                "limit",
                "offset",
                "with_payload",
                "with_vector",
                "score_threshold",
                "using",
                "lookup_from",
            ],
            SearchKind::Discover => vec![
                "target",
                "context",
                "filter",
                "params",
                "limit",
                "offset",
                "with_payload",
                "with_vector",
                "using",
                "lookup_from",
            ],
        };
        if self.groups && !prefetch {
            keys.retain(|k| *k != "offset");
            keys.extend(["group_by", "group_size", "with_lookup"]);
        }
        keys
    }
}

/// Where the points a request names live: `lookup_from`'s collection, else the request's own.
fn lookup_collection(map: &Map<String, Value>, at: &str) -> Result<Option<String>, AdapterError> {
    match map.get("lookup_from") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(l)) => {
            only_keys(l, &["collection", "vector"], &format!("{at}.lookup_from"))?;
            match l.get("collection") {
                Some(Value::String(c)) if canonical_collection(c) => Ok(Some(c.clone())),
                _ => Err(invalid(format!(
                    "{at}.lookup_from.collection must be a collection name"
                ))),
            }
        }
        Some(_) => Err(invalid(format!("{at}.lookup_from must be an object"))),
    }
}

/// Collects the points a request names, checking that everything else is a vector.
struct Refs<'a> {
    plan: &'a mut ReadPlan,
    collection: Option<String>,
}

impl Refs<'_> {
    /// A dense, multi or sparse vector, or a point id (then collected).
    fn vector_input(&mut self, v: &Value, at: &str) -> Result<(), AdapterError> {
        match v {
            Value::Array(xs) if xs.iter().all(|x| x.is_number() || x.is_array()) => Ok(()),
            Value::Object(m) if m.contains_key("indices") && m.contains_key("values") => Ok(()),
            Value::Number(_) | Value::String(_) => match PointId::parse(v) {
                Some(id) => {
                    self.plan.refs.push((self.collection.clone(), id));
                    Ok(())
                }
                None => Err(invalid(format!(
                    "{at}: point ids are unsigned integers or lowercase, hyphenated UUIDs"
                ))),
            },
            _ => Err(invalid(format!(
                "{at}: a vector, a sparse vector or a point id (documents and images for inference are not supported through Lethe)"
            ))),
        }
    }

    fn examples(&mut self, v: Option<&Value>, at: &str) -> Result<(), AdapterError> {
        match v {
            None | Some(Value::Null) => Ok(()),
            Some(Value::Array(xs)) => xs
                .iter()
                .enumerate()
                .try_for_each(|(i, x)| self.vector_input(x, &format!("{at}[{i}]"))),
            Some(_) => Err(invalid(format!("{at} must be a list"))),
        }
    }

    /// A context pair, or a list of them.
    fn context(&mut self, v: &Value, at: &str) -> Result<(), AdapterError> {
        let pairs = match v {
            Value::Array(pairs) => pairs.iter().collect(),
            pair => vec![pair],
        };
        for (i, pair) in pairs.into_iter().enumerate() {
            let at = format!("{at}[{i}]");
            let Value::Object(pair) = pair else {
                return Err(invalid(format!(
                    "{at} must be a pair of positive and negative"
                )));
            };
            only_keys(pair, &["positive", "negative"], &at)?;
            for side in ["positive", "negative"] {
                match pair.get(side) {
                    Some(v) => self.vector_input(v, &format!("{at}.{side}"))?,
                    None => return Err(invalid(format!("{at}.{side} is missing"))),
                }
            }
        }
        Ok(())
    }

    /// The `query` of the query API.
    fn query(&mut self, q: Option<&Value>, at: &str) -> Result<(), AdapterError> {
        let Some(q) = q.filter(|q| !q.is_null()) else {
            return Ok(());
        };
        let Value::Object(m) = q else {
            return self.vector_input(q, at);
        };
        if m.contains_key("indices") {
            return self.vector_input(q, at);
        }
        let at = format!("{at}.query");
        if let Some(nearest) = m.get("nearest") {
            only_keys(m, &["nearest", "mmr"], &at)?;
            return self.vector_input(nearest, &format!("{at}.nearest"));
        }
        if m.contains_key("formula") {
            return only_keys(m, &["formula", "defaults"], &at);
        }
        if m.len() != 1 {
            return Err(invalid(format!("{at}: one kind of query")));
        }
        let Some((kind, body)) = m.iter().next() else {
            return Ok(());
        };
        match (kind.as_str(), body) {
            ("recommend", Value::Object(r)) => {
                only_keys(r, &["positive", "negative", "strategy"], &at)?;
                self.examples(r.get("positive"), &format!("{at}.positive"))?;
                self.examples(r.get("negative"), &format!("{at}.negative"))
            }
            ("discover", Value::Object(d)) => {
                only_keys(d, &["target", "context"], &at)?;
                match d.get("target") {
                    Some(t) => self.vector_input(t, &format!("{at}.target"))?,
                    None => return Err(invalid(format!("{at}.target is missing"))),
                }
                match d.get("context") {
                    Some(c) => self.context(c, &format!("{at}.context")),
                    None => Err(invalid(format!("{at}.context is missing"))),
                }
            }
            ("context", c) => self.context(c, &format!("{at}.context")),
            ("order_by", Value::String(_) | Value::Object(_)) => Ok(()),
            ("fusion", Value::String(f)) if f == "rrf" || f == "dbsf" => Ok(()),
            ("rrf", Value::Object(_)) => Ok(()),
            ("sample", Value::String(s)) if s == "random" => Ok(()),
            _ => Err(invalid(format!(
                "{at}: {kind} is not a query Lethe governs"
            ))),
        }
    }

    /// The `vector` of the older search API: a vector, or a named one; never a point.
    fn named_vector(v: Option<&Value>, at: &str) -> Result<(), AdapterError> {
        let plain = |v: &Value| match v {
            Value::Array(xs) => xs.iter().all(|x| x.is_number() || x.is_array()),
            Value::Object(m) => m.contains_key("indices") && m.contains_key("values"),
            _ => false,
        };
        match v {
            Some(v) if plain(v) => Ok(()),
            Some(Value::Object(m)) if m.get("vector").is_some_and(plain) => {
                only_keys(m, &["name", "vector"], at)
            }
            _ => Err(invalid(format!("{at}.vector must be a vector"))),
        }
    }
}

/// Narrows one request or prefetch (and every prefetch inside it), and collects what it names.
fn narrow(
    map: &mut Map<String, Value>,
    shape: SearchShape,
    conditions: &[Value],
    at: &str,
    plan: &mut ReadPlan,
    prefetch: bool,
) -> Result<(), AdapterError> {
    only_keys(map, &shape.keys(prefetch), at)?;
    let mut refs = Refs {
        collection: lookup_collection(map, at)?,
        plan: &mut *plan,
    };
    match shape.kind {
        SearchKind::Query => refs.query(map.get("query"), at)?,
        SearchKind::Search => Refs::named_vector(map.get("vector"), at)?,
        SearchKind::Recommend => {
            refs.examples(map.get("positive"), &format!("{at}.positive"))?;
            refs.examples(map.get("negative"), &format!("{at}.negative"))?;
        }
        SearchKind::Discover => {
            if let Some(t) = map.get("target").filter(|t| !t.is_null()) {
                refs.vector_input(t, &format!("{at}.target"))?;
            }
            if let Some(c) = map.get("context").filter(|c| !c.is_null()) {
                refs.context(c, &format!("{at}.context"))?;
            }
        }
    }
    let filter = narrowed(map.get("filter"), conditions)?;
    map.insert("filter".into(), filter);
    match map.get_mut("prefetch") {
        None | Some(Value::Null) => {}
        Some(Value::Object(p)) => {
            narrow(p, shape, conditions, &format!("{at}.prefetch"), plan, true)?;
        }
        Some(Value::Array(ps)) => {
            for (i, p) in ps.iter_mut().enumerate() {
                let Value::Object(p) = p else {
                    return Err(invalid(format!("{at}.prefetch[{i}] must be an object")));
                };
                narrow(
                    p,
                    shape,
                    conditions,
                    &format!("{at}.prefetch[{i}]"),
                    plan,
                    true,
                )?;
            }
        }
        Some(_) => {
            return Err(invalid(format!(
                "{at}.prefetch must be an object or a list"
            )));
        }
    }
    if !prefetch {
        plan.payload = PayloadWanted::of(map.get("with_payload"), PayloadWanted::None)?;
        map.insert("with_payload".into(), json!(true));
        if shape.groups {
            with_lookup(map, plan, at)?;
        }
    }
    Ok(())
}

/// A group's looked-up point is read with its stamp, so that it can be decided.
fn with_lookup(
    map: &mut Map<String, Value>,
    plan: &mut ReadPlan,
    at: &str,
) -> Result<(), AdapterError> {
    let (collection, payload, vectors) = match map.get("with_lookup") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::String(c)) => (c.clone(), PayloadWanted::All, json!(false)),
        Some(Value::Object(l)) => {
            only_keys(
                l,
                &["collection", "with_payload", "with_vectors"],
                &format!("{at}.with_lookup"),
            )?;
            let Some(Value::String(c)) = l.get("collection") else {
                return Err(invalid(format!(
                    "{at}.with_lookup.collection must be a name"
                )));
            };
            (
                c.clone(),
                PayloadWanted::of(l.get("with_payload"), PayloadWanted::All)?,
                l.get("with_vectors").cloned().unwrap_or(json!(false)),
            )
        }
        Some(_) => {
            return Err(invalid(format!(
                "{at}.with_lookup must be a collection or an object"
            )));
        }
    };
    if !canonical_collection(&collection) {
        return Err(invalid(format!(
            "{at}.with_lookup.collection must be a collection name"
        )));
    }
    plan.lookup = Some(payload);
    plan.lookup_collection = collection.clone();
    map.insert(
        "with_lookup".into(),
        json!({ "collection": collection, "with_payload": true, "with_vectors": vectors }),
    );
    Ok(())
}

/// Narrows a search body; answers it with what to decide first and what to cut from the answer.
pub fn narrow_search_body(
    body: &[u8],
    shape: SearchShape,
    tenant: &str,
    bound: Option<&str>,
    now: DateTime<Utc>,
) -> Result<(Vec<u8>, ReadPlan), AdapterError> {
    let mut map = parse_object(body)?;
    let mut plan = ReadPlan::default();
    let conditions = scope_conditions(tenant, bound, Some(now));
    narrow(&mut map, shape, &conditions, "query", &mut plan, false)?;
    Ok((serde_json::to_vec(&map).unwrap_or_default(), plan))
}

/// Narrows a batch of searches (`{"searches": [...]}`), each as one.
pub fn narrow_search_batch_body(
    body: &[u8],
    shape: SearchShape,
    tenant: &str,
    bound: Option<&str>,
    now: DateTime<Utc>,
) -> Result<(Vec<u8>, Vec<ReadPlan>), AdapterError> {
    let mut map = parse_object(body)?;
    only_keys(&map, &["searches"], "batch")?;
    let Some(Value::Array(searches)) = map.get_mut("searches") else {
        return Err(invalid("batch: searches must be a list"));
    };
    let conditions = scope_conditions(tenant, bound, Some(now));
    let mut plans = Vec::with_capacity(searches.len());
    for (i, search) in searches.iter_mut().enumerate() {
        let Value::Object(search) = search else {
            return Err(invalid(format!("searches[{i}] must be an object")));
        };
        let mut plan = ReadPlan::default();
        narrow(
            search,
            shape,
            &conditions,
            &format!("searches[{i}]"),
            &mut plan,
            false,
        )?;
        plans.push(plan);
    }
    Ok((serde_json::to_vec(&map).unwrap_or_default(), plans))
}

/// Whether the reader may see a point of an answer of `collection` (its stamp decides, unless
/// an erasure's closure hides it).
fn readable(
    point: &Value,
    collection: &str,
    view: &impl PolicyView,
    ctx: &ReadContext<'_>,
    now: DateTime<Utc>,
) -> bool {
    let stamp = point.get("payload").and_then(read_stamp);
    let id = point.get("id").and_then(PointId::parse).map(|id| id.key());
    let id = id.as_deref().unwrap_or_default();
    decide_read_item(view, ctx, collection, id, stamp.as_ref(), now).is_ok()
}

fn keep_readable(
    points: &mut Vec<Value>,
    plan: &ReadPlan,
    view: &impl PolicyView,
    ctx: &ReadContext<'_>,
    now: DateTime<Utc>,
) {
    let payload = &plan.payload;
    points.retain(|p| readable(p, &plan.collection, view, ctx, now));
    for p in points.iter_mut() {
        if let Value::Object(p) = p {
            payload.cut(p);
        }
    }
}

/// Decides every point of one answer in place: a list of points, `{points}`, or `{groups}`
/// (each group's hits, and its looked-up point; a group left without hits is dropped).
pub fn decide_found(
    result: &mut Value,
    plan: &ReadPlan,
    view: &impl PolicyView,
    ctx: &ReadContext<'_>,
    now: DateTime<Utc>,
) -> Result<(), AdapterError> {
    let bad = |what: &str| AdapterError::UpstreamInvalid(what.into());
    match result {
        Value::Array(points) => keep_readable(points, plan, view, ctx, now),
        Value::Object(r) if r.contains_key("groups") => {
            let Some(Value::Array(groups)) = r.get_mut("groups") else {
                return Err(bad("groups is not a list"));
            };
            for group in groups.iter_mut() {
                let Some(Value::Array(hits)) = group.get_mut("hits") else {
                    return Err(bad("a group without hits"));
                };
                keep_readable(hits, plan, view, ctx, now);
                if let Value::Object(g) = group {
                    let lookup = g.remove("lookup").filter(|l| !l.is_null());
                    if let (Some(mut lookup), Some(wanted)) = (lookup, &plan.lookup)
                        && readable(&lookup, &plan.lookup_collection, view, ctx, now)
                    {
                        if let Value::Object(l) = &mut lookup {
                            wanted.cut(l);
                        }
                        g.insert("lookup".into(), lookup);
                    }
                }
            }
            groups.retain(|g| g["hits"].as_array().is_some_and(|h| !h.is_empty()));
        }
        Value::Object(r) => match r.get_mut("points") {
            Some(Value::Array(points)) => keep_readable(points, plan, view, ctx, now),
            _ => return Err(bad("points missing")),
        },
        _ => return Err(bad("result is not a list")),
    }
    Ok(())
}

/// Decides a single search's answer.
pub fn decide_answer(
    mut answer: Value,
    plan: &ReadPlan,
    view: &impl PolicyView,
    ctx: &ReadContext<'_>,
    now: DateTime<Utc>,
) -> Result<Value, AdapterError> {
    let result = answer
        .get_mut("result")
        .ok_or_else(|| AdapterError::UpstreamInvalid("result missing".into()))?;
    decide_found(result, plan, view, ctx, now)?;
    Ok(answer)
}

/// Decides a batch's answer (`result: [answer, ...]`), each answer by its own plan.
pub fn decide_batch(
    mut answer: Value,
    plans: &[ReadPlan],
    view: &impl PolicyView,
    ctx: &ReadContext<'_>,
    now: DateTime<Utc>,
) -> Result<Value, AdapterError> {
    let Some(Value::Array(results)) = answer.get_mut("result") else {
        return Err(AdapterError::UpstreamInvalid("result is not a list".into()));
    };
    if results.len() != plans.len() {
        return Err(AdapterError::UpstreamInvalid(
            "a batch answer with another number of results than searches".into(),
        ));
    }
    for (result, plan) in results.iter_mut().zip(plans) {
        decide_found(result, plan, view, ctx, now)?;
    }
    Ok(answer)
}

/// Narrows a search matrix body (`{filter, sample, limit, using}`): only the caller's points
/// are sampled.
pub fn narrow_matrix_body(
    body: &[u8],
    tenant: &str,
    bound: Option<&str>,
    now: DateTime<Utc>,
) -> Result<Vec<u8>, AdapterError> {
    let mut map = parse_object(body)?;
    only_keys(&map, &["filter", "sample", "limit", "using"], "matrix")?;
    let filter = narrowed(
        map.get("filter"),
        &scope_conditions(tenant, bound, Some(now)),
    )?;
    map.insert("filter".into(), filter);
    Ok(serde_json::to_vec(&map).unwrap_or_default())
}

/// The point ids a matrix answer names (`result.pairs[].a/b`, or `result.ids`).
pub fn matrix_ids(answer: &Value) -> Vec<PointId> {
    let result = &answer["result"];
    let mut ids: Vec<PointId> = match result.get("pairs").and_then(Value::as_array) {
        Some(pairs) => pairs
            .iter()
            .flat_map(|p| [&p["a"], &p["b"]])
            .filter_map(PointId::parse)
            .collect(),
        None => result["ids"]
            .as_array()
            .map(|ids| ids.iter().filter_map(PointId::parse).collect())
            .unwrap_or_default(),
    };
    ids.sort();
    ids.dedup();
    ids
}

/// A matrix answer with only the `readable` points: pairs dropped, or offsets re-indexed.
pub fn keep_matrix(
    mut answer: Value,
    readable: &std::collections::BTreeSet<PointId>,
) -> Result<Value, AdapterError> {
    let bad = |what: &str| AdapterError::UpstreamInvalid(what.into());
    let is_readable = |v: &Value| PointId::parse(v).is_some_and(|id| readable.contains(&id));
    let result = answer
        .get_mut("result")
        .ok_or_else(|| bad("result missing"))?;
    if let Some(Value::Array(pairs)) = result.get_mut("pairs") {
        pairs.retain(|p| is_readable(&p["a"]) && is_readable(&p["b"]));
        return Ok(answer);
    }
    let column = |k: &str| {
        result
            .get(k)
            .and_then(Value::as_array)
            .cloned()
            .ok_or_else(|| bad("offsets missing"))
    };
    let (ids, rows, cols, scores) = (
        column("ids")?,
        column("offsets_row")?,
        column("offsets_col")?,
        column("scores")?,
    );
    // Old index -> new index, for the points kept.
    let mut kept_ids = Vec::new();
    let mut index = vec![None; ids.len()];
    for (i, id) in ids.iter().enumerate() {
        if is_readable(id) {
            index[i] = Some(kept_ids.len());
            kept_ids.push(id.clone());
        }
    }
    let at = |v: &Value| {
        v.as_u64()
            .and_then(|i| index.get(i as usize).copied().flatten())
    };
    let (mut new_rows, mut new_cols, mut new_scores) = (Vec::new(), Vec::new(), Vec::new());
    for ((r, c), score) in rows.iter().zip(&cols).zip(&scores) {
        if let (Some(r), Some(c)) = (at(r), at(c)) {
            new_rows.push(json!(r));
            new_cols.push(json!(c));
            new_scores.push(score.clone());
        }
    }
    *result = json!({ "offsets_row": new_rows, "offsets_col": new_cols, "scores": new_scores, "ids": kept_ids });
    Ok(answer)
}

/// A facet request: the payload key, the filter, and how many values to answer.
pub fn parse_facet(body: &[u8]) -> Result<(String, Option<Value>, usize), AdapterError> {
    let map = parse_object(body)?;
    only_keys(&map, &["key", "filter", "limit", "exact"], "facet")?;
    let Some(Value::String(key)) = map.get("key") else {
        return Err(invalid("facet: key must be a payload key"));
    };
    if key_path::parse(key).is_err() {
        return Err(invalid(
            "facet: key must be a payload key path Qdrant accepts",
        ));
    }
    let filter = match map.get("filter") {
        None | Some(Value::Null) => None,
        Some(f @ Value::Object(_)) => Some(f.clone()),
        Some(_) => return Err(invalid("facet: filter must be an object")),
    };
    let limit = match map.get("limit") {
        None | Some(Value::Null) => 10,
        Some(v) => v
            .as_u64()
            .and_then(|l| usize::try_from(l).ok())
            .ok_or_else(|| invalid("facet: limit must be a count"))?,
    };
    Ok((key.clone(), filter, limit))
}

/// Counts each value at `key` (a path, read as Qdrant reads it) among `points`, as Qdrant's facet
/// answers: by count, most first, then by value. A list counts each of its values once per point.
pub fn facet_hits(points: &[Value], key: &str, limit: usize) -> Value {
    let path = key_path::parse(key).ok();
    let mut counts: std::collections::BTreeMap<String, (Value, u64)> = Default::default();
    for point in points {
        let found = match (&path, point.get("payload").and_then(Value::as_object)) {
            (Some(path), Some(payload)) => key_path::values_at(payload, path),
            _ => Vec::new(),
        };
        let values = found.into_iter().flat_map(|v| match v {
            Value::Array(xs) => xs.iter().collect::<Vec<_>>(),
            v => vec![v],
        });
        let mut seen = std::collections::BTreeSet::new();
        for v in values {
            if matches!(v, Value::String(_) | Value::Number(_) | Value::Bool(_))
                && seen.insert(v.to_string())
            {
                counts
                    .entry(v.to_string())
                    .or_insert_with(|| (v.clone(), 0))
                    .1 += 1;
            }
        }
    }
    let mut hits: Vec<(Value, u64)> = counts.into_values().collect();
    hits.sort_by(|a, b| {
        b.1.cmp(&a.1)
            .then_with(|| a.0.to_string().cmp(&b.0.to_string()))
    });
    let hits: Vec<Value> = hits
        .into_iter()
        .take(limit)
        .map(|(value, count)| json!({ "value": value, "count": count }))
        .collect();
    json!({ "hits": hits })
}

#[cfg(test)]
mod tests;
