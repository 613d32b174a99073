//! The LangGraph route: the I/O around the pure adapter in `crate::langgraph::adapter`.
//!
//! A thread is registered (a lineage row written before the client hears of the thread) when it
//! is created through Lethe; every later request about the thread is decided on that registration,
//! before anything reaches the server.

use crate::error_shape::Code;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Response, StatusCode};
use lethe_policy::{Held, Layer, Refusal, Stamp, decide_read_item};
use serde_json::{Value, json};

use crate::auth::Role;
use crate::data::derivation::{Served, Writing};
use crate::data::error::{DataError, json_response};
use crate::data::forward::Answer;
use crate::data::overtaken::{Recording, keep_unless_overtaken};
use crate::data::records::AdapterError;
use crate::data::stream::{Opened, Watch, open_events};
use crate::data::{Body, RequestContext, Upstream, whole};
use crate::kit::text::text_of;
use crate::langgraph::adapter::{self as adapter, Endpoint, Namespace, STORE, THREADS};
use crate::state::ItemRecord;

type Answered = Result<Response<Full<Bytes>>, DataError>;

/// Counting reads threads in pages of this many, and stops after this many pages.
const COUNT_PAGE: usize = 1000;
const COUNT_PAGES: usize = 100;

/// One LangGraph request, from classification to the checked answer.
/// `ns`: the route's namespace template, where each subject's store items live.
pub(crate) async fn handle(
    ns: &Namespace,
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
    body: Bytes,
) -> Result<Response<Body>, DataError> {
    match adapter::classify(&upstream.parts.method, path) {
        Endpoint::ThreadWrite { thread, patch } => {
            thread_write(upstream, ctx, path, body, &thread, patch).await
        }
        endpoint => answer(ns, upstream, ctx, path, body, endpoint)
            .await
            .map(whole),
    }
}

/// Every endpoint but writes into a thread: answered whole.
async fn answer(
    ns: &Namespace,
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
    body: Bytes,
    endpoint: Endpoint,
) -> Answered {
    match endpoint {
        Endpoint::Refused => Err(DataError::unknown_endpoint()),
        Endpoint::NonCanonical => Err(DataError::new(
            StatusCode::BAD_REQUEST,
            Code::InvalidRequest,
            "thread ids are written as lowercase, hyphenated UUIDs",
        )),
        Endpoint::Admin if ctx.claims.role != Role::Admin => Err(DataError::new(
            StatusCode::FORBIDDEN,
            Code::Forbidden,
            "managing assistants needs the admin role",
        )),
        Endpoint::PassThrough | Endpoint::Admin => pass(upstream, path, body).await,
        Endpoint::CreateThread => create_thread(upstream, ctx, path, body).await,
        Endpoint::SearchThreads => search_threads(upstream, ctx, path, body).await,
        Endpoint::CountThreads => count_threads(upstream, ctx, body).await,
        Endpoint::ThreadRead { thread } => {
            let stamp = registered(upstream, &thread).await?;
            let view = owner_view(upstream, ctx, stamp.as_ref()).await?;
            let now = crate::now();
            decide_read_item(
                &view,
                &ctx.read_context(),
                THREADS,
                &thread,
                stamp.as_ref(),
                now,
            )?;
            let answer = send(upstream, path, body).await?;
            if let Some(stamp) = &stamp {
                served_thread(upstream, ctx, &thread, &stamp.subject, Some(&answer)).await?;
            }
            Ok(answer.passed_on())
        }
        // Dispatched by `handle`.
        Endpoint::ThreadWrite { .. } => Err(DataError::unknown_endpoint()),
        Endpoint::DeleteThread { thread } => delete_thread(upstream, ctx, path, &thread).await,
        Endpoint::PutItem => put_item(ns, upstream, ctx, path, body).await,
        Endpoint::GetItem => get_item(ns, upstream, ctx, path).await,
        Endpoint::SearchItems => search_items(upstream, ctx, path, body).await,
        Endpoint::DeleteItem => delete_item(ns, upstream, ctx, path, body).await,
        Endpoint::ListNamespaces => list_namespaces(ns, upstream, ctx, path, body).await,
    }
}

