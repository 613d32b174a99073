//! The policy change feed: every change that can alter a decision, from this process and (on
//! PostgreSQL) from every other replica, delivered synchronously to the registered callbacks so
//! that a cache is invalidated before the change is acknowledged.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

/// What changed: one subject's policy, something tenant-wide (`subject: None`: retention rules,
/// tenant holds), or the items erasures' closures hide in the tenant (`derivatives`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyChange {
    pub tenant: String,
    pub subject: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub derivatives: bool,
    /// A token revoked by its id: every replica refuses it from now on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_token: Option<String>,
}

impl PolicyChange {
    pub fn of_subject(tenant: &str, subject: &str) -> PolicyChange {
        PolicyChange::of(tenant, Some(subject))
    }

    /// A subject's, or with `None` the tenant's.
    pub fn of(tenant: &str, subject: Option<&str>) -> PolicyChange {
        PolicyChange {
            tenant: tenant.to_owned(),
            subject: subject.map(str::to_owned),
            derivatives: false,
            revoked_token: None,
        }
    }

    /// The items hidden by closures in the tenant changed.
    pub fn of_derivatives(tenant: &str) -> PolicyChange {
        PolicyChange {
            tenant: tenant.to_owned(),
            subject: None,
            derivatives: true,
            revoked_token: None,
        }
    }

    /// A token was revoked (tenant-less: a token's id names no tenant).
    pub fn of_revoked_token(jti: &str) -> PolicyChange {
        PolicyChange {
            tenant: String::new(),
            subject: None,
            derivatives: false,
            revoked_token: Some(jti.to_owned()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FeedEvent {
    Changed(PolicyChange),
    /// Changes from other replicas may be missed from now on: caches must not be trusted.
    Lost,
    /// The feed is back; anything cached before is suspect and must be dropped.
    Restored,
}

type Callback = Arc<dyn Fn(&FeedEvent) + Send + Sync>;

pub struct Feed {
    healthy: AtomicBool,
    seq: AtomicU64,
    callbacks: RwLock<Vec<Callback>>,
}

impl Feed {
    /// `healthy` is false for a feed that has yet to connect.
    pub fn new(healthy: bool) -> Self {
        Feed {
            healthy: AtomicBool::new(healthy),
            seq: AtomicU64::new(0),
            callbacks: RwLock::default(),
        }
    }

    /// Whether every change is being delivered; when not, caches must be bypassed.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::SeqCst)
    }

    /// Counts every event; a reader that saw the same number before and after loading knows no
    /// change raced its load.
    pub fn seq(&self) -> u64 {
        self.seq.load(Ordering::SeqCst)
    }

    pub fn on_event(&self, callback: impl Fn(&FeedEvent) + Send + Sync + 'static) {
        self.callbacks
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::new(callback));
    }

    pub fn publish(&self, event: FeedEvent) {
        self.seq.fetch_add(1, Ordering::SeqCst);
        if event == FeedEvent::Lost {
            self.healthy.store(false, Ordering::SeqCst);
        }
        let callbacks = self
            .callbacks
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for callback in &callbacks {
            callback(&event);
        }
        // Only once every cache has dropped what it held.
        if event == FeedEvent::Restored {
            self.healthy.store(true, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn callbacks_run_before_health_returns_and_every_event_counts() {
        let feed = Arc::new(Feed::new(true));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (seen2, feed2) = (Arc::clone(&seen), Arc::downgrade(&feed));
        feed.on_event(move |e| {
            let healthy = feed2.upgrade().map(|f| f.is_healthy());
            seen2.lock().unwrap().push((e.clone(), healthy));
        });
        let change = PolicyChange::of_subject("acme", "u1");
        feed.publish(FeedEvent::Changed(change.clone()));
        feed.publish(FeedEvent::Lost);
        assert!(!feed.is_healthy());
        feed.publish(FeedEvent::Restored);
        assert!(feed.is_healthy());
        assert_eq!(feed.seq(), 3);
        let seen = seen.lock().unwrap();
        assert_eq!(
            *seen,
            [
                (FeedEvent::Changed(change), Some(true)),
                (FeedEvent::Lost, Some(false)),
                // Still unhealthy while the callback drops its cache.
                (FeedEvent::Restored, Some(false)),
            ]
        );
    }
}
