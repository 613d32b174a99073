//! Pub/Sub: channels named like keys, subscribed to on a connection to Redis of their own, each
//! message decided again as Redis delivers it.

use super::{Connection, unavailable, utf8_keys, wrong_arity};
use crate::redis::client::ClientError;
use crate::redis::commands::{Command, classify};
use crate::redis::resp::Reply;

impl Connection<'_> {
    /// The next frame of the client's subscriptions; never, while it has none.
    pub(super) async fn pushed(&mut self) -> Result<Option<Reply>, ClientError> {
        match self.subscriber.as_mut() {
            Some(subscriber) => subscriber.next().await,
            None => std::future::pending().await,
        }
    }

    /// Whether a command is about the client's subscriptions (a `PING` too, once it has some:
    /// Redis answers it there).
    pub(super) fn subscribing(&self, args: &[Vec<u8>]) -> bool {
        self.ctx.is_some()
            && self.queue.is_none()
            && match classify(args) {
                Command::Subscribe | Command::Unsubscribe => true,
                Command::Ping => self.subscriber.is_some(),
                _ => false,
            }
    }

    /// Sends a subscription command on the subscriptions' own connection (made on first use);
    /// each channel subscribed to must be named like a key of the caller's scope.
    pub(super) async fn subscription(&mut self, args: Vec<Vec<u8>>) -> Result<(), Reply> {
        if matches!(classify(&args), Command::Subscribe) {
            if args.len() < 2 {
                return Err(wrong_arity(&args));
            }
            let channels = utf8_keys(&args, &(1..args.len()).collect::<Vec<_>>())?;
            self.owners(&channels)?;
        }
        if self.subscriber.is_none() {
            self.subscriber = Some(self.connect().await?);
        }
        let sent = match self.subscriber.as_mut() {
            Some(subscriber) => subscriber.send(&[args]).await,
            None => {
                return Err(unavailable(
                    "upstream_unavailable",
                    "no connection to Redis",
                ));
            }
        };
        sent.map_err(|e| {
            self.subscriber = None;
            unavailable("upstream_unavailable", &e.to_string())
        })
    }

    /// Whether a frame of the subscriptions reaches the client: a message on a channel whose
    /// subject the caller may not read now (suppressed, erased, no `retrieve` consent) is
    /// dropped, as the flip hides a subject from every read at once; so is one that cannot be
    /// decided (the state store unreachable).
    pub(super) async fn deliverable(&self, frame: &Reply) -> bool {
        let (Reply::Push(items) | Reply::Array(items)) = frame else {
            return true;
        };
        let (Some(Reply::Bulk(kind)), Some(Reply::Bulk(channel))) = (items.first(), items.get(1))
        else {
            return true;
        };
        if !matches!(kind.as_slice(), b"message" | b"smessage") {
            return true;
        }
        let Ok(channel) = std::str::from_utf8(channel) else {
            return false;
        };
        self.readable_now(&[channel]).await.unwrap_or(false)
    }
}
