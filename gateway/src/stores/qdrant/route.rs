//! The Qdrant route: the I/O around the pure adapter in `crate::stores::qdrant::adapter`.

use std::collections::BTreeMap;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Response, StatusCode};
use lethe_policy::Layer;
use serde_json::{Value, json};

use crate::auth::Role;
use crate::data::derivation::{Derivations, Served, Writing, derived_before};
use crate::data::error::{DataError, json_response};
use crate::data::forward::Answer;
use crate::data::overtaken::{Recording, keep_unless_overtaken};
use crate::data::policy_cache::View;
use crate::data::records::{AdapterError, RecordRefusal};
use crate::data::{RequestContext, Upstream};
use crate::error_shape::Code;
use crate::state::ItemRecord;
use crate::stores::kit::stamp::read_stamp;
use crate::stores::qdrant::adapter::edit::{self, Before, NotFound, Op, Target};
use crate::stores::qdrant::adapter::read;
use crate::stores::qdrant::adapter::{self, Endpoint, PayloadWanted, PointId, ReadPlan, Selection};

/// The most points one narrowed scroll page holds, when Lethe pages through a scope.
const PAGE: usize = 1000;

/// The payload keys a route reads: the one naming a point's subject, and those holding its text.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fields<'a> {
    pub subject: Option<&'a str>,
    pub text: &'a [String],
}

