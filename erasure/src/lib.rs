//! The purge: durable jobs, one per (erasure request, target store), claimed by a worker on every
//! replica (never twice: PostgreSQL's SKIP LOCKED), retried with exponential backoff, moved to
//! `exception` past the limit. A failure never makes anything readable again: the subject stays
//! suppressed whatever happens here.

pub mod governed;

// The layers below, named as before.
use lethe_data as data;
#[cfg(test)]
use lethe_data::testing;
use lethe_data::{config, purge};
use lethe_state as state;
use lethe_state::now;

pub mod certificate;
pub mod inventory;
pub mod postgres;
pub mod sqlite_file;
mod sweeper;
mod tally;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::TimeDelta;
use lethe_policy::audit::AuditEntry;
use serde::Serialize;

pub use postgres::PostgresTarget;
pub use sweeper::Sweeper;
use tally::Tally;

use crate::config::Config;
use crate::data::forward::{Route, Upstreams};
use crate::purge::{Connector, ConnectorError, PurgeReport, Subjects};
use crate::state::{ExpiredItem, JobOutcome, PurgeJob, Store};
pub use inventory::Inventory;

/// The connector of a route to a store Lethe writes items to.
pub struct RouteConnector {
    /// The route's name: the lineage store of its items.
    pub route: String,
    /// The erasure target, e.g. `chroma:<route>`.
    pub target: String,
    pub connector: Arc<dyn Connector>,
}

/// The connector of each of `routes` (a configuration's, built by `stores::routes`).
pub fn route_connectors(
    config: &Config,
    routes: &[Route],
    audit_key: &Arc<[u8]>,
) -> Result<Vec<RouteConnector>, String> {
    let upstreams = Arc::new(Upstreams::from_config(config, 64 * 1024 * 1024)?);
    let mut connectors = Vec::new();
    for route in routes {
        let target = crate::config::route_target(route.store.kind(), &route.name);
        let mut route = route.clone();
        // A store that never answers must not hold a purge (and its lease) forever.
        route.timeout.get_or_insert(Duration::from_secs(30));
        let connector = route.store.connector(
            route.clone(),
            Arc::clone(&upstreams),
            &config.erasure,
            audit_key,
        );
        connectors.push(RouteConnector {
            route: route.name,
            target,
            connector,
        });
    }
    Ok(connectors)
}

/// A purge target: its connector, and the lineage store whose item ids it is given.
#[derive(Clone)]
pub struct Target {
    pub connector: Arc<dyn Connector>,
    pub lineage_store: String,
    /// Whether those lineage rows are this store's own (then the purge marks them deleted); a
    /// store that only follows another's ids (Mem0's history.db follows its vector store) does not.
    pub owns_lineage: bool,
}

impl Target {
    /// A target whose lineage rows are its own, in the lineage store `store`.
    pub fn own(store: &str, connector: Arc<dyn Connector>) -> Target {
        Target {
            connector,
            lineage_store: store.to_owned(),
            owns_lineage: true,
        }
    }

    /// The lineage ids the store is searched by. A store that follows another's ids needs them
    /// all, even those its owner has purged already.
    async fn lineage(
        &self,
        store: &dyn Store,
        subjects: &Subjects,
    ) -> Result<Vec<(String, String)>, crate::state::StoreError> {
        store
            .lineage_items(
                subjects.tenant(),
                &self.lineage_store,
                subjects.names(),
                !self.owns_lineage,
            )
            .await
    }
}

/// A kind of store only erasure reaches, configured as `[[erasure.<name>]]` tables; its targets
/// are `<name>:<the table's name>`. A new kind is its connector module and a line in
/// `stores::TARGET_KINDS` (given to [`problems`], [`targets`] and the worker by the composition
/// root): configuration, checks, targets and `lethe stores` follow.
pub struct TargetKind {
    pub name: &'static str,
    /// Every problem of one table of the kind (unknown keys included), without resolving its
    /// secrets; `config` for what it refers to (a route it follows).
    pub problems: fn(&toml::Table, &Config) -> Vec<String>,
    /// The purge target one table describes, its secrets resolved.
    pub target: fn(&toml::Table, &Config) -> Result<Target, String>,
}

