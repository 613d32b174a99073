//! The Qdrant route's writes: what Qdrant holds is read first and decides who owns a point,
//! every operation is decided before one is sent, and lineage follows what Qdrant then holds.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Response};
use lethe_policy::Layer;
use serde_json::{Value, json};

use super::read::{Wanted, in_scope};
use super::{Fields, no_point, ok, points_path};
use crate::data::derivation::{Derivations, Writing, derived_before};
use crate::data::error::DataError;
use crate::data::forward::Answer;
use crate::data::overtaken::{Recording, keep_unless_overtaken};
use crate::data::policy_cache::View;
use crate::data::records::{AdapterError, RecordRefusal};
use crate::data::{RequestContext, Upstream};
use crate::kit::stamp::read_stamp;
use crate::qdrant::adapter::edit::{self, Before, NotFound, Op, Target};
use crate::qdrant::adapter::{self, PayloadWanted, PointId};
use crate::state::ItemRecord;

pub(super) async fn upsert(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
    collection: &str,
    body: Bytes,
    fields: Fields<'_>,
) -> Result<Response<Full<Bytes>>, DataError> {
    let state = upstream.state;
    let tenant = ctx.tenant();
    let mut planned = adapter::plan_upsert(&body, &ctx.scope(), fields.subject)?;
    let texts = planned.texts(fields.text);
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let derivations = state
        .derivation
        .derive(ctx, collection, &mut planned.facts, PointId::key, &texts)
        .await?;
    // The owners of what the write derives from decide it too.
    let owners: Vec<&str> = planned
        .subjects()
        .into_iter()
        .chain(derivations.owners())
        .collect();
    let view = state.policy.view(tenant, owners).await?;
    adapter::check_upsert(&planned, tenant, &view, crate::now())?;
    derivations.check(&view, tenant)?;
    // The stamps Qdrant holds under these ids decide who owns them, not lineage.
    let held = match held(upstream, collection, &planned.ids()).await? {
        Ok(held) => held,
        Err(refused) => return Ok(refused.passed_on()),
    };
    let now = crate::now();
    let stamped = adapter::apply_upsert(planned, tenant, &view, &held, now)?;
    let written: Vec<String> = stamped.stamps.iter().map(|(id, _)| id.key()).collect();
    let rewritten = derived_before(&held, PointId::key);
    state.derivation.record(ctx, &derivations, &written).await?;
    let answer = upstream
        .send(Method::PUT, path, Bytes::from(stamped.body))
        .await?;
    if !answer.is_success() {
        return Ok(answer.passed_on());
    }
    record_written(
        upstream,
        ctx,
        collection,
        stamped.stamps,
        now,
        Some(&derivations),
    )
    .await?;
    state
        .derivation
        .accepted(ctx, derivations, &written, &rewritten)
        .await?;
    Ok(answer.passed_on())
}

/// What Qdrant holds under `ids`: each one's stamp (`None`: held, unstamped), whoever's it is.
/// Qdrant's answer when it refuses the read.
async fn held(
    upstream: &Upstream<'_>,
    collection: &str,
    ids: &[PointId],
) -> Result<Result<BTreeMap<PointId, Option<lethe_policy::Stamp>>, Answer>, DataError> {
    let found = upstream
        .send_query(
            Method::POST,
            &points_path(collection, "scroll"),
            None,
            Bytes::from(adapter::held_query(ids)),
        )
        .await?;
    if !found.is_success() {
        return Ok(Err(found));
    }
    Ok(Ok(adapter::held_stamps(&found.body)?))
}

/// Lineage of the points a write stamped. A point written after a flip of its subject, or of a
/// subject it derives from (the policy changed while the write was in flight), is deleted again.
async fn record_written(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    collection: &str,
    stamps: Vec<(PointId, lethe_policy::Stamp)>,
    now: chrono::DateTime<chrono::Utc>,
    derived: Option<&Derivations>,
) -> Result<(), DataError> {
    let rows = stamps
        .into_iter()
        .map(|(id, stamp)| {
            ItemRecord::stamped(
                &upstream.route.name,
                collection,
                id.key(),
                stamp,
                now,
                ctx.source.clone(),
            )
        })
        .collect();
    let undo = |overtaken: Vec<ItemRecord>| async move {
        let ids: Vec<Value> = overtaken
            .iter()
            .filter_map(|r| PointId::from_key(&r.item_id).map(|id| id.to_json()))
            .collect();
        let undone = upstream
            .send_query(
                Method::POST,
                &points_path(collection, "delete"),
                Some("wait=true"),
                Bytes::from(json!({ "points": ids }).to_string()),
            )
            .await;
        // Left to the purge, which finds them by stamp and by lineage.
        if undone.is_ok_and(|a| a.is_success()) {
            Vec::new()
        } else {
            overtaken
        }
    };
    keep_unless_overtaken(
        upstream.state,
        ctx.tenant(),
        rows,
        Recording::Batched,
        derived,
        undo,
    )
    .await
}