/// One Qdrant request, from classification to the checked answer.
pub(crate) async fn handle(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
    body: Bytes,
    fields: Fields<'_>,
) -> Result<Response<Full<Bytes>>, DataError> {
    let parts = upstream.parts;
    let subject_field = fields.subject;
    match adapter::classify(&parts.method, path) {
        Endpoint::Refused => Err(DataError::unknown_endpoint()),
        Endpoint::NonCanonical => Err(DataError::new(
            StatusCode::BAD_REQUEST,
            Code::InvalidRequest,
            "collection names are letters, digits, '_', '-' and '.'; point ids are unsigned integers or lowercase, hyphenated UUIDs",
        )),
        Endpoint::Admin | Endpoint::CreateCollection { .. } if ctx.claims.role != Role::Admin => {
            Err(DataError::new(
                StatusCode::FORBIDDEN,
                Code::Forbidden,
                "managing collections, their indexes and aliases needs the admin role",
            ))
        }
        Endpoint::CreateCollection { collection } => {
            let answer = upstream.send(parts.method.clone(), path, body).await?;
            if answer.is_success() {
                index_stamp(upstream, &collection).await;
            }
            Ok(answer.passed_on())
        }
        Endpoint::PassThrough | Endpoint::Admin => {
            let answer = upstream.send(parts.method.clone(), path, body).await?;
            Ok(answer.passed_on())
        }
        Endpoint::Upsert { collection } => {
            upsert(upstream, ctx, path, &collection, body, fields).await
        }
        Endpoint::Search { collection, shape } => {
            let (body, mut plan) = read::narrow_search_body(
                &body,
                shape,
                ctx.tenant(),
                ctx.subject.as_deref(),
                crate::now(),
            )?;
            plan.collection.clone_from(&collection);
            if let Some(refused) =
                named_points_refused(upstream, ctx, &collection, &[&plan]).await?
            {
                return Ok(refused);
            }
            self::read(upstream, ctx, path, body, &plan, fields).await
        }
        Endpoint::SearchBatch { collection, shape } => {
            let (body, mut plans) = read::narrow_search_batch_body(
                &body,
                shape,
                ctx.tenant(),
                ctx.subject.as_deref(),
                crate::now(),
            )?;
            for plan in &mut plans {
                plan.collection.clone_from(&collection);
            }
            let all: Vec<&ReadPlan> = plans.iter().collect();
            if let Some(refused) = named_points_refused(upstream, ctx, &collection, &all).await? {
                return Ok(refused);
            }
            let answer = upstream.send(Method::POST, path, Bytes::from(body)).await?;
            if !answer.is_success() {
                return Ok(answer.passed_on());
            }
            let (value, view) = answer_and_view(upstream, ctx, &answer).await?;
            let owners = adapter::owners_of(&value);
            let decided =
                read::decide_batch(value, &plans, &view, &ctx.read_context(), crate::now())?;
            remember_served(upstream, ctx, &collection, &owners, &decided, fields).await?;
            Ok(json_response(answer.status, &decided))
        }
        Endpoint::Scroll { collection } => {
            let (body, mut plan) = adapter::narrow_scroll_body(
                &body,
                ctx.tenant(),
                ctx.subject.as_deref(),
                crate::now(),
            )?;
            plan.collection = collection;
            self::read(upstream, ctx, path, body, &plan, fields).await
        }
        Endpoint::Matrix { collection, .. } => matrix(upstream, ctx, path, &collection, body).await,
        Endpoint::Facet { collection } => facet(upstream, ctx, &collection, body).await,
        Endpoint::Count { collection } => count(upstream, ctx, &collection, body).await,
        Endpoint::Retrieve { collection } => {
            let (ids, payload, with_vector) = adapter::parse_retrieve(&body)?;
            let wanted = Wanted {
                payload: &payload,
                vector: &with_vector,
                served: Some(fields),
            };
            match allowed(upstream, ctx, &collection, &ids, wanted).await? {
                Ok(points) => Ok(ok(json!(points))),
                Err(refused) => Ok(refused.passed_on()),
            }
        }
        Endpoint::GetPoint { collection, id } => {
            let wanted = Wanted {
                payload: &PayloadWanted::All,
                vector: &json!(true),
                served: Some(fields),
            };
            let points = allowed(
                upstream,
                ctx,
                &collection,
                std::slice::from_ref(&id),
                wanted,
            )
            .await?;
            let points = match points {
                Ok(points) => points,
                Err(refused) => return Ok(refused.passed_on()),
            };
            match points.into_iter().next() {
                Some(point) => Ok(ok(point)),
                // Whether the point exists is not the caller's to learn.
                None => Ok(json_response(
                    StatusCode::NOT_FOUND,
                    &json!({ "status": { "error": format!("Not found: Point with id {} does not exists!", id.key()) }, "time": 0.0 }),
                )),
            }
        }
        Endpoint::Delete { collection } => delete(upstream, ctx, &collection, body).await,
        Endpoint::Edit { collection, kind } => {
            let op = edit::parse_edit(kind, &body, subject_field)?;
            batch(upstream, ctx, &collection, vec![op], true, fields).await
        }
        Endpoint::Batch { collection } => {
            let ops = edit::parse_batch(&body, &ctx.scope(), subject_field)?;
            batch(upstream, ctx, &collection, ops, false, fields).await
        }
    }
}

/// Indexes the stamp of a collection just created, so that narrowed reads stay cheap. Reads are
/// correct without the indexes, only slower: a failure is logged, not the client's.
async fn index_stamp(upstream: &Upstream<'_>, collection: &str) {
    for index in adapter::stamp_indexes() {
        let sent = upstream
            .send_query(
                Method::PUT,
                &format!("/collections/{collection}/index"),
                Some("wait=true"),
                Bytes::from(index.to_string()),
            )
            .await;
        if !sent.as_ref().is_ok_and(Answer::is_success) {
            tracing::warn!(route = %upstream.route.name, "a stamp index could not be created; narrowed reads of the collection will be slower");
        }
    }
}

/// Qdrant's answer shape for a result Lethe computed.
fn ok(result: Value) -> Response<Full<Bytes>> {
    json_response(
        StatusCode::OK,
        &json!({ "result": result, "status": "ok", "time": 0.0 }),
    )
}

fn points_path(collection: &str, op: &str) -> String {
    format!("/collections/{collection}/points/{op}")
}

