//! Server-sent events relayed event by event (provider completions and responses, LangGraph
//! runs). The request was decided before the first byte; while
//! the stream runs, a relay task forwards each complete, well-formed event and stops when:
//! - the client goes away (the upstream request is dropped with it, so the provider stops);
//! - the subject is suppressed (or its epoch moves on): the stream ends with an `error` event
//!   `subject_suppressed`, as nothing more may be sent to or from the provider about it
//!   (looked up afresh for the first event, then whenever the state store reports a change);
//! - the subject's consent the request was decided on is withdrawn or expires (a provider's
//!   `send_to_provider`): an `error` event `consent_required` ends it;
//! - the caller's token has expired or been revoked since the request (checked before each
//!   event): an `error` event `unauthenticated` (`state_unavailable` when the revocations
//!   cannot be read) ends it;
//! - the upstream sends something that is not well-formed SSE, or fails: an `error` event
//!   `upstream_invalid` or `upstream_unavailable` ends it.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};
use lethe_policy::consent::coverage_end;
use lethe_policy::{Action, Refusal};
use tokio::sync::mpsc;

use super::context::RequestContext;
use super::error::DataError;
use super::forward::{Answer, strip_hop_by_hop};
use super::policy_cache::PolicyCache;
use super::tokens::TokenCache;
use super::{DataState, Upstream};
use crate::auth::Claims;
use crate::error_shape::Code;
use crate::revocations::{Refused, Revocations};
use crate::sse::{SseCheck, error_event};
use crate::state::{ItemRecord, Store};

/// A response body fed by the relay task.
pub struct EventStream {
    rx: mpsc::Receiver<Bytes>,
}

impl Body for EventStream {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(Frame::data(c))))
    }
}

/// Whose stream it is and who asked for it: the relay stops it when this subject stops being
/// active in this epoch, or the caller's token expires or is revoked.
pub struct Watch {
    pub policy: Arc<PolicyCache>,
    pub store: Arc<dyn Store>,
    pub tenant: String,
    pub subject: String,
    pub epoch: i64,
    claims: Arc<Claims>,
    revocations: Arc<Revocations>,
    /// The consent the request was decided on: (purpose, category, action).
    consent: Option<(String, String, Action)>,
    /// The other subjects what is streamed derives from (a prompt's parents' owners).
    derived_from: Vec<String>,
}

impl Watch {
    pub fn new(state: &DataState, ctx: &RequestContext, subject: &str, epoch: i64) -> Watch {
        Watch {
            policy: Arc::clone(&state.policy),
            store: Arc::clone(&state.store),
            tenant: ctx.tenant().to_owned(),
            subject: subject.to_owned(),
            epoch,
            claims: Arc::clone(&ctx.claims),
            revocations: Arc::clone(&state.revocations),
            consent: None,
            derived_from: Vec::new(),
        }
    }

    /// The event that ends the stream when the caller's token no longer holds (expired,
    /// revoked, or its revocation unknowable): the refusal both planes give from the
    /// revocation's answer on.
    async fn caller_gone(&self) -> Option<Bytes> {
        let (code, message) = self.caller_refusal().await?;
        Some(Bytes::from(error_event(
            code.as_str(),
            &format!("{message}; the stream was stopped"),
        )))
    }

    /// Why the caller's token no longer holds, if it does not.
    async fn caller_refusal(&self) -> Option<(Code, &'static str)> {
        if TokenCache::expired(&self.claims) {
            return Some((Code::Unauthenticated, "the token has expired"));
        }
        match self.revocations.check(&self.claims).await {
            Ok(()) => None,
            Err(Refused::Revoked) => Some((Code::Unauthenticated, "the token was revoked")),
            Err(_) => Some((
                Code::StateUnavailable,
                "whether the token was revoked cannot be known",
            )),
        }
    }

    /// Decides an answer sent whole as the relay decides each event, when it is sent: refused
    /// when the caller's token no longer holds, the subject stopped being active in this epoch,
    /// or the consent the request was decided on no longer holds (an upstream may work for
    /// seconds).
    pub async fn still_holds(&self) -> Result<(), DataError> {
        if let Some((code, message)) = self.caller_refusal().await {
            let status = match code {
                Code::Unauthenticated => StatusCode::UNAUTHORIZED,
                _ => StatusCode::SERVICE_UNAVAILABLE,
            };
            return Err(DataError::new(status, code, message));
        }
        // `seen` that matches no feed position: the subject is looked up afresh.
        let mut seen = u64::MAX;
        match self.standing(&mut seen).await.ending() {
            None => Ok(()),
            Some((refusal, ..)) => Err(refusal.into()),
        }
    }