/// A delete removes only what the caller's scope covers: the named points (or those the filter
/// selects) that it may see are deleted by id, and their lineage marked deleted.
pub(super) async fn delete(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    collection: &str,
    body: Bytes,
) -> Result<Response<Full<Bytes>>, DataError> {
    let (ids, filter) = adapter::parse_delete(&body)?;
    if ids.as_ref().is_some_and(Vec::is_empty) {
        return Ok(ok(json!({ "operation_id": null, "status": "completed" })));
    }
    let found = in_scope(
        upstream,
        ctx,
        collection,
        ids.as_deref(),
        filter.as_ref(),
        Wanted::IDS,
    )
    .await?;
    let found = match found {
        Ok(found) => found,
        Err(refused) => return Ok(refused.passed_on()),
    };
    let ids: Vec<Value> = found.iter().filter_map(|p| p.get("id").cloned()).collect();
    if ids.is_empty() {
        return Ok(ok(json!({ "operation_id": null, "status": "completed" })));
    }
    let keys: Vec<String> = ids
        .iter()
        .filter_map(|id| PointId::parse(id).map(|id| id.key()))
        .collect();
    let answer = upstream
        .send(
            Method::POST,
            &points_path(collection, "delete"),
            Bytes::from(json!({ "points": ids }).to_string()),
        )
        .await?;
    if answer.is_success() {
        upstream
            .state
            .store
            .mark_items_deleted(&upstream.route.name, collection, &keys, crate::now())
            .await?;
    }
    Ok(answer.passed_on())
}

/// An edit or a batch: what Qdrant holds is read first (every stamp under an upserted id; the
/// caller's visible points among the named ids or the first operation's filter), every point is
/// decided, and one `points/batch` is sent. Nothing is sent when anything is refused.
pub(super) async fn batch(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    collection: &str,
    mut ops: Vec<Op>,
    single: bool,
    fields: Fields<'_>,
) -> Result<Response<Full<Bytes>>, DataError> {
    let subject_field = fields.subject;
    let (derived, op_of) = derive_upserts(upstream, ctx, collection, &mut ops, fields).await?;
    let mut before = match held_before(upstream, ctx, collection, &ops).await? {
        Ok(before) => before,
        Err(refused) => return Ok(refused.passed_on()),
    };
    let (edited, edit_of) =
        derive_edits(upstream, ctx, collection, &ops, &mut before, fields).await?;
    let view = batch_view(
        upstream,
        ctx,
        &ops,
        &before,
        [(&derived, &op_of), (&edited, &edit_of)],
    )
    .await?;
    let rewritten = derived_before(&before.held, PointId::key);
    let now = crate::now();
    let built = edit::build_batch(
        ops,
        &before,
        &ctx.scope(),
        subject_field,
        single,
        &view,
        now,
    )?;
    let built = match built {
        Ok(built) => built,
        Err(NotFound(id)) => return Ok(no_point(&id)),
    };
    let written: Vec<String> = built.written.iter().map(|(id, _)| id.key()).collect();
    let derivation = &upstream.state.derivation;
    derivation.record(ctx, &derived, &written).await?;
    // An edited point still holds what it held (its vector, the rest of its payload): what it
    // derives from now is added to what it derived from.
    derivation.record_added(ctx, &edited).await?;
    let derived = derived.and(edited);
    let results = if built.operations.is_empty() {
        vec![edit::nothing_done(); built.ranges.len()]
    } else {
        let answer = upstream
            .send(
                Method::POST,
                &points_path(collection, "batch"),
                Bytes::from(built.body()),
            )
            .await?;
        if !answer.is_success() {
            // Qdrant applies a batch's operations in order and stops at the first that fails:
            // lineage follows what it holds now, by the stamps it holds.
            let (written, deleted) = applied(upstream, collection, built).await?;
            record_batch(
                upstream,
                ctx,
                collection,
                (written, deleted),
                now,
                Some(&derived),
            )
            .await?;
            return Ok(answer.passed_on());
        }
        let value: Value = serde_json::from_slice(&answer.body)
            .map_err(|_| crate::data::records::AdapterError::UpstreamInvalid("not JSON".into()))?;
        edit::batch_results(&value, &built.ranges)?
    };
    let done = (built.written, built.deleted);
    record_batch(upstream, ctx, collection, done, now, Some(&derived)).await?;
    derivation
        .accepted(ctx, derived, &written, &rewritten)
        .await?;
    let result = if single {
        results
            .into_iter()
            .next_back()
            .unwrap_or_else(edit::nothing_done)
    } else {
        Value::Array(results)
    };
    Ok(ok(result))
}

