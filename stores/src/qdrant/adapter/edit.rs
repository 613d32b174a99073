//! Point edits and batches: payload set, overwrite, key delete and clear, vector update and
//! delete, and `points/batch` of any of these with upserts and deletes.
//!
//! Each is sent to Qdrant as one `points/batch`: the client's operation narrowed to the points
//! it may see and write (named by id, or selected by its filter, in scope), each decided as a
//! write over the stamp it holds, sent for those points only while they still have the owner
//! they were decided on, with the stamp written again (an overwrite or clear would drop it; a
//! tighter retention rule shortens it). No edit names a `lethe_*` key, in any spelling Qdrant
//! reads as one, and none moves a point to another subject.

use std::collections::BTreeMap;
use std::ops::Range;

use chrono::{DateTime, Utc};
use lethe_policy::{Overwrite, PolicyView, Refusal, Stamp};
use serde_json::{Map, Value, json};

use super::{
    PlannedUpsert, PointId, canonical_ids, invalid, key_path, narrowed, only_keys, plan_upsert_map,
    scope_conditions, stamp_points,
};
use crate::data::records::RecordFacts;
use crate::data::records::{AdapterError, RecordRefusal, Scope};
use crate::kit::stamp::{EPOCH, SUBJECT, TENANT, parse_object, write_stamp};
use crate::kit::text::text_of_fields;
use crate::kit::write::decide_records;

/// The single-operation edit endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EditKind {
    SetPayload,
    OverwritePayload,
    DeletePayload,
    ClearPayload,
    UpdateVectors,
    DeleteVectors,
}

impl EditKind {
    /// The operation's name in a `points/batch`.
    fn batch_name(self) -> &'static str {
        match self {
            EditKind::SetPayload => "set_payload",
            EditKind::OverwritePayload => "overwrite_payload",
            EditKind::DeletePayload => "delete_payload",
            EditKind::ClearPayload => "clear_payload",
            EditKind::UpdateVectors => "update_vectors",
            EditKind::DeleteVectors => "delete_vectors",
        }
    }

    fn from_batch_name(name: &str) -> Option<EditKind> {
        [
            EditKind::SetPayload,
            EditKind::OverwritePayload,
            EditKind::DeletePayload,
            EditKind::ClearPayload,
            EditKind::UpdateVectors,
            EditKind::DeleteVectors,
        ]
        .into_iter()
        .find(|k| k.batch_name() == name)
    }
}

/// The points an operation is about: named by id, or selected by a filter.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    Ids(Vec<PointId>),
    Filter(Value),
}

/// One operation of an edit or a batch, parsed.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Upsert(PlannedUpsert),
    Delete(Target),
    Edit {
        kind: EditKind,
        /// The operation's body without its selection (`points`, `filter`).
        body: Map<String, Value>,
        target: Target,
    },
}

impl Op {
    fn target(&self) -> Option<&Target> {
        match self {
            Op::Upsert(_) => None,
            Op::Delete(target) | Op::Edit { target, .. } => Some(target),
        }
    }

    /// The filter this operation selects its points by, if any.
    pub fn filter(&self) -> Option<&Value> {
        match self.target() {
            Some(Target::Filter(filter)) => Some(filter),
            _ => None,
        }
    }

    /// The ids this operation names (an upsert's, an edit's, a delete's).
    pub fn named_ids(&self) -> Vec<PointId> {
        match self {
            Op::Upsert(planned) => planned.ids(),
            Op::Delete(Target::Ids(ids))
            | Op::Edit {
                target: Target::Ids(ids),
                ..
            } => ids.clone(),
            _ => Vec::new(),
        }
    }

    /// What an edit writes into its points that they may derive from, with the points it is
    /// about: the text its payload sets (the `text_fields` of it, every string when it is set
    /// under a key), or nothing but the request itself (new vectors, made from something the
    /// trace may have read). `None` for operations that write nothing new.
    pub fn written_text(&self, text_fields: &[String]) -> Option<(&Target, String)> {
        let Op::Edit { kind, body, target } = self else {
            return None;
        };
        let payload = body.get("payload").and_then(Value::as_object);
        let text = match kind {
            EditKind::SetPayload if body.get("key").is_some_and(|k| !k.is_null()) => {
                text_of_fields(payload, &[])
            }
            EditKind::SetPayload | EditKind::OverwritePayload => {
                text_of_fields(payload, text_fields)
            }
            EditKind::UpdateVectors => String::new(),
            EditKind::DeletePayload | EditKind::ClearPayload | EditKind::DeleteVectors => {
                return None;
            }
        };
        Some((target, text))
    }
}

