//! The OpenAI-compatible provider route: the I/O around the pure adapter in
//! `crate::openai::adapter`.
//!
//! Objects the provider keeps (responses, conversations and their items, files, stored chat
//! completions) are recorded before the client learns their id, so the next request naming one is
//! decided on the record; embeddings inputs are recorded by fingerprint.

use crate::error_shape::Code;
use bytes::Bytes;
use hyper::header;
use hyper::{Method, Response, StatusCode};
use lethe_policy::{Action, ProviderGrant, Refusal, SubjectState, decide_provider};
use serde_json::Value;

use crate::data::derivation::Derivation;
use crate::data::derivation::{ANSWERS, Derivations, Writing};
use crate::data::error::{DataError, json_response};
use crate::data::forward::Answer;
use crate::data::overtaken::{Recording, keep_unless_overtaken};
use crate::data::records::AdapterError;
use crate::data::stream::{
    Derive, Opened, Registration, Settled, Tap, Undo, Watch, open_events, settle,
};
use crate::data::{Body, RequestContext, Upstream, whole};
use crate::openai::adapter::{
    self as adapter, Access, CHAT, CONVERSATIONS, EMBEDDED, Endpoint, FILES, Generate, ITEMS,
    RESPONSES,
};
use crate::state::{ItemKey, ItemRecord, ProcessorUse};
use std::pin::Pin;
use std::sync::Arc;

mod generate;

use generate::generate;

type Answered = Result<Response<Body>, DataError>;

/// Who the request is about and why: a provider request always names all three.
struct About<'a> {
    ctx: &'a RequestContext,
    /// How long the provider keeps copies of what it is sent: recorded objects' deadline.
    window: chrono::TimeDelta,
    subject: &'a str,
    purpose: &'a str,
    category: &'a str,
}

impl About<'_> {
    fn tenant(&self) -> &str {
        self.ctx.tenant()
    }
}

fn missing(what: &'static str, header: &'static str) -> DataError {
    AdapterError::MissingScope {
        index: 0,
        what,
        header,
    }
    .into()
}

pub(crate) async fn handle(
    window: chrono::TimeDelta,
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
    body: Bytes,
) -> Answered {
    let endpoint = adapter::classify(&upstream.parts.method, path);
    match endpoint {
        Endpoint::Refused => return Err(DataError::unknown_endpoint()),
        Endpoint::Models => return Ok(whole(checked(upstream, path, body).await?.passed_on())),
        _ => {}
    }
    let about = About {
        ctx,
        window,
        subject: ctx
            .subject
            .as_deref()
            .ok_or_else(|| missing("subject", "Subject"))?,
        purpose: ctx
            .purpose
            .as_deref()
            .ok_or_else(|| missing("purpose", "Purpose"))?,
        category: ctx
            .category
            .as_deref()
            .ok_or_else(|| missing("category", "Category"))?,
    };
    match endpoint {
        Endpoint::Generate(kind) => generate(upstream, &about, kind, path, body).await,
        Endpoint::CreateConversation => {
            let grant = grant(upstream, &about).await?;
            if !grant.retention {
                return Err(Refusal::ConsentRequired.into());
            }
            let sent = prompt_parents(upstream, &about, &sent_text(&body)).await?;
            create(upstream, &about, &grant, (path, body), CONVERSATIONS, sent).await
        }
        Endpoint::UploadFile => {
            let grant = grant(upstream, &about).await?;
            let content_type = upstream
                .parts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let purposes = adapter::multipart_fields(content_type, &body, "purpose");
            adapter::decide_upload(&purposes, &grant)?;
            let request = (path, body);
            create(
                upstream,
                &about,
                &grant,
                request,
                FILES,
                Derivations::default(),
            )
            .await
        }
        Endpoint::ListFiles => {
            if !subject_state(upstream, &about).await?.is_active() {
                return Err(Refusal::SubjectSuppressed.into());
            }
            let answer = checked(upstream, path, body).await?;
            if !answer.is_success() {
                return Ok(whole(answer.passed_on()));
            }
            let listed = json_of(&answer)?;
            let ids = adapter::listed_ids(&listed)?;
            let mine = upstream
                .state
                .store
                .item_stamps(&upstream.route.name, FILES, &ids)
                .await?;
            let kept = adapter::filter_list(listed, |id| {
                mine.get(id).is_some_and(|s| {
                    s.tenant == about.tenant()
                        && s.subject == about.subject
                        && s.purpose == about.purpose
                })
            })?;
            Ok(whole(json_response(answer.status, &kept)))
        }
        Endpoint::Object {
            collection,
            id,
            item,
            access,
        } => object(upstream, &about, path, body, collection, &id, item, access).await,
        Endpoint::Refused | Endpoint::Models => Err(DataError::unknown_endpoint()),
    }
}