/// The problems of a configuration's `[[erasure.<kind>]]` tables: a kind no store has, and each
/// kind's own.
pub fn problems(config: &Config, kinds: &[TargetKind]) -> Vec<String> {
    let mut problems = Vec::new();
    let tables = &config.erasure.targets;
    for (i, table) in tables.iter().enumerate() {
        let nth = 1 + tables[..i].iter().filter(|t| t.kind == table.kind).count();
        let at = format!("[[erasure.{}]] #{nth} ({})", table.kind, table.name);
        match kinds.iter().find(|k| k.name == table.kind) {
            Some(kind) => problems.extend(
                (kind.problems)(&table.settings, config)
                    .into_iter()
                    .map(|p| format!("{at}: {p}")),
            ),
            None => problems.push(format!(
                "{at}: no store only erasure reaches is called {:?} (known: {})",
                table.kind,
                kinds.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
            )),
        }
    }
    problems
}

/// One purge target per erasure target of the config: its routes (built by `stores::routes`),
/// its `[[erasure.<kind>]]` stores, and its governed databases (`governed`, their targets as
/// `governed::plan::erasure_target` writes them).
pub fn targets(
    config: &Config,
    routes: &[Route],
    governed: &[PostgresTarget],
    kinds: &[TargetKind],
    audit_key: &Arc<[u8]>,
) -> Result<Vec<(String, Target)>, String> {
    let mut targets = Vec::new();
    for c in route_connectors(config, routes, audit_key)? {
        targets.push((c.target, Target::own(&c.route, c.connector)));
    }
    for table in &config.erasure.targets {
        let kind = kinds
            .iter()
            .find(|k| k.name == table.kind)
            .ok_or_else(|| format!("[[erasure.{}]]: no such kind", table.kind))?;
        let target = (kind.target)(&table.settings, config)
            .map_err(|e| format!("[[erasure.{}]] {}: {e}", table.kind, table.name))?;
        targets.push((table.target(), target));
    }
    for target in governed {
        let name = format!("postgres:{}", target.name);
        let connected = postgres::connected(target.clone()).map_err(|e| format!("{name}: {e}"))?;
        targets.push((name, connected));
    }
    Ok(targets)
}

/// When jobs run and how often they are tried.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    pub max_attempts: u32,
    /// The wait before the first retry; it doubles with every attempt.
    pub first_backoff: Duration,
    /// The wait after the flip before a request's jobs are claimed.
    pub settle: Duration,
    pub lease: Duration,
    /// How long jobs under way get to finish once the worker is told to stop; those still
    /// running then are abandoned, as a crash would leave them (their lease runs out and they
    /// run again), so that a store that hangs cannot hold the process up.
    pub stop_grace: Duration,
}

impl Schedule {
    pub fn from_config(config: &Config) -> Schedule {
        Schedule {
            max_attempts: config.erasure.max_attempts,
            first_backoff: config.erasure.retry_backoff.0,
            settle: config.erasure.settle.0,
            lease: config.erasure.job_lease.0,
            stop_grace: STOP_GRACE,
        }
    }
}

fn delta(d: Duration) -> TimeDelta {
    TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX)
}

/// How long purge jobs under way get to finish when Lethe stops: within the 15-30 s that
/// service managers wait after SIGTERM, with room for the rest of the shutdown.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// How many purge jobs a worker runs at once: an erasure's targets (Chroma, Qdrant, ...) are
/// purged side by side, so it takes as long as its slowest store rather than their sum.
const PARALLEL_JOBS: usize = 4;

pub struct Worker {
    store: Arc<dyn Store>,
    connectors: HashMap<String, Target>,
    id: String,
    schedule: Schedule,
    /// Issues a request's certificate as it completes (else its first download does).
    certifier: Option<Arc<certificate::Certifier>>,
    /// The key of subject references: a replay knows erased subjects by reference only.
    audit_key: Arc<[u8]>,
}

impl Worker {
    /// A worker with one connector per erasure target of the config.
    pub fn from_config(
        config: &Config,
        routes: &[Route],
        governed: &[PostgresTarget],
        kinds: &[TargetKind],
        store: Arc<dyn Store>,
        audit_key: Arc<[u8]>,
    ) -> Result<Worker, String> {
        Ok(Worker::new(
            store,
            targets(config, routes, governed, kinds, &audit_key)?
                .into_iter()
                .collect(),
            Schedule::from_config(config),
            audit_key,
        ))
    }

    /// `connectors`: target name (`chroma:<route>`, ...) -> target.
    pub fn new(
        store: Arc<dyn Store>,
        connectors: HashMap<String, Target>,
        schedule: Schedule,
        audit_key: Arc<[u8]>,
    ) -> Worker {
        let id = format!("worker-{}", uuid::Uuid::new_v4().simple());
        Worker {
            store,
            connectors,
            id,
            schedule,
            certifier: None,
            audit_key,
        }
    }

