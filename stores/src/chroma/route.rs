//! The Chroma route: the I/O around the pure adapter in `crate::chroma::adapter`.

use crate::error_shape::Code;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Response, StatusCode};
use lethe_policy::Layer;
use serde_json::{Value, json};

use crate::auth::Role;
use crate::chroma::adapter::{self as adapter, Endpoint, ReadPlan, WriteKind};
use crate::data::derivation::{Served, derived_before};
use crate::data::error::{DataError, json_response};
use crate::data::forward::Answer;
use crate::data::overtaken::{Recording, keep_unless_overtaken};
use crate::data::{DataState, RequestContext, Upstream};
use crate::state::ItemRecord;

/// Why a request is refused before anything is sent for it, if it is.
pub(crate) fn refusal(endpoint: &Endpoint, ctx: &RequestContext) -> Option<DataError> {
    match endpoint {
        Endpoint::Refused => Some(DataError::unknown_endpoint()),
        Endpoint::NonCanonical => Some(DataError::new(
            StatusCode::BAD_REQUEST,
            Code::InvalidRequest,
            "collection ids are written as lowercase, hyphenated UUIDs",
        )),
        Endpoint::Admin if ctx.claims.role != Role::Admin => Some(DataError::new(
            StatusCode::FORBIDDEN,
            Code::Forbidden,
            "managing tenants, databases and collections needs the admin role",
        )),
        _ => None,
    }
}

/// One Chroma request, from classification to the checked answer.
pub(crate) async fn handle(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
    body: Bytes,
) -> Result<Response<Full<Bytes>>, DataError> {
    let parts = upstream.parts;
    let endpoint = adapter::classify(&parts.method, path);
    if let Some(refused) = refusal(&endpoint, ctx) {
        return Err(refused);
    }
    match endpoint {
        // Refused above already.
        Endpoint::Refused | Endpoint::NonCanonical => Err(DataError::unknown_endpoint()),
        Endpoint::PassThrough | Endpoint::Admin => {
            let answer = upstream.send(parts.method.clone(), path, body).await?;
            Ok(answer.passed_on())
        }
        Endpoint::Write { collection, kind } => {
            write(upstream, ctx, path, &collection, kind, body).await
        }
        Endpoint::Get { collection } => read(upstream, ctx, path, &collection, body, false).await,
        Endpoint::Query { collection } => read(upstream, ctx, path, &collection, body, true).await,
        Endpoint::Count { collection } => count(upstream, ctx, path, &collection).await,
        Endpoint::Delete { collection } => delete(upstream, ctx, path, &collection, body).await,
    }
}

async fn write(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
    collection: &str,
    kind: WriteKind,
    body: Bytes,
) -> Result<Response<Full<Bytes>>, DataError> {
    let Upstream { state, route, .. } = *upstream;
    let tenant = ctx.tenant();
    let scope = ctx.scope();
    let mut planned = adapter::plan_write(&body, &scope)?;
    let documents: Vec<String> = planned.documents().into_iter().map(str::to_owned).collect();
    let texts: Vec<&str> = documents.iter().map(String::as_str).collect();
    let derivations = state
        .derivation
        .derive(ctx, collection, &mut planned.records, String::clone, &texts)
        .await?;
    // The owners of what the write derives from decide it too.
    let owners: Vec<&str> = planned
        .subjects()
        .into_iter()
        .chain(derivations.owners())
        .collect();
    let view = state.policy.view(tenant, owners).await?;
    adapter::check_write(&planned, tenant, &view, crate::now())?;
    derivations.check(&view, tenant)?;
    // The stamps Chroma holds under these ids decide who owns them, not lineage.
    let found = upstream
        .send(
            Method::POST,
            &sibling(path, "get"),
            Bytes::from(adapter::held_query(&planned)),
        )
        .await?;
    if !found.is_success() {
        return Ok(found.passed_on());
    }
    let held = adapter::held_stamps(&found.body)?;
    // A record held as derived whose document this write leaves as it was (an update of its
    // metadata or embedding) still holds what it derived from: it stays derived, and what it
    // derives from now is added to that. One whose document is replaced derives from the new
    // one only, once Chroma took it.
    let mut rewritten = derived_before(&held, String::clone);
    for (record, document) in planned.records.iter_mut().zip(&documents) {
        if document.is_empty() && rewritten.contains(&record.id) {
            record.layer = Layer::Derived;
            rewritten.retain(|id| *id != record.id);
        }
    }
    let now = crate::now();
    let stamped = adapter::apply_write(planned, tenant, &view, &held, kind, now)?;
    let Some(body) = stamped.body else {
        // An update of ids Chroma does not hold: Chroma would ignore them too.
        return Ok(json_response(StatusCode::OK, &json!({})));
    };
    let written: Vec<String> = stamped.stamps.iter().map(|(id, _)| id.clone()).collect();
    state.derivation.record(ctx, &derivations, &written).await?;
    let answer = upstream.send(Method::POST, path, Bytes::from(body)).await?;
    if !answer.is_success() {
        return Ok(answer.passed_on());
    }
    let rows = stamped
        .stamps
        .into_iter()
        .map(|(id, stamp)| {
            ItemRecord::stamped(&route.name, collection, id, stamp, now, ctx.source.clone())
        })
        .collect();
    let undo = |overtaken: Vec<ItemRecord>| async move {
        let ids: Vec<&str> = overtaken.iter().map(|r| r.item_id.as_str()).collect();
        let body = Bytes::from(json!({ "ids": ids }).to_string());
        let undone = upstream
            .send(Method::POST, &sibling(path, "delete"), body)
            .await;
        // Left to the purge, which finds them by stamp and by lineage.
        if undone.is_ok_and(|a| a.is_success()) {
            Vec::new()
        } else {
            overtaken
        }
    };
    let derived = Some(&derivations);
    keep_unless_overtaken(
        upstream.state,
        tenant,
        rows,
        Recording::Batched,
        derived,
        undo,
    )
    .await?;
    state
        .derivation
        .accepted(ctx, derivations, &written, &rewritten)
        .await?;
    Ok(answer.passed_on())
}

