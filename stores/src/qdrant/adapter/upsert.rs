//! Upserts: each point's subject and stamp planned, decided against what Qdrant already holds
//! under its id, and stamped.

use super::*;

/// One point of an upsert, with the facts its decision needs.
pub type PointFacts = crate::data::records::RecordFacts<PointId>;

/// A parsed upsert, waiting for the policy of its subjects.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedUpsert {
    points: Vec<Map<String, Value>>,
    pub facts: Vec<PointFacts>,
    /// The client's conditional update: held points are replaced only where this matches.
    update_filter: Option<Value>,
}

impl PlannedUpsert {
    pub fn subjects(&self) -> BTreeSet<&str> {
        self.facts.iter().map(|f| f.subject.as_str()).collect()
    }

    pub fn ids(&self) -> Vec<PointId> {
        self.facts.iter().map(|f| f.id.clone()).collect()
    }

    /// Each point's text (its `text_fields`, or every string of its payload), in order.
    pub fn texts(&self, text_fields: &[String]) -> Vec<String> {
        self.points
            .iter()
            .map(|p| text_of_fields(p.get("payload").and_then(Value::as_object), text_fields))
            .collect()
    }
}

/// Parses `{"points": [{id, vector, payload}]}` and finds each point's subject, purpose and
/// category: from the request, else from the point's `lethe_*` payload, else (for clients that
/// cannot send Lethe's headers) from the configured `subject_field` and defaults.
pub fn plan_upsert(
    body: &[u8],
    scope: &Scope<'_>,
    subject_field: Option<&str>,
) -> Result<PlannedUpsert, AdapterError> {
    plan_upsert_map(&parse_object(body)?, scope, subject_field)
}

/// [`plan_upsert`] of a body already parsed (an upsert inside a batch).
pub(super) fn plan_upsert_map(
    map: &Map<String, Value>,
    scope: &Scope<'_>,
    subject_field: Option<&str>,
) -> Result<PlannedUpsert, AdapterError> {
    only_keys(map, &["points", "update_filter"], "upsert")?;
    let update_filter = match map.get("update_filter") {
        None | Some(Value::Null) => None,
        Some(f @ Value::Object(_)) => Some(f.clone()),
        Some(_) => return Err(invalid("upsert: update_filter must be an object")),
    };
    let Some(Value::Array(points)) = map.get("points") else {
        return Err(invalid(
            "upsert: points must be a non-empty array of {id, vector, payload} (the columnar batch form is not supported through Lethe)",
        ));
    };
    if points.is_empty() {
        return Err(invalid("upsert: points must not be empty"));
    }
    let mut planned = PlannedUpsert {
        points: Vec::with_capacity(points.len()),
        facts: Vec::with_capacity(points.len()),
        update_filter,
    };
    let mut seen = BTreeSet::new();
    for (index, point) in points.iter().enumerate() {
        let Value::Object(point) = point else {
            return Err(invalid(format!("points[{index}] must be an object")));
        };
        only_keys(
            point,
            &["id", "vector", "payload"],
            &format!("points[{index}]"),
        )?;
        let id = point.get("id").and_then(PointId::parse).ok_or_else(|| {
            invalid(format!(
                "points[{index}].id must be an unsigned integer or a lowercase, hyphenated UUID"
            ))
        })?;
        if !seen.insert(id.clone()) {
            return Err(invalid("point ids must be unique in a request"));
        }
        let payload = match point.get("payload") {
            None | Some(Value::Null) => None,
            Some(Value::Object(p)) => Some(p),
            Some(_) => {
                return Err(invalid(format!(
                    "points[{index}].payload must be an object"
                )));
            }
        };
        let named = match subject_field {
            Some(field) => string_field(payload, field, index)?,
            None => None,
        };
        planned
            .facts
            .push(record_facts(index, id, scope, payload, named)?);
        planned.points.push(point.clone());
    }
    Ok(planned)
}

/// Calls `each` with every point of the collection an answer names, wherever it sits: a list of
/// points, under `points`, as a group's hits, in a batch's answers. A point is not looked into
/// (its payload is the app's).
pub(super) fn each_point<'v>(value: &'v Value, each: &mut impl FnMut(&'v Value)) {
    match value {
        Value::Array(items) => items.iter().for_each(|v| each_point(v, each)),
        Value::Object(map) if map.contains_key("id") && !map.contains_key("hits") => each(value),
        // A group's `lookup` is a point of another collection, under an id of its own: it is
        // not one of this collection's points (and is not remembered as one).
        Value::Object(map) => map
            .iter()
            .filter(|(key, _)| key.as_str() != "lookup")
            .for_each(|(_, v)| each_point(v, each)),
        _ => {}
    }
}

