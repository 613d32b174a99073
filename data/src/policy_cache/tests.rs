//! The cache against real state stores: in-process and cross-replica invalidation, a lost change
//! feed, and an unreachable store.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lethe_policy::audit::AuditEntry;
use lethe_policy::{Action, ConsentGrant};

use super::*;
use crate::state::{self, FeedEvent};
use crate::testing::{execute_raw, fresh_postgres_database, fresh_sqlite_url, migrated};

fn audit() -> AuditEntry {
    AuditEntry {
        at: crate::now(),
        tenant: Some("acme".into()),
        actor: "test".into(),
        action: "consent.grant".into(),
        request_id: "r".into(),
        subject_ref: None,
        target: "consent".into(),
        target_ref: None,
        result: "ok".into(),
        attempt: 1,
    }
}

fn grant(subject: &str) -> ConsentGrant {
    ConsentGrant {
        id: format!("g-{subject}-{}", uuid::Uuid::new_v4().simple()),
        tenant: "acme".into(),
        subject: subject.into(),
        purpose: "personalization".into(),
        category: "preference".into(),
        actions: [Action::Store, Action::Retrieve].into(),
        granted_at: crate::now(),
        expires_at: None,
        revoked_at: None,
        policy_version: 1,
        source: "test".into(),
    }
}

