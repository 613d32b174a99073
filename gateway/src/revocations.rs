//! Tokens revoked before they expire (`POST /v1/tokens/revoke`, by `jti`): the deny-list every
//! replica consults on both planes. Kept in memory and told of every revocation by the change
//! feed before it is acknowledged; while the feed is lost, or until it has been loaded once, the
//! state store is asked instead, and a store that cannot answer refuses the request.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use crate::auth::Claims;
use crate::store::{FeedEvent, Store, StoreError};

pub struct Revocations {
    store: Arc<dyn Store>,
    revoked: RwLock<HashSet<String>>,
    /// The set may miss revocations (not loaded yet, or the feed was lost): load it again.
    stale: AtomicBool,
}

impl Revocations {
    /// Subscribed to the store's feed; loaded at the first check.
    pub fn new(store: Arc<dyn Store>) -> Arc<Revocations> {
        let revocations = Arc::new(Revocations {
            store: Arc::clone(&store),
            revoked: RwLock::default(),
            stale: AtomicBool::new(true),
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
                    revocations.stale.store(true, Ordering::SeqCst)
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
        if self.stale.load(Ordering::SeqCst) {
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
            if self.store.feed().is_healthy() {
                self.stale.store(false, Ordering::SeqCst);
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