/// A write into a thread (a run, a state update, new metadata), decided on its registration. A
/// streamed run is relayed event by event while its subject stays active. What the write derives
/// from is added to what the thread derives from.
async fn thread_write(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
    body: Bytes,
    thread: &str,
    patch: bool,
) -> Result<Response<Body>, DataError> {
    let state = upstream.state;
    let stamp = registered(upstream, thread).await?;
    let view = owner_view(upstream, ctx, stamp.as_ref()).await?;
    let now = crate::now();
    let mut stamp = adapter::decide_thread_write(stamp.as_ref(), &ctx.scope(), &view, now)?;
    // Runs and metadata changes answer with the thread's content: a read, too.
    decide_read_item(
        &view,
        &ctx.read_context(),
        THREADS,
        thread,
        Some(&stamp),
        now,
    )?;
    let text = adapter::check_thread_write(&body)?;
    let writes = [Writing {
        collection: THREADS,
        id: thread,
        owner: &stamp.subject,
        text: &text,
    }];
    let derivations = state.derivation.parents(ctx, &writes).await?;
    if derivations.layer(0) == Layer::Derived {
        let owners: Vec<&str> = derivations.owners().collect();
        let view = state.policy.view(ctx.tenant(), owners).await?;
        derivations.check(&view, ctx.tenant())?;
        state.derivation.record_added(ctx, &derivations).await?;
        if stamp.layer != Layer::Derived {
            // The thread's registration is its stamp.
            stamp.layer = Layer::Derived;
            let row = ItemRecord::stamped(
                &upstream.route.name,
                THREADS,
                thread.to_owned(),
                stamp.clone(),
                now,
                ctx.source.clone(),
            );
            state.store.record_items(&[row]).await?;
        }
    }
    let body = if patch {
        Bytes::from(adapter::restamp_patch(&body, &stamp)?)
    } else {
        body
    };
    // A run's answer is decided when it is sent, event by event or whole: a run takes seconds
    // to minutes, and meanwhile its thread's subject (or one its input derives from) may have
    // been put under erasure, or the caller's token revoked.
    let watch = Watch::new(upstream.state, ctx, &stamp.subject, stamp.epoch)
        .deriving_from(derivations.owners());
    if !path.ends_with("/runs/stream") {
        let answer = send(upstream, path, body).await?;
        watch.still_holds().await?;
        served_thread(upstream, ctx, thread, &stamp.subject, Some(&answer)).await?;
        return Ok(whole(answer.passed_on()));
    }
    // A streamed run's output is not remembered as text; the thread is, under the trace.
    served_thread(upstream, ctx, thread, &stamp.subject, None).await?;
    Ok(match open_events(upstream, path, body).await? {
        Opened::Events(events) => events.relay(watch, None, None),
        Opened::Whole(answer) => {
            watch.still_holds().await?;
            whole(answer.passed_on())
        }
    })
}

/// Remembers that a thread was served (its state, history, runs or a run's output), with the
/// text of a successful answer.
async fn served_thread(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    thread: &str,
    owner: &str,
    answer: Option<&Answer>,
) -> Result<(), DataError> {
    let derivation = &upstream.state.derivation;
    if !derivation.enabled() || answer.is_some_and(|a| !a.is_success()) {
        return Ok(());
    }
    let text = answer
        .and_then(|a| serde_json::from_slice::<Value>(&a.body).ok())
        .map(|v| text_of(&v))
        .unwrap_or_default();
    let served = Served {
        collection: THREADS.to_owned(),
        id: thread.to_owned(),
        owner: owner.to_owned(),
        text,
        answer: false,
    };
    derivation.served(ctx, vec![served]).await
}

/// Sends the client's request as it is.
async fn send(upstream: &Upstream<'_>, path: &str, body: Bytes) -> Result<Answer, DataError> {
    upstream
        .send(upstream.parts.method.clone(), path, body)
        .await
}

async fn pass(upstream: &Upstream<'_>, path: &str, body: Bytes) -> Answered {
    Ok(send(upstream, path, body).await?.passed_on())
}

fn json_of(body: &[u8]) -> Result<Value, DataError> {
    serde_json::from_slice(body)
        .map_err(|_| AdapterError::UpstreamInvalid("not JSON".into()).into())
}

