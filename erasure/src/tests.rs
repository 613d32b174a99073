//! The purge worker on a real state store, with stand-in connectors whose failures the test
//! controls: retries with backoff, exception past the limit, completion with verification.

use std::sync::atomic::{AtomicU32, Ordering};

use lethe_policy::{ErasureEvent, ErasureState};

use super::*;
use crate::purge::Physical;
use crate::state::{ItemRecord, StoreError};
use crate::testing::{erasure_request, fresh_sqlite_url, migrated};
use async_trait::async_trait;

/// Fails its first `failures` calls, then deletes everything.
struct Flaky {
    failures: u32,
    calls: AtomicU32,
}

#[async_trait]
impl Connector for Flaky {
    async fn purge(
        &self,
        _: &crate::purge::Subjects,
        lineage: &[(String, String)],
    ) -> Result<PurgeReport, ConnectorError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) < self.failures {
            return Err(ConnectorError::Unavailable("upstream unavailable".into()));
        }
        Ok(all_deleted(lineage.len() as u64))
    }
    async fn count(
        &self,
        _: &crate::purge::Subjects,
        lineage: &[(String, String)],
    ) -> Result<u64, ConnectorError> {
        Ok(lineage.len() as u64)
    }
}

/// A purge that found `n` records and left none.
fn all_deleted(n: u64) -> PurgeReport {
    PurgeReport {
        probe_hits: None,
        before: n,
        deleted: n,
        remaining: 0,
        physical: Physical::done(["test".to_owned()]),
    }
}

fn audit() -> AuditEntry {
    AuditEntry {
        at: crate::now(),
        tenant: Some("acme".into()),
        actor: "t".into(),
        action: "t".into(),
        request_id: "r".into(),
        subject_ref: None,
        target: "t".into(),
        target_ref: None,
        result: "ok".into(),
        attempt: 1,
    }
}

/// A store with one approved (flipped) erasure of u1, who has two lineage rows in "chroma".
async fn flipped() -> Arc<dyn Store> {
    let store = migrated(&fresh_sqlite_url()).await;
    let now = crate::now();
    let item = |id: &str| ItemRecord {
        store: "chroma".into(),
        collection: "c1".into(),
        item_id: id.into(),
        tenant: "acme".into(),
        subject: "u1".into(),
        purpose: "p".into(),
        category: "c".into(),
        layer: lethe_policy::Layer::Raw,
        created_at: now,
        expires_at: now + TimeDelta::days(1),
        epoch: 0,
        source_ref: None,
        parents: vec![],
    };
    store.record_items(&[item("a"), item("b")]).await.unwrap();
    let record = erasure_request("er1", "u1", now);
    store
        .create_erasure(&record, &["chroma:chroma".into()], audit())
        .await
        .unwrap();
    store
        .approve_erasure("er1", "dpo", 1, now, audit())
        .await
        .unwrap();
    store
}

/// A store that refuses Lethe's credentials, every time.
struct Refusing {
    calls: AtomicU32,
}

#[async_trait]
impl Connector for Refusing {
    async fn purge(
        &self,
        _: &crate::purge::Subjects,
        _: &[(String, String)],
    ) -> Result<PurgeReport, ConnectorError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err(ConnectorError::from_status(
            "chroma",
            hyper::StatusCode::UNAUTHORIZED,
        ))
    }
    async fn count(
        &self,
        _: &crate::purge::Subjects,
        _: &[(String, String)],
    ) -> Result<u64, ConnectorError> {
        Err(ConnectorError::from_status(
            "chroma",
            hyper::StatusCode::UNAUTHORIZED,
        ))
    }
}

fn worker(store: &Arc<dyn Store>, failures: u32, max_attempts: u32) -> Worker {
    let connector: Arc<dyn Connector> = Arc::new(Flaky {
        failures,
        calls: AtomicU32::new(0),
    });
    worker_with(store, connector, max_attempts)
}

fn worker_with(store: &Arc<dyn Store>, connector: Arc<dyn Connector>, max_attempts: u32) -> Worker {
    let connectors =
        HashMap::from([("chroma:chroma".to_owned(), Target::own("chroma", connector))]);
    worker_of(store, connectors, max_attempts)
}

/// A worker over `connectors` that retries at once and purges as soon as a flip is made.
fn worker_of(
    store: &Arc<dyn Store>,
    connectors: HashMap<String, Target>,
    max_attempts: u32,
) -> Worker {
    let schedule = Schedule {
        max_attempts,
        first_backoff: Duration::from_millis(1),
        settle: Duration::ZERO,
        lease: Duration::from_secs(60),
        stop_grace: Duration::from_millis(200),
    };
    Worker::new(
        Arc::clone(store),
        connectors,
        schedule,
        Arc::from(crate::testing::AUDIT_KEY),
    )
}