/// A payload key no client writes or removes: Lethe's stamp (every `lethe_*` key). For the keys of
/// a payload object, which Qdrant takes literally; a path goes through [`check_path`].
fn check_key(key: &str, at: &str) -> Result<(), AdapterError> {
    if key.starts_with("lethe_") {
        return Err(invalid(format!(
            "{at}: the lethe_* payload keys are Lethe's stamp and cannot be edited"
        )));
    }
    Ok(())
}

/// A payload path (`set_payload`'s `key`, `delete_payload`'s `keys`) read as Qdrant reads it:
/// refused where Qdrant would refuse it, and where its top-level key is Lethe's stamp in any
/// spelling (`"lethe_subject"` quoted, `lethe_subject[]`, `"lethe_subject".x`). Answers that
/// top-level key.
fn check_path<'k>(path: &'k str, at: &str) -> Result<&'k str, AdapterError> {
    let first = key_path::first_segment(path).map_err(|e| {
        invalid(format!(
            "{at}: not a payload key path Qdrant accepts (it stops reading at byte {})",
            e.at
        ))
    })?;
    check_key(first, at)?;
    Ok(first)
}

/// The points or filter of a selection body (`{"points": [...]}` or `{"filter": {...}}`).
fn target_of(map: &mut Map<String, Value>, at: &str) -> Result<Target, AdapterError> {
    match (map.remove("points"), map.remove("filter")) {
        (Some(points), None) => Ok(Target::Ids(canonical_ids(Some(&points), at)?)),
        (None, Some(filter @ Value::Object(_))) => Ok(Target::Filter(filter)),
        _ => Err(invalid(format!("{at}: name either points or a filter"))),
    }
}

/// Parses one edit's body; `subject_field` is the payload key that names a point's subject.
fn parse_edit_map(
    kind: EditKind,
    mut map: Map<String, Value>,
    at: &str,
    subject_field: Option<&str>,
) -> Result<Op, AdapterError> {
    let target = match kind {
        EditKind::UpdateVectors => {
            only_keys(&map, &["points", "update_filter"], at)?;
            let Some(Value::Array(points)) = map.get("points") else {
                return Err(invalid(format!(
                    "{at}: points must be a list of {{id, vector}}"
                )));
            };
            let mut ids = Vec::with_capacity(points.len());
            for (i, point) in points.iter().enumerate() {
                let Some(point) = point.as_object() else {
                    return Err(invalid(format!("{at}.points[{i}] must be an object")));
                };
                only_keys(point, &["id", "vector"], &format!("{at}.points[{i}]"))?;
                let id = point.get("id").and_then(PointId::parse).ok_or_else(|| {
                    invalid(format!(
                        "{at}.points[{i}].id must be an unsigned integer or a lowercase, hyphenated UUID"
                    ))
                })?;
                if ids.contains(&id) {
                    return Err(invalid("point ids must be unique in a request"));
                }
                ids.push(id);
            }
            Target::Ids(ids)
        }
        EditKind::ClearPayload => {
            only_keys(&map, &["points", "filter"], at)?;
            target_of(&mut map, at)?
        }
        EditKind::SetPayload | EditKind::OverwritePayload => {
            let keys: &[&str] = if kind == EditKind::SetPayload {
                &["payload", "points", "filter", "key"]
            } else {
                &["payload", "points", "filter"]
            };
            only_keys(&map, keys, at)?;
            let Some(Value::Object(payload)) = map.get("payload") else {
                return Err(invalid(format!("{at}: payload must be an object")));
            };
            for key in payload.keys() {
                check_key(key, at)?;
            }
            match map.get("key") {
                None | Some(Value::Null) => {}
                Some(Value::String(key)) => {
                    // Qdrant sets under the path's top-level key, however it is spelled.
                    let first = check_path(key, at)?;
                    if subject_field.is_some_and(|f| first == f) {
                        return Err(invalid(format!(
                            "{at}: the key {key} names the point's subject; set it at the top of the payload"
                        )));
                    }
                }
                Some(_) => return Err(invalid(format!("{at}: key must be a string"))),
            }
            target_of(&mut map, at)?
        }
        EditKind::DeletePayload => {
            only_keys(&map, &["keys", "points", "filter"], at)?;
            let Some(Value::Array(keys)) = map.get("keys") else {
                return Err(invalid(format!(
                    "{at}: keys must be a list of payload keys"
                )));
            };
            for key in keys {
                check_path(
                    key.as_str()
                        .ok_or_else(|| invalid(format!("{at}: keys must be strings")))?,
                    at,
                )?;
            }
            target_of(&mut map, at)?
        }
        EditKind::DeleteVectors => {
            only_keys(&map, &["points", "filter", "vector"], at)?;
            if !map.get("vector").is_some_and(Value::is_array) {
                return Err(invalid(format!(
                    "{at}: vector must be a list of vector names"
                )));
            }
            target_of(&mut map, at)?
        }
    };
    Ok(Op::Edit {
        kind,
        body: map,
        target,
    })
}