/// The policy of a registered thread's owner (none to load for an unregistered thread).
async fn owner_view(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    stamp: Option<&Stamp>,
) -> Result<crate::data::policy_cache::View, DataError> {
    let owner: Vec<&str> = stamp.map(|s| s.subject.as_str()).into_iter().collect();
    Ok(upstream.state.policy.view(ctx.tenant(), owner).await?)
}

/// The thread's registration, if Lethe registered it and it is not deleted.
async fn registered(upstream: &Upstream<'_>, thread: &str) -> Result<Option<Stamp>, DataError> {
    let mut stamps = upstream
        .state
        .store
        .item_stamps(&upstream.route.name, THREADS, &[thread.to_owned()])
        .await?;
    Ok(stamps.remove(thread))
}

async fn create_thread(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
    body: Bytes,
) -> Answered {
    let Upstream { state, route, .. } = *upstream;
    let planned = adapter::plan_thread(&body, &ctx.scope())?;
    let view = state
        .policy
        .view(ctx.tenant(), [planned.subject.as_str()])
        .await?;
    // A thread id a client chooses must be new to Lethe: one it registered, even one deleted
    // since, is never handed out again.
    if let Some(id) = &planned.id
        && registered_ever(upstream, id).await?
    {
        return Err(Refusal::AlreadyExists.into());
    }
    let requested = planned.id.clone();
    let now = crate::now();
    let (body, stamp) =
        adapter::stamp_item(planned, "metadata", ctx.tenant(), &view, Held::Nothing, now)?;
    let answer = upstream.send(Method::POST, path, Bytes::from(body)).await?;
    if !answer.is_success() {
        return Ok(answer.passed_on());
    }
    let id = adapter::created_thread_id(&answer.body, requested.as_deref(), &stamp)?;
    let undo_path = format!("/threads/{id}");
    let row = ItemRecord::stamped(&route.name, THREADS, id, stamp, now, ctx.source.clone());
    // Registered before the client learns the id: its next request is decided on it.
    let undo = |rows| undo_with(upstream, Method::DELETE, undo_path, Bytes::new(), rows);
    keep_unless_overtaken(
        upstream.state,
        ctx.tenant(),
        vec![row],
        Recording::AtOnce,
        None,
        undo,
    )
    .await?;
    Ok(answer.passed_on())
}

/// Whether Lethe ever registered this thread id, live or deleted.
async fn registered_ever(upstream: &Upstream<'_>, id: &str) -> Result<bool, DataError> {
    let owners = upstream
        .state
        .store
        .item_owners(&upstream.route.name, THREADS, &[id.to_owned()])
        .await?;
    Ok(!owners.is_empty())
}

/// Undoes an overtaken write with one request; answers the rows it could not undo.
async fn undo_with(
    upstream: &Upstream<'_>,
    method: Method,
    path: String,
    body: Bytes,
    rows: Vec<ItemRecord>,
) -> Vec<ItemRecord> {
    let undone = upstream.send(method, &path, body).await;
    if undone.is_ok_and(|a| a.is_success()) {
        Vec::new()
    } else {
        rows
    }
}

async fn search_threads(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
    body: Bytes,
) -> Answered {
    let narrowed = adapter::narrow_thread_search(&body, ctx.tenant(), ctx.subject.as_deref())?;
    let body = Bytes::from(Value::Object(narrowed).to_string());
    let answer = upstream.send(Method::POST, path, body).await?;
    if !answer.is_success() {
        return Ok(answer.passed_on());
    }
    let kept = readable_threads(upstream, ctx, json_of(&answer.body)?).await?;
    Ok(json_response(answer.status, &kept))
}

/// The threads of a search answer the caller may read.
async fn readable_threads(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    threads: Value,
) -> Result<Value, DataError> {
    let state = upstream.state;
    let ids = adapter::thread_ids(&threads)?;
    let stamps = state
        .store
        .item_stamps(&upstream.route.name, THREADS, &ids)
        .await?;
    let subjects: Vec<&str> = stamps.values().map(|s| s.subject.as_str()).collect();
    let view = state.policy.view(ctx.tenant(), subjects).await?;
    Ok(adapter::filter_threads(
        threads,
        &stamps,
        &view,
        &ctx.read_context(),
        crate::now(),
    )?)
}