/// The subject may send this purpose and category to the provider.
async fn grant(upstream: &Upstream<'_>, about: &About<'_>) -> Result<ProviderGrant, DataError> {
    let view = upstream
        .state
        .policy
        .view(about.tenant(), [about.subject])
        .await?;
    Ok(decide_provider(
        &view,
        about.tenant(),
        about.subject,
        about.purpose,
        about.category,
        crate::now(),
    )?)
}

/// Records that the provider receives the subject's data, and the data of every subject the
/// request quotes or read under its trace: called once every decision is taken, just before the
/// data leaves.
async fn sending(upstream: &Upstream<'_>, about: &About<'_>, derived: &Derivations) {
    let now = crate::now();
    let mut subjects: Vec<&str> = std::iter::once(about.subject)
        .chain(derived.owners())
        .collect();
    subjects.sort_unstable();
    subjects.dedup();
    for subject in subjects {
        upstream
            .state
            .lineage
            .processor_used(ProcessorUse {
                tenant: about.tenant().to_owned(),
                subject: subject.to_owned(),
                processor: upstream.route.name.clone(),
                first_at: now,
                last_at: now,
            })
            .await;
    }
}

/// Sends a decided request that makes one object the provider keeps (a conversation, a file),
/// and keeps it for the subject.
async fn create(
    upstream: &Upstream<'_>,
    about: &About<'_>,
    grant: &ProviderGrant,
    (path, body): (&str, Bytes),
    collection: &str,
    sent: Derivations,
) -> Answered {
    sending(upstream, about, &sent).await;
    let answer = checked(upstream, path, body).await?;
    if answer.is_success() {
        let id = adapter::answered_id(&json_of(&answer)?)?;
        keep_sent(upstream, about, grant, collection, vec![id], &sent).await?;
    }
    Ok(whole(answer.passed_on()))
}

/// The text of a JSON request body (what a conversation or its new items say).
fn sent_text(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body)
        .map(|v| crate::kit::text::text_of(&v))
        .unwrap_or_default()
}

/// Sends the request and reads the whole answer; a provider failure (5xx) is
/// `upstream_unavailable`, never passed on as if it were an answer.
async fn checked(upstream: &Upstream<'_>, path: &str, body: Bytes) -> Result<Answer, DataError> {
    let answer = upstream
        .send(upstream.parts.method.clone(), path, body)
        .await?;
    provider_failure(answer.status)?;
    Ok(answer)
}

fn provider_failure(status: StatusCode) -> Result<(), DataError> {
    if status.is_server_error() {
        Err(DataError::upstream_unavailable(format!(
            "the provider answered {status}"
        )))
    } else {
        Ok(())
    }
}

fn json_of(answer: &Answer) -> Result<Value, DataError> {
    serde_json::from_slice(&answer.body)
        .map_err(|_| AdapterError::UpstreamInvalid("not JSON".into()).into())
}

/// The lineage row of something the provider keeps for the subject: until the provider's
/// retention window ends.
fn row(
    upstream: &Upstream<'_>,
    about: &About<'_>,
    grant: &ProviderGrant,
    collection: &str,
    id: String,
) -> ItemRecord {
    let now = crate::now();
    let stamp = adapter::provider_stamp(
        about.tenant(),
        about.subject,
        about.purpose,
        about.category,
        grant,
        now + about.window,
    );
    let source = about.ctx.source.clone();
    ItemRecord::stamped(&upstream.route.name, collection, id, stamp, now, source)
}