    /// The worker issues each request's certificate as soon as the request completes.
    pub fn certifying(mut self, certifier: Arc<certificate::Certifier>) -> Worker {
        self.certifier = Some(certifier);
        self
    }

    /// Claims and runs jobs until `stop` resolves, up to [`PARALLEL_JOBS`] at once; idles briefly
    /// when there is nothing to do. Jobs under way when `stop` resolves get the schedule's
    /// `stop_grace` to finish.
    pub async fn run(self, stop: impl Future<Output = ()>) {
        let worker = Arc::new(self);
        let mut stop = std::pin::pin!(stop);
        let mut running = tokio::task::JoinSet::new();
        loop {
            if running.len() < PARALLEL_JOBS {
                match worker.claim().await {
                    Ok(Some(job)) => {
                        let worker = Arc::clone(&worker);
                        running.spawn(async move {
                            if let Err(e) = worker.run_job(job).await {
                                tracing::warn!(error = %e, "purge job result not recorded; its lease runs out and it runs again");
                            }
                        });
                        continue;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "purge worker could not reach the state store");
                    }
                }
            }
            tokio::select! {
                Some(_) = running.join_next(), if !running.is_empty() => {}
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
                () = &mut stop => break,
            }
        }
        let finished = async { while running.join_next().await.is_some() {} };
        if tokio::time::timeout(worker.schedule.stop_grace, finished)
            .await
            .is_err()
        {
            tracing::warn!(
                jobs = running.len(),
                "purge jobs still running at shutdown abandoned; their leases run out and they run again"
            );
            running.shutdown().await;
        }
    }

    /// Runs one due job, if any; answers whether there was one.
    pub async fn run_one(&self) -> Result<bool, crate::state::StoreError> {
        match self.claim().await? {
            Some(job) => self.run_job(job).await.map(|()| true),
            None => Ok(false),
        }
    }

    /// A due job, claimed for this worker until its lease runs out.
    async fn claim(&self) -> Result<Option<PurgeJob>, crate::state::StoreError> {
        let now = crate::now();
        let lease = delta(self.schedule.lease);
        let settled = now - delta(self.schedule.settle);
        self.store
            .claim_purge_job(&self.id, now, settled, now + lease)
            .await
    }

    /// Runs a claimed job and records its outcome (and the request's completion, with its
    /// certificate).
    async fn run_job(&self, job: PurgeJob) -> Result<(), crate::state::StoreError> {
        let lease = delta(self.schedule.lease);
        // The lease is renewed while the purge runs: a long purge keeps its job, a crashed
        // worker's job is taken over once its lease runs out.
        let record = self.store.erasure(&job.request_id).await;
        let tenant = record.as_ref().ok().map(|r| r.tenant.clone());
        let purge = self.purge(&job, record.map_err(|e| e.to_string()));
        let mut purge = std::pin::pin!(purge);
        let mut renew = tokio::time::interval(self.schedule.lease / 3);
        renew.tick().await;
        let outcome = loop {
            tokio::select! {
                outcome = &mut purge => break outcome,
                _ = renew.tick() => {
                    match self.store.renew_purge_job(&job.id, &self.id, crate::now() + lease).await {
                        Ok(true) => {}
                        Ok(false) => tracing::warn!(job = %job.id, "purge job lease lost; finishing anyway (purges are idempotent)"),
                        Err(e) => tracing::warn!(error = %e, "purge job lease not renewed"),
                    }
                }
            }
        };
        let (failed, gave_up) = match &outcome {
            JobOutcome::Failed { retry_at, .. } => (true, retry_at.is_none()),
            JobOutcome::Done(_) => (false, false),
        };
        // The store writes the job's event (and the request's) with the job's result.
        let audit = AuditEntry {
            at: crate::now(),
            tenant,
            actor: self.id.clone(),
            action: "purge".into(),
            request_id: job.request_id.clone(),
            subject_ref: None,
            target: job.target.clone(),
            target_ref: Some(job.id.clone()),
            result: "ok".into(),
            attempt: job.attempts,
        };
        let record = self
            .store
            .finish_purge_job(&job.id, outcome, crate::now(), audit)
            .await?;
        // Levels an alert can follow: a retry warns; a purge that gave up, leaving the request
        // to a person, is an error. The failure itself is in the job, not in the log; the store
        // is `store`, as `target` is the event's own (its module).
        let (request, store, state, attempt) =
            (&record.id, &job.target, record.state, job.attempts);
        if gave_up || state == lethe_policy::ErasureState::Exception {
            tracing::error!(%request, %store, %state, attempt, "purge gave up: the erasure request needs a person (review, then resume)");
        } else if failed {
            tracing::warn!(%request, %store, %state, attempt, "purge attempt failed; retrying after its backoff");
        } else {
            tracing::info!(%request, %store, %state, attempt, "purge job finished");
        }
        if record.state == lethe_policy::ErasureState::Completed
            && let Some(certifier) = &self.certifier
            && let Err(e) = certifier.certificate(self.store.as_ref(), &record).await
        {
            tracing::warn!(request = %record.id, error = %e, "certificate not issued at completion; its first download issues it");
        }
        Ok(())
    }

    async fn purge(
        &self,
        job: &PurgeJob,
        record: Result<crate::state::ErasureRecord, String>,
    ) -> JobOutcome {
        let earlier = Tally::of(job.so_far.as_ref());
        let failed = |error: String, tally: Tally| {
            let retry = job.attempts < i64::from(self.schedule.max_attempts);
            let delay = self
                .schedule
                .first_backoff
                .saturating_mul(2u32.saturating_pow(u32::try_from(job.attempts - 1).unwrap_or(0)));
            let retry_at =
                retry.then(|| crate::now() + TimeDelta::from_std(delay).unwrap_or(TimeDelta::MAX));
            JobOutcome::Failed {
                error,
                retry_at,
                tally: Some(tally.value()),
            }
        };
        let Some(target) = self.connectors.get(&job.target) else {
            return JobOutcome::Failed {
                error: format!("no connector for {} in this configuration", job.target),
                retry_at: None,
                tally: Some(earlier.value()),
            };
        };
        let record = match record {
            Ok(record) => record,
            Err(e) => return failed(e, earlier),
        };
        let subjects = Subjects::new(
            &record.tenant,
            record.keys().map(str::to_owned).collect(),
            Arc::clone(&self.audit_key),
        );
        let lineage = match target.lineage(self.store.as_ref(), &subjects).await {
            Ok(items) => items,
            Err(e) => return failed(e.to_string(), earlier),
        };
        let report = match target.connector.purge(&subjects, &lineage).await {
            Ok(report) => report,
            // Retrying cannot mend a configuration: to a person at once, with the reason.
            Err(e @ ConnectorError::Misconfigured(_)) => {
                return JobOutcome::Failed {
                    error: e.to_string(),
                    retry_at: None,
                    tally: Some(earlier.uncounted().value()),
                };
            }
            Err(ConnectorError::Unavailable(e)) => return failed(e, earlier.uncounted()),
        };
        let tally = earlier.counted(&report);
        if let Some(hits) = report.probe_hits.filter(|n| *n > 0) {
            return failed(
                format!(
                    "the verification probe found {hits} records of the subject the purge could not attribute; a person must review them"
                ),
                tally,
            );
        }
        if report.remaining > 0 {
            return failed(
                format!("{} records remain after deletion", report.remaining),
                tally,
            );
        }
        if target.owns_lineage {
            let mut by_collection: HashMap<&str, Vec<String>> = HashMap::new();
            for (collection, id) in &lineage {
                by_collection
                    .entry(collection)
                    .or_default()
                    .push(id.clone());
            }
            for (collection, ids) in by_collection {
                if let Err(e) = self
                    .store
                    .mark_items_deleted(&target.lineage_store, collection, &ids, crate::now())
                    .await
                {
                    return failed(e.to_string(), tally);
                }
            }
        }
        let mut result = serde_json::to_value(tally.into_report(report)).unwrap_or_default();
        if tally.uncounted_attempts > 0 {
            result["uncounted_attempts"] = tally.uncounted_attempts.into();
        }
        match self.purge_derivatives(&record, target).await {
            Ok(derivatives) => result["derivatives"] = derivatives,
            Err(e) => return failed(e, tally),
        }
        JobOutcome::Done(result)
    }
}