/// `POST /threads/count` becomes narrowed searches whose readable threads are counted, so a
/// count never reveals hidden threads.
async fn count_threads(upstream: &Upstream<'_>, ctx: &RequestContext, body: Bytes) -> Answered {
    let mut search = adapter::narrow_thread_search(&body, ctx.tenant(), ctx.subject.as_deref())?;
    search.insert("select".into(), json!(["thread_id"]));
    search.insert("limit".into(), json!(COUNT_PAGE));
    let mut counted = 0;
    for page in 0..COUNT_PAGES {
        search.insert("offset".into(), json!(page * COUNT_PAGE));
        let body = Bytes::from(Value::Object(search.clone()).to_string());
        let answer = upstream.send(Method::POST, "/threads/search", body).await?;
        if !answer.is_success() {
            return Ok(answer.passed_on());
        }
        let threads = json_of(&answer.body)?;
        let full = threads.as_array().is_some_and(|a| a.len() == COUNT_PAGE);
        let kept = readable_threads(upstream, ctx, threads).await?;
        counted += kept.as_array().map_or(0, Vec::len);
        if !full {
            return Ok(json_response(StatusCode::OK, &json!(counted)));
        }
    }
    Err(DataError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        Code::TooManyThreads,
        "more threads than Lethe counts in one request; narrow the metadata filter",
    ))
}

/// A thread is deleted only by a caller whose scope covers its registered owner.
async fn delete_thread(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
    thread: &str,
) -> Answered {
    let Upstream { state, route, .. } = *upstream;
    let stamp = registered(upstream, thread)
        .await?
        .ok_or(Refusal::UnstampedItem)?;
    if stamp.tenant != ctx.tenant() || ctx.subject.as_ref().is_some_and(|s| *s != stamp.subject) {
        return Err(Refusal::ScopeViolation.into());
    }
    let answer = upstream.send(Method::DELETE, path, Bytes::new()).await?;
    // 404: the server has lost it already; either way it is gone.
    if answer.is_success() || answer.status == StatusCode::NOT_FOUND {
        state
            .store
            .mark_items_deleted(&route.name, THREADS, &[thread.to_owned()], crate::now())
            .await?;
    }
    Ok(answer.passed_on())
}