/// Parses the body of a single edit endpoint.
pub fn parse_edit(
    kind: EditKind,
    body: &[u8],
    subject_field: Option<&str>,
) -> Result<Op, AdapterError> {
    parse_edit_map(kind, parse_object(body)?, kind.batch_name(), subject_field)
}

/// Parses a `points/batch` body (`{"operations": [{name: body}, ...]}`). Only the first
/// operation may select points by filter: Lethe decides each selected point before the batch
/// runs, on what the store holds then, and an earlier operation would change what a later
/// filter selects.
pub fn parse_batch(
    body: &[u8],
    scope: &Scope<'_>,
    subject_field: Option<&str>,
) -> Result<Vec<Op>, AdapterError> {
    let map = parse_object(body)?;
    only_keys(&map, &["operations"], "batch")?;
    let Some(Value::Array(operations)) = map.get("operations") else {
        return Err(invalid("batch: operations must be a list"));
    };
    if operations.is_empty() {
        return Err(invalid("batch: operations must not be empty"));
    }
    let mut ops = Vec::with_capacity(operations.len());
    for (i, operation) in operations.iter().enumerate() {
        let at = format!("operations[{i}]");
        let Some((name, inner)) = operation
            .as_object()
            .filter(|o| o.len() == 1)
            .and_then(|o| o.iter().next())
        else {
            return Err(invalid(format!(
                "{at} must be an object with one operation"
            )));
        };
        let Value::Object(inner) = inner else {
            return Err(invalid(format!("{at}.{name} must be an object")));
        };
        let op = match name.as_str() {
            "upsert" => Op::Upsert(plan_upsert_map(inner, scope, subject_field)?),
            "delete" => {
                let mut inner = inner.clone();
                only_keys(&inner, &["points", "filter"], &at)?;
                Op::Delete(target_of(&mut inner, &at)?)
            }
            other => match EditKind::from_batch_name(other) {
                Some(kind) => parse_edit_map(kind, inner.clone(), &at, subject_field)?,
                None => {
                    return Err(invalid(format!(
                        "{at}: {other} is not an operation Lethe governs"
                    )));
                }
            },
        };
        if i > 0 && op.filter().is_some() {
            return Err(invalid(format!(
                "{at}: only a batch's first operation may select points by filter through Lethe; name the points, or send it alone"
            )));
        }
        ops.push(op);
    }
    Ok(ops)
}

/// What Qdrant holds before the batch runs, as far as the caller may know it.
#[derive(Debug, Clone, Default)]
pub struct Before {
    /// Every stamp held under an id an upsert names, the caller's or not: ownership.
    pub held: BTreeMap<PointId, Option<Stamp>>,
    /// The points the caller may see among the ids the operations name, with their stamps.
    pub visible: BTreeMap<PointId, Stamp>,
    /// The points the first operation's filter selects within the caller's scope.
    pub selected: Vec<(PointId, Stamp)>,
}

/// The batch Lethe sends for the client's operations.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// `{"operations": [...]}`; no operations when there is nothing to do.
    pub operations: Vec<Value>,
    /// The operations sent for each of the client's, in order.
    pub ranges: Vec<Range<usize>>,
    /// Every point written, with the stamp it now carries.
    pub written: Vec<(PointId, Stamp)>,
    /// Every point deleted.
    pub deleted: Vec<PointId>,
}