impl Worker {
    /// Erases the request's derivatives that are decided for erasure and kept in the target's
    /// store (or followed by it): the subject's own went with its items (by their stamp);
    /// another subject's are deleted by id, for the owner lineage names, and counted again in the
    /// store. The store that owns them marks them erased; one that follows another's ids (Mem0's
    /// `history.db`) deletes its rows of them whenever it runs. Answers what was done, for the
    /// certificate.
    async fn purge_derivatives(
        &self,
        record: &crate::state::ErasureRecord,
        target: &Target,
    ) -> Result<serde_json::Value, String> {
        use crate::state::Decision;
        let derivatives = self
            .store
            .derivatives(&record.id)
            .await
            .map_err(|e| e.to_string())?;
        let due: Vec<&crate::state::Derivative> = derivatives
            .iter()
            .filter(|d| d.item.store == target.lineage_store && d.decision == Decision::Erase)
            .filter(|d| !target.owns_lineage || d.erased_at.is_none())
            .collect();
        let mut by_collection: HashMap<&str, Vec<ExpiredItem>> = HashMap::new();
        for d in due.iter().filter(|d| !d.own) {
            by_collection
                .entry(d.item.collection.as_str())
                .or_default()
                .push(ExpiredItem {
                    store: d.item.store.clone(),
                    collection: d.item.collection.clone(),
                    item_id: d.item.item.clone(),
                    tenant: record.tenant.clone(),
                    subject: d.subject.clone().unwrap_or_default(),
                });
        }
        let (mut deleted, mut remaining) = (0, 0);
        for (collection, items) in &by_collection {
            deleted += target
                .connector
                .delete_items(collection, items)
                .await
                .map_err(|e| e.to_string())?;
            remaining += target
                .connector
                .held_items(collection, items)
                .await
                .map_err(|e| e.to_string())?;
        }
        if remaining > 0 {
            return Err(format!(
                "{remaining} derivatives decided for erasure are still held"
            ));
        }
        if target.owns_lineage {
            for (collection, items) in &by_collection {
                let ids: Vec<String> = items.iter().map(|i| i.item_id.clone()).collect();
                self.store
                    .mark_items_deleted(&target.lineage_store, collection, &ids, crate::now())
                    .await
                    .map_err(|e| e.to_string())?;
            }
            let refs: Vec<String> = due.iter().map(|d| d.reference.clone()).collect();
            self.store
                .derivatives_erased(&record.id, &refs, crate::now())
                .await
                .map_err(|e| e.to_string())?;
        }
        let own = due.iter().filter(|d| d.own).count();
        Ok(serde_json::json!({
            "own": own,
            "others_deleted": deleted,
            "others_remaining": remaining,
        }))
    }
}

