//! Generations (chat completions, responses, embeddings): decided before they are sent, their
//! answers decided again when the provider gives them, whole or as a stream, and what the
//! provider stored for them recorded with what they derive from.

use super::*;

pub(super) async fn generate(
    upstream: &Upstream<'_>,
    about: &About<'_>,
    kind: Generate,
    path: &str,
    body: Bytes,
) -> Answered {
    let grant = grant(upstream, about).await?;
    let mut planned = adapter::plan(kind, &body, &grant)?;
    builds_on(upstream, about, &planned.builds_on).await?;
    let derivations = prompt_parents(upstream, about, &planned.prompt).await?;
    // Taken: the rest of the plan decides the answer.
    let body = Bytes::from(std::mem::take(&mut planned.body));
    let collection = collection_of(kind);
    sending(upstream, about, &derivations).await;
    if planned.stream {
        let registration = planned
            .stored
            .then(|| registration(upstream, about, &grant, collection, &derivations));
        let streaming = Streaming {
            kept_in: if planned.stored { collection } else { ANSWERS },
            registration,
            derivations,
        };
        return stream(upstream, about, &grant, path, body, streaming).await;
    }
    let answer = checked(upstream, path, body).await?;
    if !answer.is_success() {
        return Ok(whole(answer.passed_on()));
    }
    answer_whole(upstream, about, &grant, kind, planned, answer, derivations).await
}

/// Where the provider keeps what a generation of `kind` stores.
fn collection_of(kind: Generate) -> &'static str {
    match kind {
        Generate::Chat => CHAT,
        _ => RESPONSES,
    }
}