impl Batch {
    pub fn body(&self) -> Vec<u8> {
        json!({ "operations": self.operations })
            .to_string()
            .into_bytes()
    }
}

/// An id an edit names that the caller may not see, or that does not exist: Qdrant's own
/// answer to an edit of a missing point, without telling the two apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotFound(pub PointId);

/// Decided points that carry one stamp: the stamp, as a payload too, and their ids.
struct StampGroup<'a> {
    stamp: &'a Stamp,
    payload: Map<String, Value>,
    ids: Vec<&'a PointId>,
}

/// The decided points grouped by the stamp each now carries.
fn by_stamp(stamped: &[(PointId, Stamp)]) -> Vec<StampGroup<'_>> {
    let mut groups: BTreeMap<String, StampGroup<'_>> = BTreeMap::new();
    for (id, stamp) in stamped {
        let mut payload = Map::new();
        write_stamp(&mut payload, stamp);
        groups
            .entry(Value::Object(payload.clone()).to_string())
            .or_insert_with(|| StampGroup {
                stamp,
                payload,
                ids: Vec::new(),
            })
            .ids
            .push(id);
    }
    groups.into_values().collect()
}

/// The conditions that a point is still the one decided on: its owner and epoch. An edit sent
/// with them leaves alone a point that changed hands between Lethe's read and the edit.
fn still_owned(stamp: &Stamp) -> Vec<Value> {
    vec![
        json!({ "key": TENANT, "match": { "value": stamp.tenant } }),
        json!({ "key": SUBJECT, "match": { "value": stamp.subject } }),
        json!({ "key": EPOCH, "match": { "value": stamp.epoch } }),
    ]
}

/// [`still_owned`] for the points `ids`, as a selection filter.
fn owned_points(stamp: &Stamp, ids: &[&PointId]) -> Value {
    let mut must = vec![json!({ "has_id": ids.iter().map(|id| id.to_json()).collect::<Vec<_>>() })];
    must.extend(still_owned(stamp));
    json!({ "must": must })
}

/// Decides the batch over what Qdrant holds, and builds what Lethe sends. `index` of a refusal
/// is the operation's position in a batch, the point's in a single edit.
#[allow(clippy::too_many_arguments)]
pub fn build_batch(
    ops: Vec<Op>,
    before: &Before,
    scope: &Scope<'_>,
    subject_field: Option<&str>,
    single: bool,
    view: &impl PolicyView,
    now: DateTime<Utc>,
) -> Result<Result<Batch, NotFound>, AdapterError> {
    let tenant = scope.tenant;
    // What each id holds as the batch runs: `None` once deleted (or never visible).
    let mut current: BTreeMap<PointId, Option<Stamp>> = before
        .visible
        .iter()
        .map(|(id, stamp)| (id.clone(), Some(stamp.clone())))
        .collect();
    let mut batch = Batch {
        operations: Vec::new(),
        ranges: Vec::with_capacity(ops.len()),
        written: Vec::new(),
        deleted: Vec::new(),
    };
    let mut refused = Vec::new();
    for (op_index, op) in ops.into_iter().enumerate() {
        let start = batch.operations.len();
        // A refusal names the operation in a batch, the point in a single edit.
        let mut refuse = |e: AdapterError| match e {
            AdapterError::Refused(r) => {
                refused.extend(r.into_iter().map(|r| RecordRefusal {
                    index: if single { r.index } else { op_index },
                    ..r
                }));
                Ok(())
            }
            e => Err(e),
        };
        match op {
            Op::Upsert(planned) => {
                let held = held_now(before, &current, planned.ids());
                match stamp_points(planned, tenant, view, &held, now) {
                    Ok((upsert, stamps)) => {
                        for (id, stamp) in &stamps {
                            current.insert(id.clone(), Some(stamp.clone()));
                        }
                        batch.written.extend(stamps);
                        batch.operations.push(json!({ "upsert": upsert }));
                    }
                    Err(e) => refuse(e)?,
                }
            }
            Op::Delete(target) => {
                let ids = deleted_by(&target, before, &current);
                for id in &ids {
                    current.insert(id.clone(), None);
                }
                if !ids.is_empty() {
                    batch.operations.push(json!({ "delete": {
                        "points": ids.iter().map(PointId::to_json).collect::<Vec<_>>()
                    } }));
                }
                batch.deleted.extend(ids);
            }
            Op::Edit { kind, body, target } => {
                let found = match targets(&target, before, &current) {
                    Ok(found) => found,
                    Err(missing) => return Ok(Err(missing)),
                };
                if !found.is_empty() {
                    match decide_edit(&found, &body, kind, scope, subject_field, view, now) {
                        Ok(stamped) => {
                            batch
                                .operations
                                .extend(edit_operations(kind, &body, &stamped, now)?);
                            for (id, stamp) in &stamped {
                                current.insert(id.clone(), Some(stamp.clone()));
                            }
                            batch.written.extend(stamped);
                        }
                        Err(e) => refuse(e)?,
                    }
                }
            }
        }
        batch.ranges.push(start..batch.operations.len());
    }
    if refused.is_empty() {
        Ok(Ok(batch))
    } else {
        Err(AdapterError::Refused(refused))
    }
}

