//! The Qdrant route's reads: every point an answer holds is decided, every read of Lethe's own
//! is narrowed to the caller's scope, and what reaches the client is remembered as served.

use std::collections::BTreeMap;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Response, StatusCode};
use serde_json::{Value, json};

use super::{Fields, no_point, ok, points_path};
use crate::data::derivation::Served;
use crate::data::error::{DataError, json_response};
use crate::data::forward::Answer;
use crate::data::policy_cache::View;
use crate::data::{RequestContext, Upstream};
use crate::qdrant::adapter::read;
use crate::qdrant::adapter::read::SearchShape;
use crate::qdrant::adapter::{self, PayloadWanted, PointId, ReadPlan, Selection};

/// The most points one narrowed scroll page holds, when Lethe pages through a scope.
const PAGE: usize = 1000;

/// An answer as JSON, with the policy of every subject of the caller's tenant in it.
pub(super) async fn answer_and_view(
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
pub(super) struct Wanted<'a> {
    pub payload: &'a PayloadWanted,
    pub vector: &'a Value,
    pub served: Option<Fields<'a>>,
}

impl Wanted<'static> {
    /// Ids and nothing else, for Lethe's own use.
    pub(super) const IDS: Wanted<'static> = Wanted {
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
pub(super) async fn remember_served(
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

pub(super) async fn read(
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
pub(super) async fn in_scope(
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
pub(super) async fn allowed(
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
pub(super) async fn count(
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

/// A search that names points (as its query vector, as examples, in `lookup_from`'s collection)
/// is sent only when each of them is the caller's to read; otherwise the answer to send back.
pub(super) async fn named_points_refused(
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
pub(super) async fn matrix(
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
pub(super) async fn facet(
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

/// A search (query, recommend, discover, ...): sent narrowed to the caller's scope once every
/// point it names is the caller's to read, its answer decided point by point.
pub(super) async fn search(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
    collection: &str,
    (body, shape): (Bytes, SearchShape),
    fields: Fields<'_>,
) -> Result<Response<Full<Bytes>>, DataError> {
    let (body, mut plan) = read::narrow_search_body(
        &body,
        shape,
        ctx.tenant(),
        ctx.subject.as_deref(),
        crate::now(),
    )?;
    plan.collection = collection.to_owned();
    if let Some(refused) = named_points_refused(upstream, ctx, collection, &[&plan]).await? {
        return Ok(refused);
    }
    self::read(upstream, ctx, path, body, &plan, fields).await
}

/// A batch of searches, each narrowed and decided as one would be.
pub(super) async fn search_batch(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
    collection: &str,
    (body, shape): (Bytes, SearchShape),
    fields: Fields<'_>,
) -> Result<Response<Full<Bytes>>, DataError> {
    let (body, mut plans) = read::narrow_search_batch_body(
        &body,
        shape,
        ctx.tenant(),
        ctx.subject.as_deref(),
        crate::now(),
    )?;
    for plan in &mut plans {
        plan.collection = collection.to_owned();
    }
    let all: Vec<&ReadPlan> = plans.iter().collect();
    if let Some(refused) = named_points_refused(upstream, ctx, collection, &all).await? {
        return Ok(refused);
    }
    let answer = upstream.send(Method::POST, path, Bytes::from(body)).await?;
    if !answer.is_success() {
        return Ok(answer.passed_on());
    }
    let (value, view) = answer_and_view(upstream, ctx, &answer).await?;
    let owners = adapter::owners_of(&value);
    let decided = read::decide_batch(value, &plans, &view, &ctx.read_context(), crate::now())?;
    remember_served(upstream, ctx, collection, &owners, &decided, fields).await?;
    Ok(json_response(answer.status, &decided))
}

/// Points retrieved by id: those of the caller's scope among them.
pub(super) async fn retrieve(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    collection: &str,
    body: Bytes,
    fields: Fields<'_>,
) -> Result<Response<Full<Bytes>>, DataError> {
    let (ids, payload, with_vector) = adapter::parse_retrieve(&body)?;
    let wanted = Wanted {
        payload: &payload,
        vector: &with_vector,
        served: Some(fields),
    };
    match allowed(upstream, ctx, collection, &ids, wanted).await? {
        Ok(points) => Ok(ok(json!(points))),
        Err(refused) => Ok(refused.passed_on()),
    }
}

/// One point by id, answered as missing when the caller may not read it.
pub(super) async fn get_point(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    collection: &str,
    id: PointId,
    fields: Fields<'_>,
) -> Result<Response<Full<Bytes>>, DataError> {
    let wanted = Wanted {
        payload: &PayloadWanted::All,
        vector: &json!(true),
        served: Some(fields),
    };
    let points = allowed(upstream, ctx, collection, std::slice::from_ref(&id), wanted).await?;
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