/// What Qdrant holds that a batch touches: every stamp under an upserted id, and the caller's
/// visible points among the ids its other operations name or that its first operation's filter
/// selects. Qdrant's answer when it refuses a read.
async fn held_before(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    collection: &str,
    ops: &[Op],
) -> Result<Result<Before, Answer>, DataError> {
    let mut before = Before::default();
    let upserted: Vec<PointId> = ops
        .iter()
        .filter(|op| matches!(op, Op::Upsert(_)))
        .flat_map(Op::named_ids)
        .collect();
    if !upserted.is_empty() {
        before.held = match held(upstream, collection, &upserted).await? {
            Ok(held) => held,
            Err(refused) => return Ok(Err(refused)),
        };
    }
    let stamp_only = PayloadWanted::Keys(crate::kit::stamp::STAMP_KEYS.map(str::to_owned).to_vec());
    let wanted = Wanted {
        payload: &stamp_only,
        ..Wanted::IDS
    };
    let stamped = |points: Vec<Value>| {
        points.into_iter().filter_map(|p| {
            let id = p.get("id").and_then(PointId::parse)?;
            Some((id, p.get("payload").and_then(read_stamp)?))
        })
    };
    let mut named: Vec<PointId> = ops
        .iter()
        .filter(|op| !matches!(op, Op::Upsert(_)))
        .flat_map(Op::named_ids)
        .collect();
    named.sort();
    named.dedup();
    if !named.is_empty() {
        match in_scope(upstream, ctx, collection, Some(&named), None, wanted).await? {
            Ok(points) => before.visible = stamped(points).collect(),
            Err(refused) => return Ok(Err(refused)),
        }
    }
    if let Some(filter) = ops.first().and_then(Op::filter) {
        match in_scope(upstream, ctx, collection, None, Some(filter), wanted).await? {
            Ok(points) => before.selected = stamped(points).collect(),
            Err(refused) => return Ok(Err(refused)),
        }
    }
    Ok(Ok(before))
}

/// The policy of every subject a batch touches (the points it reads, writes and derives from);
/// refused when what a write derives from may not be written, each refusal naming the client's
/// operation (`op_of`: each derivation record's operation).
async fn batch_view(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    ops: &[Op],
    before: &Before,
    derivations: [(&Derivations, &Vec<usize>); 2],
) -> Result<View, DataError> {
    let tenant = ctx.tenant();
    let mut subjects: BTreeSet<&str> = before
        .visible
        .values()
        .chain(before.selected.iter().map(|(_, s)| s))
        .map(|s| s.subject.as_str())
        .collect();
    for op in ops {
        if let Op::Upsert(planned) = op {
            subjects.extend(planned.subjects());
        }
    }
    for (derived, _) in derivations {
        subjects.extend(derived.owners());
    }
    let view = upstream.state.policy.view(tenant, subjects).await?;
    let mut at: Vec<RecordRefusal> = Vec::new();
    for (derived, op_of) in derivations {
        if let Err(AdapterError::Refused(refused)) = derived.check(&view, tenant) {
            // A batch's refusals name the client's operations.
            at.extend(refused.into_iter().map(|r| RecordRefusal {
                index: op_of.get(r.index).copied().unwrap_or_default(),
                ..r
            }));
        }
    }
    if !at.is_empty() {
        at.sort_by_key(|r| r.index);
        at.dedup_by_key(|r| r.index);
        return Err(AdapterError::Refused(at).into());
    }
    Ok(view)
}