async fn upsert(
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
    let subjects: Vec<&str> = planned
        .subjects()
        .into_iter()
        .chain(derivations.owners())
        .collect();
    let view = state.policy.view(tenant, subjects).await?;
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

/// An answer as JSON, with the policy of every subject of the caller's tenant in it.
async fn answer_and_view(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    answer: &Answer,
) -> Result<(Value, View), DataError> {
    let value: Value = serde_json::from_slice(&answer.body)
        .map_err(|_| crate::data::records::AdapterError::UpstreamInvalid("not JSON".into()))?;
    let tenant = ctx.tenant();
    let view = upstream
        .state
        .policy
        .view_of_owners(tenant, &adapter::subjects_in(&value))
        .await?;
    Ok((value, view))
}

/// What a read through the caller's scope wants of each point, and, when the points reach the
/// client, the fields that say whose they are and what text they carry (to remember as served).
#[derive(Clone, Copy)]
struct Wanted<'a> {
    payload: &'a PayloadWanted,
    vector: &'a Value,
    served: Option<Fields<'a>>,
}

impl Wanted<'static> {
    /// Ids and nothing else, for Lethe's own use.
    const IDS: Wanted<'static> = Wanted {
        payload: &PayloadWanted::None,
        vector: &Value::Bool(false),
        served: None,
    };
}

/// Decides every point of an answer; with `served`, what reaches the client is remembered.
async fn decided(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    answer: &Answer,
    plan: &ReadPlan,
    served: Option<Fields<'_>>,
) -> Result<Value, DataError> {
    let (value, view) = answer_and_view(upstream, ctx, answer).await?;
    let owners = served.map(|_| adapter::owners_of(&value));
    let decided = read::decide_answer(value, plan, &view, &ctx.read_context(), crate::now())?;
    if let (Some(fields), Some(owners)) = (served, owners) {
        remember_served(upstream, ctx, &plan.collection, &owners, &decided, fields).await?;
    }
    Ok(decided)
}

/// Remembers the points an answer serves (decided already), for what the caller derives from
/// them: whose each is (its stamp before the answer was cut to what the client asked for) and
/// the text it reached the client with.
async fn remember_served(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    collection: &str,
    owners: &BTreeMap<String, String>,
    decided: &Value,
    fields: Fields<'_>,
) -> Result<(), DataError> {
    let derivation = &upstream.state.derivation;
    if !derivation.enabled() {
        return Ok(());
    }
    let served = adapter::served_points(decided, owners, fields.text)
        .into_iter()
        .map(|(id, owner, text)| Served {
            collection: collection.to_owned(),
            id,
            owner,
            text,
            answer: false,
        })
        .collect();
    derivation.served(ctx, served).await
}

async fn read(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
    body: Vec<u8>,
    plan: &ReadPlan,
    fields: Fields<'_>,
) -> Result<Response<Full<Bytes>>, DataError> {
    let answer = upstream.send(Method::POST, path, Bytes::from(body)).await?;
    if !answer.is_success() {
        return Ok(answer.passed_on());
    }
    let filtered = decided(upstream, ctx, &answer, plan, Some(fields)).await?;
    Ok(json_response(answer.status, &filtered))
}

/// Every point in the caller's scope, among `ids` or matching `filter`, that it may read: the
/// narrowed scroll, page by page, each page decided. Qdrant's answer when it refuses the scroll.
async fn in_scope(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    collection: &str,
    ids: Option<&[PointId]>,
    filter: Option<&Value>,
    wanted: Wanted<'_>,
) -> Result<Result<Vec<Value>, Answer>, DataError> {
    let plan = ReadPlan {
        collection: collection.to_owned(),
        payload: wanted.payload.clone(),
        ..ReadPlan::default()
    };
    let mut points = Vec::new();
    let mut offset: Option<Value> = None;
    loop {
        let body = adapter::scoped_scroll(
            Selection { ids, filter },
            ctx.tenant(),
            ctx.subject.as_deref(),
            Some(crate::now()),
            PAGE,
            offset.as_ref(),
            wanted.vector,
        )?;
        let answer = upstream
            .send_query(
                Method::POST,
                &points_path(collection, "scroll"),
                None,
                Bytes::from(body),
            )
            .await?;
        if !answer.is_success() {
            // A missing collection, say: the client hears Qdrant's own answer.
            return Ok(Err(answer));
        }
        let value: Value = serde_json::from_slice(&answer.body)
            .map_err(|_| crate::data::records::AdapterError::UpstreamInvalid("not JSON".into()))?;
        offset = adapter::next_page(&value);
        let page = decided(upstream, ctx, &answer, &plan, wanted.served).await?;
        if let Some(Value::Array(found)) = page.get("result").and_then(|r| r.get("points")) {
            points.extend(found.iter().cloned());
        }
        if offset.is_none() {
            return Ok(Ok(points));
        }
    }
}