/// The scroll that reads what Qdrant holds under `ids` (their payloads), just before a write.
pub fn held_query(ids: &[PointId]) -> Vec<u8> {
    json!({
        "filter": { "must": [ { "has_id": ids.iter().map(PointId::to_json).collect::<Vec<_>>() } ] },
        "limit": ids.len(),
        "with_payload": true,
        "with_vector": false,
    })
    .to_string()
    .into_bytes()
}

/// The points of a scroll or query answer (`result.points`) or of a retrieval (`result`).
pub(super) fn answer_points(answer: &Value) -> Result<&Vec<Value>, AdapterError> {
    let result = answer
        .get("result")
        .ok_or_else(|| AdapterError::UpstreamInvalid("result missing".into()))?;
    result
        .get("points")
        .unwrap_or(result)
        .as_array()
        .ok_or_else(|| AdapterError::UpstreamInvalid("points missing".into()))
}

/// What that scroll answered: the stamp each held id carries (`None`: held, not stamped).
pub fn held_stamps(answer: &[u8]) -> Result<BTreeMap<PointId, Option<Stamp>>, AdapterError> {
    let value: Value = serde_json::from_slice(answer)
        .map_err(|_| AdapterError::UpstreamInvalid("not JSON".into()))?;
    answer_points(&value)?
        .iter()
        .map(|p| {
            let id = p.get("id").and_then(PointId::parse).ok_or_else(|| {
                AdapterError::UpstreamInvalid("a point without a canonical id".into())
            })?;
            Ok((id, p.get("payload").and_then(read_stamp)))
        })
        .collect()
}

/// An upsert every point of which was allowed: the body to forward and each point's stamp.
#[derive(Debug, Clone, PartialEq)]
pub struct StampedUpsert {
    pub body: Vec<u8>,
    pub stamps: Vec<(PointId, Stamp)>,
}

/// Whether every point could be written at all, before anything is asked of Qdrant.
pub fn check_upsert(
    planned: &PlannedUpsert,
    tenant: &str,
    view: &impl PolicyView,
    now: DateTime<Utc>,
) -> Result<(), AdapterError> {
    decide_records(
        &planned.facts,
        tenant,
        view,
        &BTreeMap::new(),
        Overwrite::Allowed,
        now,
    )
    .map(|_| ())
}

/// Decides every point on what Qdrant holds under its id and, when all are allowed, stamps
/// each point's payload (the client's own `lethe_*` keys are replaced by the stamp).
pub fn apply_upsert(
    planned: PlannedUpsert,
    tenant: &str,
    view: &impl PolicyView,
    held: &BTreeMap<PointId, Option<Stamp>>,
    now: DateTime<Utc>,
) -> Result<StampedUpsert, AdapterError> {
    let (upsert, stamps) = stamp_points(planned, tenant, view, held, now)?;
    Ok(StampedUpsert {
        // Straight into bytes (`to_string` goes through the formatter); a `Value` always serializes.
        body: serde_json::to_vec(&upsert).unwrap_or_default(),
        stamps,
    })
}

/// The upsert body (`{"points": [...], "update_filter": ...}`) with every point stamped, and
/// each point's stamp. Held points are replaced only while they are still the owners' and
/// unexpired (and match the client's own conditional filter, if any).
pub(super) fn stamp_points(
    planned: PlannedUpsert,
    tenant: &str,
    view: &impl PolicyView,
    held: &BTreeMap<PointId, Option<Stamp>>,
    now: DateTime<Utc>,
) -> Result<(Value, Vec<(PointId, Stamp)>), AdapterError> {
    let decided = decide_records(&planned.facts, tenant, view, held, Overwrite::Allowed, now)?;
    let mut points = Vec::with_capacity(decided.len());
    let mut stamps = Vec::with_capacity(decided.len());
    for ((mut point, fact), stamp) in planned.points.into_iter().zip(planned.facts).zip(decided) {
        // An upsert always writes (`Overwrite::Allowed`); a point the decision skips is left out.
        let Some(stamp) = stamp else { continue };
        point.insert("id".into(), fact.id.to_json());
        let payload = point
            .entry("payload")
            .or_insert_with(|| Value::Object(Map::new()));
        if !payload.is_object() {
            *payload = Value::Object(Map::new());
        }
        if let Value::Object(p) = payload {
            write_stamp(p, &stamp);
        }
        points.push(point);
        stamps.push((fact.id, stamp));
    }
    // The decision was made on what Qdrant held a moment ago. Qdrant replaces a held point only
    // where this filter matches (a free id is inserted): a point another owner wrote under one
    // of these ids in between, or one that expired, is left as it is.
    let subjects: BTreeSet<&str> = stamps.iter().map(|(_, s)| s.subject.as_str()).collect();
    let mut owners = scope_conditions(tenant, None, Some(now));
    owners.push(json!({ "key": SUBJECT, "match": { "any": subjects } }));
    let upsert = json!({
        "points": points,
        "update_filter": narrowed(planned.update_filter.as_ref(), &owners)?,
    });
    Ok((upsert, stamps))
}