/// Records objects the provider made for the subject, before the client learns their ids (with
/// the edges of what they derive from, `derived`, first); if a flip of the subject or of a
/// parent's committed while the provider was answering, deletes them there again and refuses,
/// so that nothing is left behind the purge. One that cannot be deleted stays recorded for it.
async fn keep(
    upstream: &Upstream<'_>,
    about: &About<'_>,
    grant: &ProviderGrant,
    collection: &str,
    ids: Vec<String>,
    derived: Option<&Derivations>,
) -> Result<(), DataError> {
    if let Some(derived) = derived {
        upstream
            .state
            .derivation
            .record_added(about.ctx, derived)
            .await?;
    }
    let rows: Vec<ItemRecord> = ids
        .into_iter()
        .map(|id| row(upstream, about, grant, collection, id))
        .collect();
    let undo = |overtaken: Vec<ItemRecord>| async move {
        let mut left = Vec::new();
        for row in overtaken {
            if !deleted_at_provider(upstream, collection, &row.item_id).await {
                left.push(row);
            }
        }
        left
    };
    keep_unless_overtaken(
        upstream.state,
        about.tenant(),
        rows,
        Recording::First,
        derived,
        undo,
    )
    .await
}

/// Deletes an object at the provider; whether it is gone (an id no object path can name is
/// left alone, as none was made under it).
async fn deleted_at_provider(upstream: &Upstream<'_>, collection: &str, id: &str) -> bool {
    let Some(path) = adapter::object_path(collection, id) else {
        return true;
    };
    let answer = upstream.send(Method::DELETE, &path, Bytes::new()).await;
    answer.is_ok_and(|a| a.is_success() || a.status == StatusCode::NOT_FOUND)
}

/// An object kept for an answer refused when it was sent: deleted at the provider again, its
/// lineage marked deleted once it is gone (until then the purge and the sweeper find it).
async fn unkept(upstream: &Upstream<'_>, collection: &str, id: &str) -> Result<(), DataError> {
    if deleted_at_provider(upstream, collection, id).await {
        let store = &upstream.state.store;
        let ids = [id.to_owned()];
        store
            .mark_items_deleted(&upstream.route.name, collection, &ids, crate::now())
            .await?;
    }
    Ok(())
}

/// What each of the objects `ids` (of `collection`) the provider made derives from: what the
/// request that made them did (`sent`).
fn made_of(
    upstream: &Upstream<'_>,
    collection: &str,
    ids: &[String],
    sent: &Derivations,
) -> Derivations {
    ids.iter().fold(Derivations::default(), |made, id| {
        made.and(sent.for_item(&ItemKey::new(&upstream.route.name, collection, id)))
    })
}

/// [`keep`]s objects the provider made of what the client sent (a conversation, its new items,
/// a file): each derives from what that did (its trace read, its text quotes), and its text is
/// remembered as theirs for what quotes it later.
async fn keep_sent(
    upstream: &Upstream<'_>,
    about: &About<'_>,
    grant: &ProviderGrant,
    collection: &str,
    ids: Vec<String>,
    sent: &Derivations,
) -> Result<(), DataError> {
    let made = made_of(upstream, collection, &ids, sent);
    keep(upstream, about, grant, collection, ids.clone(), Some(&made)).await?;
    let derivation = &upstream.state.derivation;
    derivation.accepted(about.ctx, made, &ids, &[]).await
}

/// An object the request names must be recorded as the caller's subject's.
async fn decide_named(
    upstream: &Upstream<'_>,
    about: &About<'_>,
    collection: &str,
    id: &str,
    access: Access,
) -> Result<(), DataError> {
    let registered = upstream
        .state
        .store
        .item_stamps(&upstream.route.name, collection, &[id.to_owned()])
        .await?
        .remove(id);
    adapter::decide_object(
        registered.as_ref(),
        about.tenant(),
        about.subject,
        about.purpose,
        access,
        subject_state(upstream, about).await?,
    )?;
    // An answer an erasure's closure hides is not read or built on (deleting it is allowed).
    let item = lethe_policy::ItemRef {
        store: &upstream.route.name,
        collection,
        id,
    };
    let hidden = upstream.state.policy.hidden(about.tenant()).await?;
    if access != Access::Delete && hidden.contains(&item) {
        return Err(Refusal::SubjectSuppressed.into());
    }
    Ok(())
}