/// Every object the request builds on (a previous response, a conversation) the caller may
/// write to, and none of a conversation's items hidden by an erasure's closure: the provider
/// reads them itself, and they would come back in the answer.
async fn builds_on(
    upstream: &Upstream<'_>,
    about: &About<'_>,
    objects: &[(&'static str, String)],
) -> Result<(), DataError> {
    for (collection, id) in objects {
        decide_named(upstream, about, collection, id, Access::Write).await?;
    }
    let conversations: Vec<&String> = objects
        .iter()
        .filter(|(c, _)| *c == CONVERSATIONS)
        .map(|(_, id)| id)
        .collect();
    if !conversations.is_empty() {
        let hidden = upstream.state.policy.hidden(about.tenant()).await?;
        for id in conversations {
            let items = adapter::item_key(id, "");
            if hidden.holds_under(&upstream.route.name, ITEMS, &items) {
                return Err(Refusal::DerivedFromErased.into());
            }
        }
    }
    Ok(())
}

/// How a stored streamed object is registered once the stream names its id, and undone at
/// the provider when the stream is refused.
fn registration(
    upstream: &Upstream<'_>,
    about: &About<'_>,
    grant: &ProviderGrant,
    collection: &'static str,
    derivations: &Derivations,
) -> Registration {
    let (upstreams, route) = (upstream.state.upstreams.clone(), upstream.route.clone());
    let undo: Undo = Box::new(move |id| {
        Box::pin(async move {
            let Some(path) = adapter::object_path(collection, &id) else {
                return false;
            };
            let headers = hyper::HeaderMap::new();
            let answer = upstreams
                .send(&route, Method::DELETE, &path, None, &headers, Bytes::new())
                .await;
            answer.is_ok_and(|a| a.is_success() || a.status == StatusCode::NOT_FOUND)
        })
    });
    let (derivation, ctx) = (Arc::clone(&upstream.state.derivation), about.ctx.clone());
    let prompt = derivations.clone();
    let derive: Derive = Box::new(move |id| {
        Box::pin(async move {
            let made = prompt.for_item(&ItemKey::new(&ctx.store, collection, &id));
            derivation.record_added(&ctx, &made).await.is_ok()
        })
    });
    Registration {
        row: row(upstream, about, grant, collection, String::new()),
        undo,
        derive,
        find_id: adapter::streamed_object_id,
    }
}

/// A whole answer: decided when the provider gives it, as a stream's events are (the provider
/// may work for seconds); what it stored is kept with its lineage, or deleted there again.
async fn answer_whole(
    upstream: &Upstream<'_>,
    about: &About<'_>,
    grant: &ProviderGrant,
    kind: Generate,
    planned: adapter::Planned,
    answer: Answer,
    derivations: Derivations,
) -> Answered {
    let collection = collection_of(kind);
    let decided = Watch::new(upstream.state, about.ctx, about.subject, grant.epoch)
        .requiring(about.purpose, about.category, Action::SendToProvider)
        .deriving_from(derivations.owners())
        .still_holds()
        .await;
    match kind {
        Generate::Embeddings => {
            decided?;
            let rows = planned
                .fingerprints
                .into_iter()
                .map(|f| row(upstream, about, grant, EMBEDDED, f))
                .collect();
            upstream.state.lineage.record(rows).await;
        }
        Generate::Responses | Generate::Chat => {
            let value = json_of(&answer)?;
            let stored =
                planned.stored && (kind == Generate::Chat || adapter::answer_stored(&value));
            if stored {
                let id = adapter::answered_id(&value)?;
                let made = made_of(
                    upstream,
                    collection,
                    std::slice::from_ref(&id),
                    &derivations,
                );
                keep(
                    upstream,
                    about,
                    grant,
                    collection,
                    vec![id.clone()],
                    Some(&made),
                )
                .await?;
                if decided.is_err() {
                    unkept(upstream, collection, &id).await?;
                }
            }
            decided?;
            let kept_in = if stored { collection } else { ANSWERS };
            answered(upstream, about, kept_in, &value, &derivations, stored).await?;
        }
    }
    Ok(whole(answer.passed_on()))
}

/// A model's answer, answered whole, derives from what its prompt did: its edges are recorded
/// (a `stored` object's were, as it was kept) and its text is remembered.
async fn answered(
    upstream: &Upstream<'_>,
    about: &About<'_>,
    collection: &str,
    answer: &Value,
    derivations: &Derivations,
    stored: bool,
) -> Result<(), DataError> {
    let id = adapter::answered_id(answer)?;
    let text = adapter::answer_text(answer);
    let derivation = &upstream.state.derivation;
    if stored {
        derivation
            .remember_answer(about.ctx, collection, &id, text, derivations)
            .await
    } else {
        derivation
            .answered(about.ctx, collection, &id, text, derivations)
            .await
    }
}

/// A streamed answer's text and id, gathered from its events as they pass; once the stream has
/// ended whole, it derives from what its prompt did.
struct AnswerTap {
    derivation: Arc<Derivation>,
    ctx: RequestContext,
    /// Where the answer is kept: a stored object's collection, else the answers' own.
    collection: &'static str,
    /// A stored object's edges are recorded with its registration.
    stored: bool,
    derivations: Derivations,
    answer: adapter::StreamedAnswer,
}

impl Tap for AnswerTap {
    fn events(&mut self, events: &[u8]) {
        self.answer.read(events);
    }

    fn finished(self: Box<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(async move {
            let Some(id) = self.answer.id.clone() else {
                return;
            };
            let (text, derivation) = (self.answer.text, &self.derivation);
            let (ctx, collection, derivations) = (&self.ctx, self.collection, &self.derivations);
            let recorded = if self.stored {
                derivation
                    .remember_answer(ctx, collection, &id, text, derivations)
                    .await
            } else {
                derivation
                    .answered(ctx, collection, &id, text, derivations)
                    .await
            };
            if recorded.is_err() {
                tracing::warn!("a streamed answer's lineage could not be recorded");
            }
        })
    }
}

/// A streamed answer: decided already; relayed event by event while the subject stays active.
/// What a streamed answer makes: the object the provider keeps (if it keeps it), where the
/// answer is kept, and what it derives from.
struct Streaming {
    registration: Option<Registration>,
    kept_in: &'static str,
    derivations: Derivations,
}

async fn stream(
    upstream: &Upstream<'_>,
    about: &About<'_>,
    grant: &ProviderGrant,
    path: &str,
    body: Bytes,
    streaming: Streaming,
) -> Answered {
    let Streaming {
        registration,
        kept_in,
        derivations,
    } = streaming;
    let watch = Watch::new(upstream.state, about.ctx, about.subject, grant.epoch)
        .requiring(about.purpose, about.category, Action::SendToProvider)
        .deriving_from(derivations.owners());
    let answer = match open_events(upstream, path, body).await? {
        Opened::Events(events) => {
            let derivation = &upstream.state.derivation;
            let tap = derivation.enabled().then(|| {
                Box::new(AnswerTap {
                    derivation: Arc::clone(derivation),
                    ctx: about.ctx.clone(),
                    collection: kept_in,
                    stored: registration.is_some(),
                    derivations,
                    answer: adapter::StreamedAnswer::default(),
                }) as Box<dyn Tap>
            });
            return Ok(events.relay(watch, registration, tap));
        }
        Opened::Whole(answer) => answer,
    };
    provider_failure(answer.status)?;
    if !answer.is_success() {
        return Ok(whole(answer.passed_on()));
    }
    let value = json_of(&answer)?;
    let decided = watch.still_holds().await;
    // A stored object answered whole is recorded like a streamed one, and deleted again when
    // the answer is refused now.
    let stored = registration.is_some();
    if let Some(registration) = registration {
        let id = adapter::answered_id(&value)?;
        match settle(&watch, registration, id, decided.is_err()).await {
            Settled::Kept => {}
            Settled::Undone => {
                return Err(decided.err().unwrap_or(Refusal::SubjectSuppressed.into()));
            }
            Settled::Unrecorded => {
                return Err(DataError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    Code::StateUnavailable,
                    "the stored object could not be recorded",
                ));
            }
        }
    }
    decided?;
    answered(upstream, about, kept_in, &value, &derivations, stored).await?;
    Ok(whole(answer.passed_on()))
}