/// Runs due jobs until none is left or `limit` passes (retries wait for their backoff).
async fn drain(worker: &Worker) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        if !worker.run_one().await.unwrap() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let jobs = worker.store.purge_jobs("er1").await.unwrap();
        if jobs
            .iter()
            .all(|j| j.state == "done" || j.state == "exception")
        {
            return;
        }
    }
}

#[tokio::test]
async fn failures_are_retried_until_the_store_is_purged_and_verified() {
    let store = flipped().await;
    let w = worker(&store, 2, 5);
    drain(&w).await;
    let record = store.erasure("er1").await.unwrap();
    assert_eq!(record.state, ErasureState::Completed);
    assert!(record.completed_at.is_some());
    let job = &store.purge_jobs("er1").await.unwrap()[0];
    assert_eq!((job.state.as_str(), job.attempts), ("done", 3));
    assert_eq!(job.result.as_ref().unwrap()["deleted"], 2);
    assert!(
        store.inventory("acme", "u1").await.unwrap().is_empty(),
        "lineage rows marked deleted"
    );
    let state = store.subject("acme", "u1").await.unwrap().unwrap();
    assert_eq!(state.status, lethe_policy::SubjectStatus::Erased);
    let events = store.audit_page(0, 100, None).await.unwrap();
    let results: Vec<(&str, &str)> = events
        .iter()
        .filter(|r| r.entry.action.starts_with("purge."))
        .map(|r| (r.entry.action.as_str(), r.entry.result.as_str()))
        .collect();
    assert_eq!(
        results,
        [
            ("purge.failed", "failed"),
            ("purge.failed", "failed"),
            ("purge.done", "ok")
        ],
        "each attempt's event says how it went"
    );
    let actions: Vec<String> = events.into_iter().map(|r| r.entry.action).collect();
    assert!(
        actions.contains(&"erasure.complete".to_owned()),
        "{actions:?}"
    );
}

#[tokio::test]
async fn the_certificate_is_issued_once_at_completion_and_never_changes() {
    use super::certificate::{Certifier, Signer, verify};
    let store = flipped().await;
    let certifier = || {
        Arc::new(Certifier::new(
            Signer::from_seed(&[9; 32]).unwrap(),
            Default::default(),
            Arc::from(&b"k"[..]),
        ))
    };
    let w = worker(&store, 0, 3).certifying(certifier());
    drain(&w).await;
    let record = store.erasure("er1").await.unwrap();
    assert_eq!(record.state, ErasureState::Completed);
    let issued = store
        .certificate("er1")
        .await
        .unwrap()
        .expect("issued at completion");
    let key = Signer::from_seed(&[9; 32]).unwrap().public_key_hex();
    assert!(verify(issued.as_bytes(), &key).is_ok());
    // Later downloads, after more audit events (a re-issue would carry a new chain head) and
    // from another process, give the same bytes.
    store.append_audit(audit()).await.unwrap();
    let again = certifier()
        .certificate(store.as_ref(), &record)
        .await
        .unwrap();
    assert_eq!(again, issued);
    assert_eq!(
        store.keep_certificate("er1", "another").await.unwrap(),
        issued,
        "a kept certificate is never replaced"
    );
}

/// Holds five of the subject's records; its first attempt deletes them and then fails (the
/// probe finds a record it cannot attribute), its second finds nothing left.
struct FailsAfterDeleting {
    held: std::sync::atomic::AtomicU64,
    calls: AtomicU32,
}

#[async_trait]
impl Connector for FailsAfterDeleting {
    async fn purge(
        &self,
        _: &crate::purge::Subjects,
        _: &[(String, String)],
    ) -> Result<PurgeReport, ConnectorError> {
        let before = self.held.swap(0, Ordering::SeqCst);
        let first = self.calls.fetch_add(1, Ordering::SeqCst) == 0;
        Ok(PurgeReport {
            probe_hits: Some(u64::from(first)),
            ..all_deleted(before)
        })
    }
    async fn count(
        &self,
        _: &crate::purge::Subjects,
        _: &[(String, String)],
    ) -> Result<u64, ConnectorError> {
        Ok(self.held.load(Ordering::SeqCst))
    }
}