/// The subject's state now (a subject Lethe never heard of is active in epoch 0).
async fn subject_state(
    upstream: &Upstream<'_>,
    about: &About<'_>,
) -> Result<SubjectState, DataError> {
    let policy = upstream
        .state
        .policy
        .subject(about.tenant(), about.subject)
        .await?;
    Ok(policy.state)
}

/// What a prompt derives from (what its trace read, what it quotes), refused when that is
/// under erasure: the model's answer would bring it back.
async fn prompt_parents(
    upstream: &Upstream<'_>,
    about: &About<'_>,
    prompt: &str,
) -> Result<Derivations, DataError> {
    let state = upstream.state;
    // The answer's id is the provider's to give: the prompt is a record without one yet.
    let writes = [Writing {
        collection: ANSWERS,
        id: "",
        owner: about.subject,
        text: prompt,
    }];
    let derivations = state.derivation.parents(about.ctx, &writes).await?;
    let owners: Vec<&str> = derivations.owners().collect();
    if !owners.is_empty() {
        let view = state.policy.view(about.tenant(), owners).await?;
        derivations.check(&view, about.tenant())?;
    }
    Ok(derivations)
}

#[allow(clippy::too_many_arguments)]
async fn object(
    upstream: &Upstream<'_>,
    about: &About<'_>,
    path: &str,
    body: Bytes,
    collection: &'static str,
    id: &str,
    item: Option<String>,
    access: Access,
) -> Answered {
    decide_named(upstream, about, collection, id, access).await?;
    // A conversation's items an erasure's closure hides are not read: one asked for is
    // refused, a list leaves them out.
    let reads_items = access == Access::Read && collection == CONVERSATIONS;
    let hidden = match reads_items {
        true => Some(upstream.state.policy.hidden(about.tenant()).await?),
        false => None,
    };
    let shown = |item: &str| {
        hidden.as_ref().is_none_or(|hidden| {
            !hidden.contains(&lethe_policy::ItemRef {
                store: &upstream.route.name,
                collection: ITEMS,
                id: &adapter::item_key(id, item),
            })
        })
    };
    if item.as_deref().is_some_and(|i| !shown(i)) {
        return Err(Refusal::SubjectSuppressed.into());
    }
    // Adding to a conversation sends new data to the provider.
    let grant = match access {
        Access::Write => {
            let grant = grant(upstream, about).await?;
            let sent = prompt_parents(upstream, about, &sent_text(&body)).await?;
            sending(upstream, about, &sent).await;
            Some((grant, sent))
        }
        Access::Read | Access::Delete => None,
    };
    let answer = checked(upstream, path, body).await?;
    if reads_items && answer.is_success() {
        let value = json_of(&answer)?;
        if item.is_none() && value.get("data").is_some() {
            let listed = adapter::filter_list(value, shown)?;
            return Ok(whole(json_response(answer.status, &listed)));
        }
    }
    let gone = answer.is_success() || answer.status == StatusCode::NOT_FOUND;
    match (access, &grant) {
        (Access::Delete, _) if gone => {
            let (lineage_collection, lineage_id) = match &item {
                Some(item) => (ITEMS, adapter::item_key(id, item)),
                None => (collection, id.to_owned()),
            };
            upstream
                .state
                .store
                .mark_items_deleted(
                    &upstream.route.name,
                    lineage_collection,
                    &[lineage_id],
                    crate::now(),
                )
                .await?;
        }
        (Access::Write, Some((grant, sent)))
            if answer.is_success() && collection == CONVERSATIONS =>
        {
            let value = json_of(&answer)?;
            // `POST .../items` answers the created items; a metadata update answers the conversation.
            if value.get("data").is_some() {
                let items = adapter::listed_ids(&value)?
                    .into_iter()
                    .map(|item| adapter::item_key(id, &item))
                    .collect();
                keep_sent(upstream, about, grant, ITEMS, items, sent).await?;
            }
        }
        _ => {}
    }
    Ok(whole(answer.passed_on()))
}
