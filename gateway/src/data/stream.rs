//! Server-sent events relayed event by event. The request was decided before the first byte; while
//! the stream runs, a relay task forwards each complete, well-formed event and stops when:
//! - the client goes away (the upstream request is dropped with it, so the provider stops);
//! - the subject is suppressed (or its epoch moves on): the stream ends with an `error` event
//!   `subject_suppressed`, as nothing more may be sent to or from the provider about it;
//! - the upstream sends something that is not well-formed SSE, or fails: an `error` event
//!   `upstream_invalid` or `upstream_unavailable` ends it.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use tokio::sync::mpsc;

use super::policy_cache::PolicyCache;
use crate::adapters::openai::{SseCheck, error_event, streamed_object_id};
use crate::store::{ItemRecord, Store};

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

/// Whose stream it is: the relay stops it when this subject stops being active in this epoch.
pub struct Watch {
    pub policy: Arc<PolicyCache>,
    pub store: Arc<dyn Store>,
    pub tenant: String,
    pub subject: String,
    pub epoch: i64,
}

impl Watch {
    /// Only when the store reports a change (or cannot report them) is the subject looked up.
    async fn still_allowed(&self, seen: &mut u64) -> bool {
        let feed = self.store.feed();
        if feed.is_healthy() && feed.seq() == *seen {
            return true;
        }
        *seen = feed.seq();
        match self.policy.subject(&self.tenant, &self.subject).await {
            Ok(policy) => policy.state.is_active() && policy.state.epoch == self.epoch,
            Err(_) => false,
        }
    }
}

/// A stored object the stream creates: recorded as the subject's from the stream's first events,
/// before the client can read its id.
pub struct Registration {
    /// The lineage row; its `item_id` is filled in from the stream.
    pub row: ItemRecord,
}

/// Relays `upstream` to the client. The stream is cut as the module says.
pub fn relay(upstream: Incoming, watch: Watch, registration: Option<Registration>) -> EventStream {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut upstream = upstream;
        let mut registration = registration;
        let mut check = SseCheck::default();
        let mut seen = watch.store.feed().seq();
        let end = |code: &str, message: &str| Bytes::from(error_event(code, message));
        loop {
            let frame = tokio::select! {
                // The client is gone: dropping `upstream` closes the provider's connection.
                () = tx.closed() => return,
                frame = upstream.frame() => frame,
            };
            let chunk = match frame {
                None => {
                    if check.finish().is_err() {
                        let _ = tx
                            .send(end(
                                "upstream_invalid",
                                "the provider's stream ended in the middle of an event",
                            ))
                            .await;
                    }
                    return;
                }
                Some(Err(_)) => {
                    let _ = tx
                        .send(end(
                            "upstream_unavailable",
                            "the provider's stream broke off",
                        ))
                        .await;
                    return;
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => data,
                    Err(_) => continue,
                },
            };
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
                    return;
                }
            };
            if !watch.still_allowed(&mut seen).await {
                let _ = tx
                    .send(end(
                        "subject_suppressed",
                        "the subject is under erasure; the stream was stopped",
                    ))
                    .await;
                return;
            }
            if let Some(pending) = registration.take_if(|_| !events.is_empty()) {
                match streamed_object_id(&events) {
                    Some(id) => {
                        let row = ItemRecord {
                            item_id: id,
                            ..pending.row
                        };
                        if watch.store.record_items(&[row]).await.is_err() {
                            let _ = tx.send(end("state_unavailable", "the stored object could not be recorded; the stream was stopped")).await;
                            return;
                        }
                    }
                    None => registration = Some(pending),
                }
            }
            if !events.is_empty() && tx.send(events).await.is_err() {
                return;
            }
        }
    });
    EventStream { rx }
}