#[tokio::test]
async fn the_certificate_counts_what_every_attempt_deleted() {
    use super::certificate::Certifier;
    let store = flipped().await;
    let connector = Arc::new(FailsAfterDeleting {
        held: 5.into(),
        calls: AtomicU32::new(0),
    });
    let certifier = Certifier::new(
        super::certificate::Signer::from_seed(&[9; 32]).unwrap(),
        Default::default(),
        Arc::from(&b"k"[..]),
    );
    let w = worker_with(&store, connector, 3).certifying(Arc::new(certifier));
    drain(&w).await;
    let job = &store.purge_jobs("er1").await.unwrap()[0];
    assert_eq!((job.state.as_str(), job.attempts), ("done", 2));
    let result = job.result.as_ref().unwrap();
    assert_eq!(
        (&result["before"], &result["deleted"], &result["remaining"]),
        (&5.into(), &5.into(), &0.into()),
        "{result}"
    );
    let issued = store.certificate("er1").await.unwrap().expect("issued");
    let certificate: serde_json::Value = serde_json::from_str(&issued).unwrap();
    let store = certificate.pointer("/certificate/stores/0");
    let counted = store.map(|s| (s["before"].clone(), s["deleted"].clone()));
    assert_eq!(counted, Some((5.into(), 5.into())), "{certificate}");
}