    /// The stream also stops when the subject's consent to `action` for (purpose, category)
    /// no longer holds (withdrawn or expired since the request was decided).
    pub fn requiring(mut self, purpose: &str, category: &str, action: Action) -> Watch {
        self.consent = Some((purpose.to_owned(), category.to_owned(), action));
        self
    }

    /// The stream also stops when a subject what it streams derives from is put under erasure:
    /// the answer would bring her data back.
    pub fn deriving_from<'a>(mut self, owners: impl IntoIterator<Item = &'a str>) -> Watch {
        let others = owners.into_iter().filter(|o| *o != self.subject);
        self.derived_from.extend(others.map(str::to_owned));
        self.derived_from.sort();
        self.derived_from.dedup();
        self
    }

    /// Only when the store reports a change (or cannot report them) is the subject looked up.
    async fn standing(&self, seen: &mut u64) -> Standing {
        let feed = self.store.feed();
        if feed.is_healthy() && feed.seq() == *seen {
            return Standing::Allowed;
        }
        *seen = feed.seq();
        let Ok(policy) = self.policy.subject(&self.tenant, &self.subject).await else {
            return Standing::Suppressed;
        };
        if !policy.state.is_active() || policy.state.epoch != self.epoch {
            return Standing::Suppressed;
        }
        for parent in &self.derived_from {
            match self.policy.subject(&self.tenant, parent).await {
                Ok(policy) if policy.state.is_active() => {}
                Ok(_) => return Standing::DerivedFromErased,
                Err(_) => return Standing::Suppressed,
            }
        }
        match &self.consent {
            Some((purpose, category, action))
                if coverage_end(&policy.grants, purpose, category, *action, crate::now())
                    .is_none() =>
            {
                Standing::Withdrawn
            }
            _ => Standing::Allowed,
        }
    }
}

/// Whether the next event may be sent.
#[derive(PartialEq)]
enum Standing {
    Allowed,
    /// The subject is under erasure (or has a new epoch), or its state cannot be read.
    Suppressed,
    /// The consent the request was decided on no longer holds.
    Withdrawn,
    /// A subject what is streamed derives from is under erasure.
    DerivedFromErased,
}

impl Standing {
    /// When the next event (or an answer sent whole) may not be sent: the refusal, why, and how
    /// a stream ends (what it stored is undone unless only the consent changed).
    fn ending(&self) -> Option<(Refusal, &'static str, Stop)> {
        match self {
            Standing::Allowed => None,
            Standing::Suppressed => Some((
                Refusal::SubjectSuppressed,
                "the subject is under erasure",
                Stop::Suppressed,
            )),
            Standing::Withdrawn => Some((
                Refusal::ConsentRequired,
                "the subject's consent was withdrawn",
                Stop::Done,
            )),
            Standing::DerivedFromErased => Some((
                Refusal::DerivedFromErased,
                "what the stream derives from is under erasure",
                Stop::Suppressed,
            )),
        }
    }
}

/// What an upstream answered to a request for a stream.
pub enum Opened {
    /// Server-sent events, ready to relay.
    Events(Events),
    /// Anything else (an error, a plain answer), read whole.
    Whole(Answer),
}

/// A stream's head and body, not yet relayed.
pub struct Events {
    head: hyper::http::response::Parts,
    body: Incoming,
}

impl Events {
    /// Starts relaying; the response goes to the client at once, its events as they pass (and
    /// through `tap`, if any).
    pub fn relay(
        self,
        watch: Watch,
        registration: Option<Registration>,
        tap: Option<Box<dyn Tap>>,
    ) -> Response<super::Body> {
        let events = relay(self.body, watch, registration, tap);
        Response::from_parts(self.head, http_body_util::Either::Right(events))
    }
}