/// What replaying one tombstone did to one store.
#[derive(Debug, Clone, Serialize)]
pub struct Replayed {
    pub request_id: String,
    pub target: String,
    pub report: Result<PurgeReport, String>,
}

impl Worker {
    /// Applies every erasure completed since `since` again, to every store it covered, as after
    /// restoring the stores from a backup taken at `since`. Lineage ids are used whether or not
    /// they were marked deleted: the restored store has them back.
    pub async fn replay(
        &self,
        since: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<Replayed>, crate::state::StoreError> {
        let mut replayed = Vec::new();
        for tombstone in self.store.tombstones_since(since).await? {
            let subjects = Subjects::new(
                &tombstone.tenant,
                tombstone.keys(),
                Arc::clone(&self.audit_key),
            );
            let targets: Vec<String> = tombstone.scope["targets"]
                .as_array()
                .map(|t| {
                    t.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            for target in targets {
                let report = match self.connectors.get(&target) {
                    None => Err(format!("no connector for {target} in this configuration")),
                    Some(target) => {
                        let lineage = self
                            .store
                            .lineage_items(
                                &tombstone.tenant,
                                &target.lineage_store,
                                subjects.names(),
                                true,
                            )
                            .await?;
                        target
                            .connector
                            .purge(&subjects, &lineage)
                            .await
                            .map_err(|e| e.to_string())
                    }
                };
                let result = match &report {
                    Ok(r) if r.remaining == 0 => "ok",
                    _ => "failed",
                };
                self.store
                    .append_audit(AuditEntry {
                        at: crate::now(),
                        tenant: Some(tombstone.tenant.clone()),
                        actor: self.id.clone(),
                        action: "erasure.replay".into(),
                        request_id: tombstone.request_id.clone(),
                        subject_ref: None,
                        target: target.clone(),
                        target_ref: Some(tombstone.request_id.clone()),
                        result: result.into(),
                        attempt: 1,
                    })
                    .await?;
                replayed.push(Replayed {
                    request_id: tombstone.request_id.clone(),
                    target,
                    report,
                });
            }
        }
        Ok(replayed)
    }
}

#[cfg(test)]
mod tests;