/// What `ids` hold as the batch reaches them: the store's own stamps decide ownership, then
/// what this batch did before.
fn held_now(
    before: &Before,
    current: &BTreeMap<PointId, Option<Stamp>>,
    ids: impl IntoIterator<Item = PointId>,
) -> BTreeMap<PointId, Option<Stamp>> {
    let mut held = before.held.clone();
    for id in ids {
        match current.get(&id) {
            Some(Some(stamp)) => {
                held.insert(id, Some(stamp.clone()));
            }
            Some(None) => {
                held.remove(&id);
            }
            None => {}
        }
    }
    held
}

/// The points a delete removes: only those the caller sees (a delete of what the caller cannot
/// see deletes nothing, as Qdrant's does).
fn deleted_by(
    target: &Target,
    before: &Before,
    current: &BTreeMap<PointId, Option<Stamp>>,
) -> Vec<PointId> {
    match target {
        Target::Filter(_) => before.selected.iter().map(|(id, _)| id.clone()).collect(),
        Target::Ids(ids) => ids
            .iter()
            .filter(|id| matches!(current.get(*id), Some(Some(_))))
            .cloned()
            .collect(),
    }
}

/// The points in scope a target names or selects, with what they hold now; the first named id
/// the caller cannot see (or that is gone) otherwise.
fn targets(
    target: &Target,
    before: &Before,
    current: &BTreeMap<PointId, Option<Stamp>>,
) -> Result<Vec<(PointId, Stamp)>, NotFound> {
    match target {
        Target::Filter(_) => Ok(before.selected.clone()),
        Target::Ids(ids) => ids
            .iter()
            .map(|id| match current.get(id) {
                Some(Some(stamp)) => Ok((id.clone(), stamp.clone())),
                _ => Err(NotFound(id.clone())),
            })
            .collect(),
    }
}

/// Decides an edit of each found point as a write over its stamp: the request's subject, purpose
/// and category (or the stamp's) must be the point's, its subject active under the same epoch,
/// with `store` consent and a retention rule. A payload naming the subject (`subject_field`)
/// must name the owner.
fn decide_edit(
    found: &[(PointId, Stamp)],
    body: &Map<String, Value>,
    kind: EditKind,
    scope: &Scope<'_>,
    subject_field: Option<&str>,
    view: &impl PolicyView,
    now: DateTime<Utc>,
) -> Result<Vec<(PointId, Stamp)>, AdapterError> {
    let named = match (kind, subject_field, body.get("payload")) {
        (
            EditKind::SetPayload | EditKind::OverwritePayload,
            Some(field),
            Some(Value::Object(p)),
        ) if body.get("key").is_none_or(Value::is_null) => p.get(field),
        _ => None,
    };
    let mut refused = Vec::new();
    let mut facts = Vec::with_capacity(found.len());
    for (index, (id, stamp)) in found.iter().enumerate() {
        let moves = match named {
            None | Some(Value::Null) => false,
            Some(Value::String(s)) => *s != stamp.subject,
            Some(_) => true,
        };
        if moves {
            refused.push(RecordRefusal {
                index,
                refusal: Refusal::ScopeViolation,
            });
            continue;
        }
        facts.push(RecordFacts {
            index,
            id: id.clone(),
            subject: scope.subject.unwrap_or(&stamp.subject).to_owned(),
            purpose: scope.purpose.unwrap_or(&stamp.purpose).to_owned(),
            category: scope.category.unwrap_or(&stamp.category).to_owned(),
            requested_expires_at: None,
            layer: stamp.layer,
        });
    }
    let held = found
        .iter()
        .map(|(id, stamp)| (id.clone(), Some(stamp.clone())))
        .collect();
    let stamps = match decide_records(&facts, scope.tenant, view, &held, Overwrite::Only, now) {
        Ok(stamps) => stamps,
        Err(AdapterError::Refused(more)) => {
            refused.extend(more);
            Vec::new()
        }
        Err(e) => return Err(e),
    };
    if !refused.is_empty() {
        refused.sort_by_key(|r| r.index);
        return Err(AdapterError::Refused(refused));
    }
    Ok(facts
        .into_iter()
        .zip(stamps)
        .filter_map(|(f, s)| s.map(|s| (f.id, s)))
        .collect())
}