/// Sends a decided request whose answer may be a stream of events.
pub async fn open_events(
    upstream: &Upstream<'_>,
    path: &str,
    body: Bytes,
) -> Result<Opened, DataError> {
    let Upstream {
        state,
        route,
        parts,
    } = *upstream;
    let response = state
        .upstreams
        .open(
            route,
            parts.method.clone(),
            path,
            parts.uri.query(),
            &parts.headers,
            body,
        )
        .await?;
    let is_events = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let (mut head, body) = response.into_parts();
    if !head.status.is_success() || !is_events {
        let body = Limited::new(body, state.max_body_bytes.saturating_mul(8))
            .collect()
            .await
            .map_err(|_| DataError::upstream_unavailable("the upstream's answer was cut off"))?
            .to_bytes();
        return Ok(Opened::Whole(Answer {
            status: head.status,
            headers: head.headers,
            body,
        }));
    }
    strip_hop_by_hop(&mut head.headers);
    head.headers.remove(header::CONTENT_LENGTH);
    head.headers
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(Opened::Events(Events { head, body }))
}

/// Sees every checked event a relay passes on, and hears when the stream has ended whole (not
/// stopped for a suppression, a malformed event or a client gone away).
pub trait Tap: Send {
    /// Complete, checked events, as they are passed on.
    fn events(&mut self, events: &[u8]);
    fn finished(self: Box<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// Deletes a stored object at the provider again; answers whether it is gone.
pub type Undo = Box<dyn FnOnce(String) -> Pin<Box<dyn Future<Output = bool> + Send>> + Send>;

/// Records what a stored object derives from, given its id; answers whether it could.
pub type Derive = Box<dyn FnOnce(String) -> Pin<Box<dyn Future<Output = bool> + Send>> + Send>;

/// A stored object the stream creates: recorded as the subject's from the stream's first bytes,
/// before the client can read its id, whatever happens to the stream afterwards.
pub struct Registration {
    /// The lineage row; its `item_id` is filled in from the stream.
    pub row: ItemRecord,
    /// Deletes the object again when its subject was suppressed while it was being made.
    pub undo: Undo,
    /// Its edges, recorded before its row (a flip from then on reaches it).
    pub derive: Derive,
    /// Finds the object's id in the stream's first bytes, in the store's format.
    pub find_id: fn(&[u8]) -> Option<String>,
}

/// The id of a stream's object is looked for in at most this many bytes.
const ID_SCAN_BYTES: usize = 256 * 1024;
/// A provider silent for this long ends the stream.
const IDLE: Duration = Duration::from_secs(120);

/// Why the relay stops.
enum Stop {
    /// The stream ended whole.
    Finished,
    /// It was cut short: the client left, or the provider failed.
    Done,
    /// The subject may no longer be served: its object, if any, is deleted again.
    Suppressed,
}

/// Relays `upstream` to the client. The stream is cut as the module says.
fn relay(
    upstream: Incoming,
    watch: Watch,
    registration: Option<Registration>,
    mut tap: Option<Box<dyn Tap>>,
) -> EventStream {
    // One event waits at most: what waits was decided before the client took it, and a slow
    // client would otherwise be handed up to a queue's worth decided before a flip.
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        let mut upstream = upstream;
        let mut pending = registration.map(|r| (r, Vec::new()));
        let stop = forward(&mut upstream, &watch, &tx, &mut pending, &mut tap).await;
        if let (Stop::Finished, Some(tap)) = (&stop, tap) {
            tap.finished().await;
        }
        // A stored object whose id the client never saw must still be recorded (or deleted):
        // the rest of the provider's stream is read, unseen, until the id shows.
        if let Some((registration, mut scanned)) = pending {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            let mut id = (registration.find_id)(&scanned);
            while id.is_none() && scanned.len() < ID_SCAN_BYTES {
                let frame = tokio::time::timeout_at(deadline, upstream.frame()).await;
                let Ok(Some(Ok(frame))) = frame else { break };
                if let Ok(data) = frame.into_data() {
                    scanned.extend_from_slice(&data);
                    id = (registration.find_id)(&scanned);
                }
            }
            if let Some(id) = id {
                let suppressed = matches!(stop, Stop::Suppressed);
                settle(&watch, registration, id, suppressed).await;
            }
        }
    });
    EventStream { rx }
}

/// What became of a streamed object.
pub enum Settled {
    Kept,
    /// Its subject was suppressed while it was being made: deleted again (or left recorded for
    /// the purge when the provider would not delete it).
    Undone,
    /// The state store could not record it.
    Unrecorded,
}