/// A retrieval by ids, as a narrowed scroll: no point outside the caller's scope is read.
async fn allowed(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    collection: &str,
    ids: &[PointId],
    wanted: Wanted<'_>,
) -> Result<Result<Vec<Value>, Answer>, DataError> {
    if ids.is_empty() {
        return Ok(Ok(Vec::new()));
    }
    in_scope(upstream, ctx, collection, Some(ids), None, wanted).await
}

/// A count of what the caller may read, never of what it may not.
async fn count(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    collection: &str,
    body: Bytes,
) -> Result<Response<Full<Bytes>>, DataError> {
    let filter = adapter::parse_count(&body)?;
    let points = in_scope(
        upstream,
        ctx,
        collection,
        None,
        filter.as_ref(),
        Wanted::IDS,
    )
    .await?;
    match points {
        Ok(points) => Ok(ok(json!({ "count": points.len() }))),
        Err(refused) => Ok(refused.passed_on()),
    }
}

/// A delete removes only what the caller's scope covers: the named points (or those the filter
/// selects) that it may see are deleted by id, and their lineage marked deleted.
async fn delete(
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
async fn batch(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    collection: &str,
    mut ops: Vec<Op>,
    single: bool,
    fields: Fields<'_>,
) -> Result<Response<Full<Bytes>>, DataError> {
    let tenant = ctx.tenant();
    let subject_field = fields.subject;
    let (derived, op_of) = derive_upserts(upstream, ctx, collection, &mut ops, fields).await?;
    let mut before = Before::default();
    let upserted: Vec<PointId> = ops
        .iter()
        .filter(|op| matches!(op, Op::Upsert(_)))
        .flat_map(Op::named_ids)
        .collect();
    if !upserted.is_empty() {
        before.held = match held(upstream, collection, &upserted).await? {
            Ok(held) => held,
            Err(refused) => return Ok(refused.passed_on()),
        };
    }
    let stamp_only = PayloadWanted::Keys(
        crate::stores::kit::stamp::STAMP_KEYS
            .map(str::to_owned)
            .to_vec(),
    );
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
        match in_scope(
            upstream,
            ctx,
            collection,
            Some(&named),
            None,
            Wanted {
                payload: &stamp_only,
                ..Wanted::IDS
            },
        )
        .await?
        {
            Ok(points) => before.visible = stamped(points).collect(),
            Err(refused) => return Ok(refused.passed_on()),
        }
    }
    if let Some(filter) = ops.first().and_then(Op::filter) {
        match in_scope(
            upstream,
            ctx,
            collection,
            None,
            Some(filter),
            Wanted {
                payload: &stamp_only,
                ..Wanted::IDS
            },
        )
        .await?
        {
            Ok(points) => before.selected = stamped(points).collect(),
            Err(refused) => return Ok(refused.passed_on()),
        }
    }
    let (edited, edit_of) =
        derive_edits(upstream, ctx, collection, &ops, &mut before, fields).await?;
    let mut subjects: Vec<&str> = before
        .visible
        .values()
        .chain(before.selected.iter().map(|(_, s)| s))
        .map(|s| s.subject.as_str())
        .collect();
    for op in &ops {
        if let Op::Upsert(planned) = op {
            subjects.extend(planned.subjects());
        }
    }
    subjects.extend(derived.owners());
    subjects.extend(edited.owners());
    let view = upstream
        .state
        .policy
        .view(
            tenant,
            subjects
                .into_iter()
                .collect::<std::collections::BTreeSet<_>>(),
        )
        .await?;
    let mut at: Vec<RecordRefusal> = Vec::new();
    for (derivations, op_of) in [(&derived, &op_of), (&edited, &edit_of)] {
        if let Err(AdapterError::Refused(refused)) = derivations.check(&view, tenant) {
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

/// Qdrant's answer to a request naming a point that does not exist, for one the caller may
/// not see as well: the two are not told apart.
fn no_point(id: &PointId) -> Response<Full<Bytes>> {
    json_response(
        StatusCode::NOT_FOUND,
        &json!({ "status": { "error": format!("Not found: No point with id {} found", id.key()) }, "time": 0.0 }),
    )
}

/// A search that names points (as its query vector, as examples, in `lookup_from`'s collection)
/// is sent only when each of them is the caller's to read; otherwise the answer to send back.
async fn named_points_refused(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    collection: &str,
    plans: &[&ReadPlan],
) -> Result<Option<Response<Full<Bytes>>>, DataError> {
    let mut by_collection: std::collections::BTreeMap<&str, Vec<PointId>> = Default::default();
    for (named_in, id) in plans.iter().flat_map(|p| &p.refs) {
        by_collection
            .entry(named_in.as_deref().unwrap_or(collection))
            .or_default()
            .push(id.clone());
    }
    for (named_in, mut ids) in by_collection {
        ids.sort();
        ids.dedup();
        let found = match allowed(upstream, ctx, named_in, &ids, Wanted::IDS).await? {
            Ok(found) => found,
            Err(refused) => return Ok(Some(refused.passed_on())),
        };
        let seen: Vec<PointId> = found
            .iter()
            .filter_map(|p| p.get("id").and_then(PointId::parse))
            .collect();
        if let Some(missing) = ids.iter().find(|id| !seen.contains(id)) {
            return Ok(Some(no_point(missing)));
        }
    }
    Ok(None)
}

/// The distance matrix of a sample of the caller's points; pairs or offsets naming a point the
/// caller may not read (a suppressed subject's, say) are dropped.
async fn matrix(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
    collection: &str,
    body: Bytes,
) -> Result<Response<Full<Bytes>>, DataError> {
    let body = read::narrow_matrix_body(&body, ctx.tenant(), ctx.subject.as_deref(), crate::now())?;
    let answer = upstream.send(Method::POST, path, Bytes::from(body)).await?;
    if !answer.is_success() {
        return Ok(answer.passed_on());
    }
    let value: Value = serde_json::from_slice(&answer.body)
        .map_err(|_| crate::data::records::AdapterError::UpstreamInvalid("not JSON".into()))?;
    let ids = read::matrix_ids(&value);
    let readable = match allowed(upstream, ctx, collection, &ids, Wanted::IDS).await? {
        Ok(found) => found
            .iter()
            .filter_map(|p| p.get("id").and_then(PointId::parse))
            .collect(),
        Err(refused) => return Ok(refused.passed_on()),
    };
    Ok(json_response(
        answer.status,
        &read::keep_matrix(value, &readable)?,
    ))
}

/// Counts of a payload key's values among the points the caller may read, never of others.
async fn facet(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    collection: &str,
    body: Bytes,
) -> Result<Response<Full<Bytes>>, DataError> {
    let (key, filter, limit) = read::parse_facet(&body)?;
    let points = in_scope(
        upstream,
        ctx,
        collection,
        None,
        filter.as_ref(),
        Wanted {
            payload: &PayloadWanted::All,
            ..Wanted::IDS
        },
    )
    .await?;
    match points {
        Ok(points) => Ok(ok(read::facet_hits(&points, &key, limit))),
        Err(refused) => Ok(refused.passed_on()),
    }
}