/// What of a batch Qdrant holds after it failed part way: the written points that carry the
/// stamp Lethe wrote, and the deleted points that are gone.
async fn applied(
    upstream: &Upstream<'_>,
    collection: &str,
    built: edit::Batch,
) -> Result<(Vec<(PointId, lethe_policy::Stamp)>, Vec<PointId>), DataError> {
    let ids: Vec<PointId> = built
        .written
        .iter()
        .map(|(id, _)| id.clone())
        .chain(built.deleted.iter().cloned())
        .collect();
    if ids.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let Ok(held) = held(upstream, collection, &ids).await? else {
        return Err(DataError::upstream_unavailable(
            "the store could not be read after a failed batch",
        ));
    };
    let written = built
        .written
        .into_iter()
        .filter(|(id, stamp)| {
            // As the payload holds it: the deadline in whole seconds.
            held.get(id).and_then(Option::as_ref).is_some_and(|h| {
                (&h.tenant, &h.subject, h.epoch, h.expires_at.timestamp())
                    == (
                        &stamp.tenant,
                        &stamp.subject,
                        stamp.epoch,
                        stamp.expires_at.timestamp(),
                    )
            })
        })
        .collect();
    let deleted = built
        .deleted
        .into_iter()
        .filter(|id| !held.contains_key(id))
        .collect();
    Ok((written, deleted))
}

/// Lineage of a batch: its deleted points marked deleted, its written points recorded.
async fn record_batch(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    collection: &str,
    (written, deleted): (Vec<(PointId, lethe_policy::Stamp)>, Vec<PointId>),
    now: chrono::DateTime<chrono::Utc>,
    derived: Option<&Derivations>,
) -> Result<(), DataError> {
    let deleted: Vec<String> = deleted.iter().map(PointId::key).collect();
    if !deleted.is_empty() {
        upstream
            .state
            .store
            .mark_items_deleted(&upstream.route.name, collection, &deleted, now)
            .await?;
    }
    record_written(upstream, ctx, collection, written, now, derived).await
}

/// What the upserts of a batch derive from (their points' layers set from it), and for each
/// record the position of its operation.
async fn derive_upserts(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    collection: &str,
    ops: &mut [Op],
    fields: Fields<'_>,
) -> Result<(Derivations, Vec<usize>), DataError> {
    let mut derived = Derivations::default();
    let mut op_of = Vec::new();
    for (index, op) in ops.iter_mut().enumerate() {
        let Op::Upsert(planned) = op else { continue };
        let texts = planned.texts(fields.text);
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        let found = upstream
            .state
            .derivation
            .derive(ctx, collection, &mut planned.facts, PointId::key, &texts)
            .await?;
        op_of.extend(std::iter::repeat_n(index, found.records.len()));
        derived.records.extend(found.records);
    }
    Ok((derived, op_of))
}

/// What the edits of a batch that write into points derive from (see
/// [`Op::written_text`]): each point an edit writes (named and visible, or selected by the
/// first operation's filter) derives from what its text quotes and its trace read; and for
/// each record the position of its operation. Such a point is stamped derived by every
/// operation of the batch that stamps it.
async fn derive_edits(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    collection: &str,
    ops: &[Op],
    before: &mut Before,
    fields: Fields<'_>,
) -> Result<(Derivations, Vec<usize>), DataError> {
    let mut edits: Vec<(usize, String, String, String)> = Vec::new();
    for (index, op) in ops.iter().enumerate() {
        let Some((target, text)) = op.written_text(fields.text) else {
            continue;
        };
        let points: Vec<(&PointId, &lethe_policy::Stamp)> = match target {
            Target::Filter(_) => before.selected.iter().map(|(id, s)| (id, s)).collect(),
            Target::Ids(ids) => ids
                .iter()
                .filter_map(|id| before.visible.get_key_value(id))
                .collect(),
        };
        for (id, stamp) in points {
            edits.push((index, id.key(), stamp.subject.clone(), text.clone()));
        }
    }
    let writes: Vec<Writing<'_>> = edits
        .iter()
        .map(|(_, id, owner, text)| Writing {
            collection,
            id,
            owner,
            text,
        })
        .collect();
    let derived = upstream.state.derivation.parents(ctx, &writes).await?;
    let derives: std::collections::BTreeSet<&str> = derived
        .records
        .iter()
        .filter(|r| !r.parents.is_empty())
        .map(|r| r.item.item.as_str())
        .collect();
    let selected = before.selected.iter_mut().map(|(id, stamp)| (&*id, stamp));
    for (id, stamp) in before.visible.iter_mut().chain(selected) {
        if derives.contains(id.key().as_str()) {
            stamp.layer = Layer::Derived;
        }
    }
    Ok((
        derived,
        edits.into_iter().map(|(index, ..)| index).collect(),
    ))
}