/// Records a streamed object; deletes it again if its subject was suppressed meanwhile.
pub async fn settle(
    watch: &Watch,
    registration: Registration,
    id: String,
    suppressed: bool,
) -> Settled {
    let row = ItemRecord {
        item_id: id.clone(),
        ..registration.row
    };
    let recorded = (registration.derive)(id.clone()).await
        && watch
            .store
            .record_items(std::slice::from_ref(&row))
            .await
            .is_ok();
    // `seen` that matches no feed position: the subject is looked up afresh.
    let mut seen = u64::MAX;
    let standing = watch.standing(&mut seen).await;
    if suppressed || matches!(standing, Standing::Suppressed | Standing::DerivedFromErased) {
        if (registration.undo)(id.clone()).await {
            let _ = watch
                .store
                .mark_items_deleted(&row.store, &row.collection, &[id], crate::now())
                .await;
        }
        return Settled::Undone;
    }
    if recorded {
        Settled::Kept
    } else {
        Settled::Unrecorded
    }
}

/// Records the stream's object as soon as its id shows in the raw bytes read so far; the event
/// that ends the stream when the object may not be kept, or could not be recorded.
async fn registered(
    watch: &Watch,
    pending: &mut Option<(Registration, Vec<u8>)>,
    chunk: &[u8],
) -> Option<Bytes> {
    let (registration, scanned) = pending.as_mut()?;
    scanned.extend_from_slice(chunk);
    let id = (registration.find_id)(scanned)?;
    let (registration, _) = pending.take()?;
    let (code, message) = match settle(watch, registration, id, false).await {
        Settled::Kept => return None,
        Settled::Undone => (
            "subject_suppressed",
            "the subject is under erasure; the stream was stopped",
        ),
        Settled::Unrecorded => (
            "state_unavailable",
            "the stored object could not be recorded; the stream was stopped",
        ),
    };
    Some(Bytes::from(error_event(code, message)))
}

/// Passes checked events on until the stream ends or must stop; records the stream's object as
/// soon as its id shows in the raw bytes.
async fn forward(
    upstream: &mut Incoming,
    watch: &Watch,
    tx: &mpsc::Sender<Bytes>,
    pending: &mut Option<(Registration, Vec<u8>)>,
    tap: &mut Option<Box<dyn Tap>>,
) -> Stop {
    let mut check = SseCheck::default();
    // No feed position yet: the first event looks the subject up afresh, as a flip may have
    // come between the decision and the provider's first answer.
    let mut seen = u64::MAX;
    let end = |code: &str, message: &str| Bytes::from(error_event(code, message));
    loop {
        let frame = tokio::select! {
            // The client is gone: dropping `upstream` closes the provider's connection.
            () = tx.closed() => return Stop::Done,
            frame = tokio::time::timeout(IDLE, upstream.frame()) => frame,
        };
        let chunk = match frame {
            Err(_) => {
                let _ = tx
                    .send(end(
                        "upstream_unavailable",
                        "the provider sent nothing for 120 s",
                    ))
                    .await;
                return Stop::Done;
            }
            Ok(None) => {
                if check.finish().is_err() {
                    let _ = tx
                        .send(end(
                            "upstream_invalid",
                            "the provider's stream ended in the middle of an event",
                        ))
                        .await;
                    return Stop::Done;
                }
                return Stop::Finished;
            }
            Ok(Some(Err(_))) => {
                let _ = tx
                    .send(end(
                        "upstream_unavailable",
                        "the provider's stream broke off",
                    ))
                    .await;
                return Stop::Done;
            }
            Ok(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => data,
                Err(_) => continue,
            },
        };
        if let Some(event) = registered(watch, pending, &chunk).await {
            let _ = tx.send(event).await;
            return Stop::Done;
        }
        let events = match check.feed(&chunk) {
            Ok(events) => events,
            Err(problem) => {
                tracing::warn!(%problem, "provider stream refused");
                let _ = tx
                    .send(end(
                        "upstream_invalid",
                        "the provider sent a malformed event",
                    ))
                    .await;
                return Stop::Done;
            }
        };
        if let Some(refusal) = watch.caller_gone().await {
            let _ = tx.send(refusal).await;
            return Stop::Done;
        }
        if let Some((refusal, why, stop)) = watch.standing(&mut seen).await.ending() {
            let message = format!("{why}; the stream was stopped");
            let _ = tx.send(end(refusal.code(), &message)).await;
            return stop;
        }
        if let Some(tap) = tap.as_mut() {
            tap.events(&events);
        }
        if !events.is_empty() && tx.send(events).await.is_err() {
            return Stop::Done;
        }
    }
}