async fn put_item(
    ns: &Namespace,
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
    body: Bytes,
) -> Answered {
    let Upstream { state, route, .. } = *upstream;
    let mut planned = adapter::plan_put(&body, &ctx.scope(), ns)?;
    let id = planned.id.clone().unwrap_or_default();
    let text = planned.text("value");
    let writes = [Writing {
        collection: STORE,
        id: &id,
        owner: &planned.subject,
        text: &text,
    }];
    let derivations = state.derivation.parents(ctx, &writes).await?;
    planned.layer = derivations.layer(0);
    // The owners of what the write derives from decide it too.
    let owners: Vec<&str> = std::iter::once(planned.subject.as_str())
        .chain(derivations.owners())
        .collect();
    let view = state.policy.view(ctx.tenant(), owners).await?;
    adapter::check_item(&planned, ctx.tenant(), &view, crate::now())?;
    derivations.check(&view, ctx.tenant())?;
    let (namespace, key) = adapter::parse_item_id(&id).unwrap_or_default();
    // The stamp the server holds for the item decides, not lineage.
    let query = adapter::item_query(&namespace, &key, None);
    let found = upstream
        .send_query(Method::GET, path, Some(&query), Bytes::new())
        .await?;
    let held = match found.status {
        StatusCode::NOT_FOUND => None,
        _ if found.is_success() => adapter::held_item(&json_of(&found.body)?)?,
        _ => return Ok(found.passed_on()),
    };
    let now = crate::now();
    let rewritten = match &held {
        Some(Some(stamp)) if stamp.layer == Layer::Derived => vec![id.clone()],
        _ => Vec::new(),
    };
    let held = Held::of(held.as_ref().map(Option::as_ref));
    let (body, stamp) = adapter::stamp_item(planned, "value", ctx.tenant(), &view, held, now)?;
    let written = [id.clone()];
    state.derivation.record(ctx, &derivations, &written).await?;
    let answer = upstream.send(Method::PUT, path, Bytes::from(body)).await?;
    if !answer.is_success() {
        return Ok(answer.passed_on());
    }
    let undo_body = Bytes::from(json!({ "namespace": namespace, "key": key }).to_string());
    let row = ItemRecord::stamped(&route.name, STORE, id, stamp, now, ctx.source.clone());
    let undo = |rows| undo_with(upstream, Method::DELETE, path.to_owned(), undo_body, rows);
    let derived = Some(&derivations);
    keep_unless_overtaken(
        upstream.state,
        ctx.tenant(),
        vec![row],
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

/// Remembers the store items an answer serves.
async fn served_items(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    answer: &Value,
) -> Result<(), DataError> {
    let derivation = &upstream.state.derivation;
    if !derivation.enabled() {
        return Ok(());
    }
    let served = adapter::served_items(answer)
        .into_iter()
        .map(|(id, owner, text)| Served {
            collection: STORE.to_owned(),
            id,
            owner,
            text,
            answer: false,
        })
        .collect();
    derivation.served(ctx, served).await
}

/// A read of one subject's namespace: refused outright when the subject is suppressed.
async fn open_namespace(
    ns: &Namespace,
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    namespace: &[String],
) -> Result<crate::data::policy_cache::View, DataError> {
    let subject = ns.subject_of(namespace, &ctx.scope())?;
    let view = upstream
        .state
        .policy
        .view(ctx.tenant(), [subject.as_str()])
        .await?;
    adapter::namespace_open(&view, ctx.tenant(), &subject)?;
    Ok(view)
}

async fn get_item(
    ns: &Namespace,
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
) -> Answered {
    let (namespace, _, query) = adapter::parse_item_query(upstream.parts.uri.query())?;
    let view = open_namespace(ns, upstream, ctx, &namespace).await?;
    let answer = upstream
        .send_query(Method::GET, path, Some(&query), Bytes::new())
        .await?;
    if !answer.is_success() {
        return Ok(answer.passed_on());
    }
    let item = adapter::filter_item(
        json_of(&answer.body)?,
        &view,
        &ctx.read_context(),
        crate::now(),
    );
    served_items(upstream, ctx, &item).await?;
    Ok(json_response(answer.status, &item))
}

async fn search_items(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
    body: Bytes,
) -> Answered {
    let now = crate::now();
    let body = adapter::narrow_item_search(&body, ctx.tenant(), ctx.subject.as_deref())?;
    let answer = upstream.send(Method::POST, path, Bytes::from(body)).await?;
    if !answer.is_success() {
        return Ok(answer.passed_on());
    }
    let items = json_of(&answer.body)?;
    let subjects = adapter::item_subjects(&items);
    let subjects: Vec<&str> = subjects.iter().map(String::as_str).collect();
    let view = upstream.state.policy.view(ctx.tenant(), subjects).await?;
    let kept = adapter::filter_items(items, &view, &ctx.read_context(), now)?;
    served_items(upstream, ctx, &kept).await?;
    Ok(json_response(answer.status, &kept))
}

/// Removing data is allowed even for a suppressed subject; the scope must still cover it.
async fn delete_item(
    ns: &Namespace,
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
    body: Bytes,
) -> Answered {
    let Upstream { state, route, .. } = *upstream;
    let (namespace, key) = adapter::parse_item_delete(&body)?;
    ns.subject_of(&namespace, &ctx.scope())?;
    let answer = upstream.send(Method::DELETE, path, body).await?;
    if answer.is_success() {
        let id = adapter::item_id(&namespace, &key);
        state
            .store
            .mark_items_deleted(&route.name, STORE, &[id], crate::now())
            .await?;
    }
    Ok(answer.passed_on())
}

async fn list_namespaces(
    ns: &Namespace,
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
    body: Bytes,
) -> Answered {
    let answer = upstream.send(Method::POST, path, body).await?;
    if !answer.is_success() {
        return Ok(answer.passed_on());
    }
    let placed = adapter::namespaces_of(&json_of(&answer.body)?, ns, ctx.tenant())?;
    let subjects: Vec<&str> = placed
        .iter()
        .filter_map(|(_, p)| match p {
            adapter::Placement::Subject(s) => Some(s.as_str()),
            _ => None,
        })
        .collect();
    let view = upstream.state.policy.view(ctx.tenant(), subjects).await?;
    let kept = adapter::filter_namespaces(placed, ctx.subject.as_deref(), |s| {
        adapter::namespace_open(&view, ctx.tenant(), s).is_ok()
    });
    Ok(json_response(answer.status, &kept))
}