#[tokio::test]
async fn a_misconfigured_store_sends_the_request_to_exception_at_once_with_its_reason() {
    let store = flipped().await;
    let refusing = Arc::new(Refusing {
        calls: AtomicU32::new(0),
    });
    let w = worker_with(&store, Arc::clone(&refusing) as Arc<dyn Connector>, 5);
    drain(&w).await;
    assert_eq!(
        store.erasure("er1").await.unwrap().state,
        ErasureState::Exception
    );
    let job = &store.purge_jobs("er1").await.unwrap()[0];
    assert_eq!(
        (job.state.as_str(), job.attempts),
        ("exception", 1),
        "not retried"
    );
    assert_eq!(
        job.last_error.as_deref(),
        Some("misconfigured: chroma answered 401 Unauthorized")
    );
    assert_eq!(refusing.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn past_the_limit_the_request_goes_to_exception_and_stays_suppressed() {
    let store = flipped().await;
    let w = worker(&store, 10, 2);
    drain(&w).await;
    let record = store.erasure("er1").await.unwrap();
    assert_eq!(record.state, ErasureState::Exception);
    let job = &store.purge_jobs("er1").await.unwrap()[0];
    assert_eq!((job.state.as_str(), job.attempts), ("exception", 2));
    assert_eq!(job.last_error.as_deref(), Some("upstream unavailable"));
    let state = store.subject("acme", "u1").await.unwrap().unwrap();
    assert_eq!(
        state.status,
        lethe_policy::SubjectStatus::Suppressed,
        "a failure never makes data readable again"
    );
}

/// A person takes the request out of `exception`, deals with the cause, and resumes it: the failed
/// store is purged again from its first attempt and the request completes.
#[tokio::test]
async fn a_person_reviews_and_resumes_a_request_in_exception() {
    let store = flipped().await;
    let w = worker(&store, 2, 2);
    drain(&w).await;
    assert_eq!(
        store.erasure("er1").await.unwrap().state,
        ErasureState::Exception
    );
    let resumed_too_early = store
        .review_erasure("er1", ErasureEvent::Resume, crate::now(), audit())
        .await;
    assert!(matches!(resumed_too_early, Err(StoreError::Transition(_))));
    let reviewed = store
        .review_erasure("er1", ErasureEvent::Escalate, crate::now(), audit())
        .await
        .unwrap();
    assert_eq!(reviewed.state, ErasureState::ManualReview);
    let resumed = store
        .review_erasure("er1", ErasureEvent::Resume, crate::now(), audit())
        .await
        .unwrap();
    assert_eq!(resumed.state, ErasureState::Propagating);
    let job = &store.purge_jobs("er1").await.unwrap()[0];
    assert_eq!((job.state.as_str(), job.attempts), ("pending", 0));
    drain(&w).await;
    assert_eq!(
        store.erasure("er1").await.unwrap().state,
        ErasureState::Completed
    );
    let not_a_review = store
        .review_erasure("er1", ErasureEvent::Verified, crate::now(), audit())
        .await;
    assert!(matches!(not_a_review, Err(StoreError::Transition(_))));
}

#[tokio::test]
async fn a_job_waits_for_the_flip_to_settle_is_claimed_once_and_a_lost_lease_is_reclaimed() {
    let store = flipped().await;
    let flipped_at = store.erasure("er1").await.unwrap().suppressed_at.unwrap();
    let now = crate::now();
    let lease = |at| at + TimeDelta::seconds(60);
    let unsettled = flipped_at - TimeDelta::milliseconds(1);
    assert!(
        store
            .claim_purge_job("w1", now, unsettled, lease(now))
            .await
            .unwrap()
            .is_none(),
        "writes decided before the flip may still be landing"
    );
    let first = store
        .claim_purge_job("w1", now, now, lease(now))
        .await
        .unwrap();
    let first = first.expect("settled and due");
    assert!(
        store
            .claim_purge_job("w2", now, now, lease(now))
            .await
            .unwrap()
            .is_none(),
        "leased to w1"
    );
    assert_eq!(
        store.erasure("er1").await.unwrap().state,
        ErasureState::Propagating
    );
    // A running worker keeps its job by renewing the lease; nobody else can renew it.
    let later = now + TimeDelta::seconds(61);
    assert!(
        store
            .renew_purge_job(&first.id, "w1", lease(later))
            .await
            .unwrap()
    );
    assert!(
        !store
            .renew_purge_job(&first.id, "w2", lease(later))
            .await
            .unwrap()
    );
    assert!(
        store
            .claim_purge_job("w2", later, later, lease(later))
            .await
            .unwrap()
            .is_none()
    );
    let much_later = later + TimeDelta::seconds(61);
    let again = store
        .claim_purge_job("w2", much_later, much_later, lease(much_later))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.attempts, 2, "w1 died holding it; w2 takes it over");
}

/// Erasure `er1` of `u1`, filed for `targets` and approved.
async fn approved(store: &Arc<dyn Store>, targets: &[String]) {
    let now = crate::now();
    store
        .create_erasure(&erasure_request("er1", "u1", now), targets, audit())
        .await
        .unwrap();
    store
        .approve_erasure("er1", "dpo", 1, now, audit())
        .await
        .unwrap();
}

/// Purges only once every store of the barrier is being purged at the same time.
struct Together(Arc<tokio::sync::Barrier>);

#[async_trait]
impl Connector for Together {
    async fn purge(
        &self,
        _: &crate::purge::Subjects,
        _: &[(String, String)],
    ) -> Result<PurgeReport, ConnectorError> {
        self.0.wait().await;
        Ok(all_deleted(0))
    }
    async fn count(
        &self,
        _: &crate::purge::Subjects,
        _: &[(String, String)],
    ) -> Result<u64, ConnectorError> {
        Ok(0)
    }
}

#[tokio::test]
async fn an_erasures_stores_are_purged_side_by_side() {
    // Each store's purge returns only while the other's runs too: one after the other, neither
    // would ever finish.
    let store = migrated(&fresh_sqlite_url()).await;
    let targets = ["chroma:chroma".to_owned(), "qdrant:qdrant".to_owned()];
    approved(&store, &targets).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let connectors = targets
        .iter()
        .map(|t| {
            let connector: Arc<dyn Connector> = Arc::new(Together(Arc::clone(&barrier)));
            (
                t.clone(),
                Target::own(t.split(':').next().unwrap(), connector),
            )
        })
        .collect();
    let worker = worker_of(&store, connectors, 1);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while store.erasure("er1").await.unwrap().state != ErasureState::Completed {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the two purges never ran at once"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let jobs = store.purge_jobs("er1").await.unwrap();
    assert!(
        jobs.len() == 2 && jobs.iter().all(|j| j.state == "done"),
        "completed only once every store is purged"
    );
    let _ = stop.send(());
    running.await.unwrap();
}

#[tokio::test]
async fn a_purge_that_never_ends_does_not_hold_the_worker_past_its_grace_at_stop() {
    let store = migrated(&fresh_sqlite_url()).await;
    let targets = ["chroma:chroma".to_owned()];
    approved(&store, &targets).await;
    // A barrier of two that only one purge reaches: it never returns.
    let connector: Arc<dyn Connector> = Arc::new(Together(Arc::new(tokio::sync::Barrier::new(2))));
    let connectors = HashMap::from([(targets[0].clone(), Target::own("chroma", connector))]);
    let worker = worker_of(&store, connectors, 1);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while store.purge_jobs("er1").await.unwrap()[0].attempts == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the job was never claimed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = stop.send(());
    // The grace is 200 ms: well before 5 s the worker has abandoned the job and returned.
    tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("the worker stopped")
        .unwrap();
    let job = &store.purge_jobs("er1").await.unwrap()[0];
    assert_ne!(
        job.state, "done",
        "nothing was claimed of the abandoned job"
    );
    assert_ne!(
        store.erasure("er1").await.unwrap().state,
        ErasureState::Completed
    );
}
