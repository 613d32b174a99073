//! Tokens revoked before they expire (`POST /v1/tokens/revoke`, by `jti`): the deny-list every
//! replica consults on both planes. Kept in memory and told of every revocation by the change
//! feed before it is acknowledged; while the feed is lost, or until it has been loaded once, the
//! state store is asked instead, and a store that cannot answer refuses the request.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::auth::Claims;
use crate::state::{FeedEvent, Store, StoreError};

pub struct Revocations {
    store: Arc<dyn Store>,
    revoked: RwLock<HashSet<String>>,
    /// Moves on every loss or return of the feed: revocations may have been missed since.
    generation: AtomicU64,
    /// The generation the set was last loaded complete at (`u64::MAX`: never).
    loaded: AtomicU64,
}

impl Revocations {
    /// Subscribed to the store's feed; loaded at the first check.
    pub fn new(store: Arc<dyn Store>) -> Arc<Revocations> {
        let revocations = Arc::new(Revocations {
            store: Arc::clone(&store),
            revoked: RwLock::default(),
            generation: AtomicU64::new(0),
            loaded: AtomicU64::new(u64::MAX),
        });
        let weak = Arc::downgrade(&revocations);
        store.feed().on_event(move |event| {
            let Some(revocations) = weak.upgrade() else {
                return;
            };
            match event {
                FeedEvent::Changed(change) => {
                    if let Some(jti) = &change.revoked_token
                        && let Ok(mut revoked) = revocations.revoked.write()
                    {
                        revoked.insert(jti.clone());
                    }
                }
                FeedEvent::Lost | FeedEvent::Restored => {
                    revocations.generation.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        revocations
    }

    /// Whether the token these claims came from may still be used. A token without an id cannot
    /// be revoked (`lethe token` gives every token one).
    pub async fn check(&self, claims: &Claims) -> Result<(), Refused> {
        let Some(jti) = &claims.jti else {
            return Ok(());
        };
        let generation = self.generation.load(Ordering::SeqCst);
        if self.loaded.load(Ordering::SeqCst) != generation {
            // Read before loading: a feed lost during the load leaves the set to be loaded again.
            let feed_was_healthy = self.store.feed().is_healthy();
            let loaded = self
                .store
                .revoked_tokens()
                .await
                .map_err(Refused::Unknown)?;
            // Revocations are never taken back: what the feed added meanwhile stays.
            self.revoked
                .write()
                .map_err(|_| Refused::Poisoned)?
                .extend(loaded);
            if feed_was_healthy && self.generation.load(Ordering::SeqCst) == generation {
                self.loaded.store(generation, Ordering::SeqCst);
            }
        }
        let revoked = self.revoked.read().map_err(|_| Refused::Poisoned)?;
        if revoked.contains(jti) {
            Err(Refused::Revoked)
        } else {
            Ok(())
        }
    }
}

/// Why a token is not taken.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("the token was revoked")]
    Revoked,
    /// The deny-list cannot be read: fail closed.
    #[error("whether the token was revoked cannot be known: {0}")]
    Unknown(StoreError),
    #[error("the deny-list of revoked tokens is unusable")]
    Poisoned,
}