/// The client's edit as Lethe sends it, for each group of decided points with one stamp: the
/// points selected by id and by the owner they had when decided (so one that changed hands
/// since is left alone), and the stamp written with the edit or right after it.
fn edit_operations(
    kind: EditKind,
    body: &Map<String, Value>,
    stamped: &[(PointId, Stamp)],
    now: DateTime<Utc>,
) -> Result<Vec<Value>, AdapterError> {
    let mut operations = Vec::new();
    for StampGroup {
        stamp,
        payload: stamp_payload,
        ids,
    } in by_stamp(stamped)
    {
        let owned = owned_points(stamp, &ids);
        let with_stamp = |payload: Option<&Value>| {
            let mut payload = payload
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            payload.extend(stamp_payload.clone());
            Value::Object(payload)
        };
        let restamp = json!({ "set_payload": { "payload": stamp_payload, "filter": owned } });
        match kind {
            // An overwrite and a clear carry the stamp in the payload they write.
            EditKind::OverwritePayload => operations.push(json!({ "overwrite_payload": {
                "payload": with_stamp(body.get("payload")), "filter": owned,
            } })),
            EditKind::ClearPayload => operations.push(json!({ "overwrite_payload": {
                "payload": with_stamp(None), "filter": owned,
            } })),
            EditKind::SetPayload if body.get("key").is_none_or(Value::is_null) => {
                operations.push(json!({ "set_payload": {
                    "payload": with_stamp(body.get("payload")), "filter": owned,
                } }));
            }
            EditKind::UpdateVectors => {
                let mine: Vec<Value> = body["points"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|p| PointId::parse(&p["id"]).is_some_and(|id| ids.contains(&&id)))
                    .cloned()
                    .collect();
                let mut conditions = still_owned(stamp);
                conditions.extend(scope_conditions(&stamp.tenant, None, Some(now)));
                operations.push(json!({ "update_vectors": {
                    "points": mine,
                    "update_filter": narrowed(body.get("update_filter"), &conditions)?,
                } }));
                operations.push(restamp);
            }
            // Setting under a key, deleting keys or vectors: the edit, then the stamp.
            _ => {
                let mut edit = body.clone();
                edit.insert("filter".into(), owned);
                operations.push(json!({ kind.batch_name(): edit }));
                operations.push(restamp);
            }
        }
    }
    Ok(operations)
}

/// The client's answer: for each of its operations, Qdrant's result of the last operation sent
/// for it (or a completed one where nothing needed sending).
pub fn batch_results(answer: &Value, ranges: &[Range<usize>]) -> Result<Vec<Value>, AdapterError> {
    let results = answer
        .get("result")
        .and_then(Value::as_array)
        .ok_or_else(|| AdapterError::UpstreamInvalid("result is not a list".into()))?;
    ranges
        .iter()
        .map(|range| match range.end.checked_sub(1) {
            Some(last) if !range.is_empty() => results.get(last).cloned().ok_or_else(|| {
                AdapterError::UpstreamInvalid("fewer results than operations".into())
            }),
            _ => Ok(nothing_done()),
        })
        .collect()
}

/// Qdrant's result for an operation that changed nothing.
pub fn nothing_done() -> Value {
    json!({ "operation_id": null, "status": "completed" })
}

#[cfg(test)]
mod tests;