/// Decides every record of a read answer; the policy of every subject in it is loaded first.
/// What it serves (`serves`: records, not a count of them) is remembered for what the caller
/// derives from it.
async fn filter(
    state: &DataState,
    ctx: &RequestContext,
    answer: &Answer,
    plan: &ReadPlan,
    serves: bool,
) -> Result<Value, DataError> {
    let value: Value = serde_json::from_slice(&answer.body)
        .map_err(|_| crate::data::records::AdapterError::UpstreamInvalid("not JSON".into()))?;
    let tenant = ctx.tenant();
    let view = state
        .policy
        .view_of_owners(tenant, &adapter::subjects_in(&value))
        .await?;
    let read_ctx = ctx.read_context();
    let mut filtered = adapter::filter_read(value, plan, &view, &read_ctx, crate::now())?;
    if serves && state.derivation.enabled() {
        let served = adapter::served(&filtered, plan)
            .into_iter()
            .map(|r| Served {
                collection: plan.collection.clone(),
                id: r.id,
                owner: r.owner,
                text: r.document,
                answer: false,
            })
            .collect();
        state.derivation.served(ctx, served).await?;
    }
    adapter::strip_added(&mut filtered, plan);
    Ok(filtered)
}

async fn read(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
    collection: &str,
    body: Bytes,
    nested: bool,
) -> Result<Response<Full<Bytes>>, DataError> {
    let (body, plan) = adapter::narrow_read(
        &body,
        collection,
        nested,
        ctx.tenant(),
        ctx.subject.as_deref(),
        crate::now(),
    )?;
    let answer = upstream.send(Method::POST, path, Bytes::from(body)).await?;
    if !answer.is_success() {
        return Ok(answer.passed_on());
    }
    let filtered = filter(upstream.state, ctx, &answer, &plan, true).await?;
    Ok(json_response(answer.status, &filtered))
}

/// `.../count` becomes a narrowed `.../get` whose allowed records are counted.
async fn count(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
    collection: &str,
) -> Result<Response<Full<Bytes>>, DataError> {
    let get_path = sibling(path, "get");
    let body = adapter::scoped_get(
        None,
        None,
        adapter::read_conditions(ctx.tenant(), ctx.subject.as_deref(), crate::now()),
    );
    let answer = upstream
        .send(Method::POST, &get_path, Bytes::from(body))
        .await?;
    if !answer.is_success() {
        return Ok(answer.passed_on());
    }
    let plan = ReadPlan {
        collection: collection.to_owned(),
        ..ReadPlan::default()
    };
    let filtered = filter(upstream.state, ctx, &answer, &plan, false).await?;
    let n = filtered
        .get("ids")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    Ok(json_response(StatusCode::OK, &json!(n)))
}

/// A delete removes only what the caller's scope covers: Lethe first asks which of the named
/// records are in scope, deletes those by id, and marks their lineage deleted.
async fn delete(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
    collection: &str,
    body: Bytes,
) -> Result<Response<Full<Bytes>>, DataError> {
    let Upstream { state, route, .. } = *upstream;
    let (ids, filter) = adapter::parse_delete(&body)?;
    let conditions = adapter::delete_conditions(ctx.tenant(), ctx.subject.as_deref());
    let body = adapter::scoped_get(ids, filter, conditions);
    let found = upstream
        .send(Method::POST, &sibling(path, "get"), Bytes::from(body))
        .await?;
    if !found.is_success() {
        return Ok(found.passed_on());
    }
    let ids = adapter::owned_ids(&found.body, ctx.tenant(), ctx.subject.as_deref())?;
    if ids.is_empty() {
        return Ok(json_response(StatusCode::OK, &json!({ "deleted": 0 })));
    }
    let answer = upstream
        .send(
            Method::POST,
            path,
            Bytes::from(json!({ "ids": ids }).to_string()),
        )
        .await?;
    if answer.is_success() {
        state
            .store
            .mark_items_deleted(&route.name, collection, &ids, crate::now())
            .await?;
    }
    Ok(answer.passed_on())
}

/// `.../collections/{id}/count` -> `.../collections/{id}/get`.
fn sibling(path: &str, op: &str) -> String {
    match path.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{op}"),
        None => op.to_owned(),
    }
}