async fn until(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_change_in_this_process_is_seen_by_the_very_next_decision() {
    let store = migrated(&fresh_sqlite_url()).await;
    let cache = PolicyCache::new(Arc::clone(&store), 100, Duration::from_secs(900));
    assert!(cache.subject("acme", "u1").await.unwrap().grants.is_empty());
    let g = grant("u1");
    store.create_grant(&g, audit()).await.unwrap();
    assert_eq!(
        cache.subject("acme", "u1").await.unwrap().grants.len(),
        1,
        "no waiting: invalidated before the write returned"
    );
    store
        .revoke_grant(&g.id, crate::now(), audit())
        .await
        .unwrap();
    let after = cache.subject("acme", "u1").await.unwrap();
    assert!(after.grants.is_empty(), "a revoked grant is not kept");
}

#[tokio::test]
async fn subjects_never_granted_anything_share_one_policy_and_a_grant_gets_its_own() {
    let store = migrated(&fresh_sqlite_url()).await;
    let cache = PolicyCache::new(Arc::clone(&store), 100, Duration::from_secs(900));
    let (u1, u2) = (
        cache.subject("acme", "u1").await.unwrap(),
        cache.subject("acme", "u2").await.unwrap(),
    );
    assert!(Arc::ptr_eq(&u1, &u2), "one value for every unknown subject");
    store.create_grant(&grant("u1"), audit()).await.unwrap();
    let granted = cache.subject("acme", "u1").await.unwrap();
    assert_eq!(granted.grants.len(), 1);
    assert!(!Arc::ptr_eq(&granted, &u2));
    assert!(
        cache.subject("acme", "u2").await.unwrap().grants.is_empty(),
        "the shared value is not the granted one"
    );
    // Tenant and subject are kept apart in the key: ("acme", "u1") is not ("acmeu", "1").
    assert!(cache.subject("acmeu", "1").await.unwrap().grants.is_empty());
    // A revoked grant never covers again: u1 is back to knowing nothing, and shares the value.
    store
        .revoke_grant(&granted.grants[0].id, crate::now(), audit())
        .await
        .unwrap();
    let revoked = cache.subject("acme", "u1").await.unwrap();
    assert!(Arc::ptr_eq(&revoked, &u2), "{revoked:?}");
}

#[tokio::test]
async fn an_entry_no_change_reached_is_loaded_again_once_it_is_too_old() {
    let url = fresh_sqlite_url();
    let store = migrated(&url).await;
    let max_age = Duration::from_secs(10);
    let cache = PolicyCache::aging(Arc::clone(&store), 100, Duration::from_secs(900), max_age);
    assert!(cache.subject("acme", "u1").await.unwrap().grants.is_empty());
    // A change this store's feed never hears of: made through another connection to the file.
    let elsewhere = state::connect(&url).await.unwrap();
    elsewhere.use_subject_key(crate::testing::AUDIT_KEY);
    elsewhere.create_grant(&grant("u1"), audit()).await.unwrap();
    assert!(
        cache.subject("acme", "u1").await.unwrap().grants.is_empty(),
        "a young entry is served from the cache"
    );
    until("the old entry was loaded again", 3 * max_age, async || {
        cache.subject("acme", "u1").await.unwrap().grants.len() == 1
    })
    .await;
}

/// Another replica on the store at `url`, with its cache, once its change feed is connected.
async fn replica(url: &str) -> (Arc<dyn Store>, Arc<PolicyCache>) {
    let b = state::connect(url).await.unwrap();
    b.use_subject_key(crate::testing::AUDIT_KEY);
    let cache = PolicyCache::new(Arc::clone(&b), 1000, Duration::from_secs(900));
    until(
        "replica B's feed to connect",
        Duration::from_secs(10),
        async || b.feed().is_healthy(),
    )
    .await;
    (b, cache)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// Replica B's cache hears of replica A's change through PostgreSQL; prints the delay.
#[tokio::test]
async fn changes_reach_another_replica_through_postgres() {
    let url = fresh_postgres_database().await.unwrap();
    let a = migrated(&url).await;
    let (b, cache) = replica(&url).await;

    let arrivals: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let log = Arc::clone(&arrivals);
    b.feed().on_event(move |event| {
        if let FeedEvent::Changed(change) = event {
            log.lock()
                .unwrap()
                .push((change.subject.clone().unwrap_or_default(), Instant::now()));
        }
    });
    let mut delays = Vec::new();
    for round in 0..40 {
        let subject = format!("r{round}");
        assert!(
            cache
                .subject("acme", &subject)
                .await
                .unwrap()
                .grants
                .is_empty(),
            "cached with no grant"
        );
        a.create_grant(&grant(&subject), audit()).await.unwrap();
        let committed = Instant::now();
        until(
            "the change to reach replica B",
            Duration::from_secs(5),
            async || arrivals.lock().unwrap().iter().any(|(s, _)| *s == subject),
        )
        .await;
        let arrived = arrivals
            .lock()
            .unwrap()
            .iter()
            .find(|(s, _)| *s == subject)
            .map(|(_, at)| *at)
            .unwrap();
        delays.push(arrived.saturating_duration_since(committed));
        assert_eq!(
            cache.subject("acme", &subject).await.unwrap().grants.len(),
            1,
            "B decides on the new grant"
        );
    }
    delays.sort();
    eprintln!(
        "cross-replica invalidation over {} changes: p50 {:?}, p99 {:?}, max {:?}",
        delays.len(),
        percentile(&delays, 0.5),
        percentile(&delays, 0.99),
        delays.last().unwrap()
    );
}

/// When the listener's connection is killed the feed reports the loss, reconnects, and the cache
/// starts over; a change made meanwhile is not missed.
#[tokio::test]
async fn a_lost_feed_is_noticed_and_nothing_stale_is_served() {
    let url = fresh_postgres_database().await.unwrap();
    let a = migrated(&url).await;
    let (b, cache) = replica(&url).await;
    let events: Arc<Mutex<Vec<FeedEvent>>> = Arc::default();
    let log = Arc::clone(&events);
    b.feed()
        .on_event(move |e| log.lock().unwrap().push(e.clone()));

    assert!(cache.subject("acme", "u1").await.unwrap().grants.is_empty());
    let db = url.rsplit('/').next().unwrap();
    let killed = execute_raw(
        &crate::testing::postgres_admin_url(),
        &format!("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'lethe-feed' AND datname = '{db}'"),
    )
    .await
    .unwrap();
    // B's listener is connected (waited for above); A's may or may not be yet.
    assert!(killed >= 1, "B's listener was terminated");
    a.create_grant(&grant("u1"), audit()).await.unwrap();
    until(
        "the loss to be noticed and the feed restored",
        Duration::from_secs(10),
        async || {
            let seen = events.lock().unwrap();
            seen.contains(&FeedEvent::Lost) && seen.contains(&FeedEvent::Restored)
        },
    )
    .await;
    until(
        "B to see the grant made while its feed was down",
        Duration::from_secs(5),
        async || cache.subject("acme", "u1").await.unwrap().grants.len() == 1,
    )
    .await;
}

/// A TCP relay to PostgreSQL that the test can cut, to make the state store unreachable.
struct Relay {
    addr: std::net::SocketAddr,
    tasks: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Relay {
    async fn to(target: String) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let tasks: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let spawned = Arc::clone(&tasks);
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let target = target.clone();
                let relay = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                spawned.lock().unwrap().push(relay);
            }
        });
        tasks.lock().unwrap().push(accept);
        Relay { addr, tasks }
    }

    fn cut(&self) {
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}

#[tokio::test]
async fn an_unreachable_state_store_is_an_error_not_a_cached_answer() {
    let url = fresh_postgres_database().await.unwrap();
    let a = migrated(&url).await;
    a.create_grant(&grant("u1"), audit()).await.unwrap();
    let (authority, rest) = url.split_once('@').unwrap();
    let (host_port, db) = rest.split_once('/').unwrap();
    let relay = Relay::to(host_port.to_owned()).await;
    let (b, cache) = replica(&format!("{authority}@{}/{db}", relay.addr)).await;
    assert_eq!(
        cache.subject("acme", "u1").await.unwrap().grants.len(),
        1,
        "cached while all is well"
    );

    relay.cut();
    until(
        "the lost feed to be noticed",
        Duration::from_secs(10),
        async || !b.feed().is_healthy(),
    )
    .await;
    let answer = cache.subject("acme", "u1").await;
    assert!(
        answer.is_err(),
        "the cached policy must not be used once changes can be missed: {answer:?}"
    );
    let refused: crate::error::DataError = answer.unwrap_err().into();
    assert_eq!(
        (refused.status.as_u16(), refused.code.as_str()),
        (503, "state_unavailable")
    );
}
