//! The SQL both backends share. The statements are written once, in the subset of SQL that
//! PostgreSQL and SQLite both accept (`$N` placeholders, `ON CONFLICT`); each backend supplies
//! how it opens a write transaction and how it locks the audit head.

/// Implements [`Store`](super::Store) for `$store` over database `$db`. `$store` must have
/// `pool: sqlx::Pool<$db>`, `async fn write_tx(&self)` and `const LOCK_AUDIT_HEAD: &str`.
macro_rules! impl_store {
    ($store:ty, $db:ty) => {
        mod shared_sql {
            use std::collections::{BTreeMap, BTreeSet};

            use async_trait::async_trait;
            use chrono::{DateTime, Utc};
            use lethe_policy::audit::{seal, AuditEntry, AuditRecord, ChainHead, Links, TenantLink};
            use lethe_policy::progress::{progress, verification_due, Attempt, JobState, Verification};
            use lethe_policy::{Action, ConsentGrant, ErasureEvent, ErasureState, LegalHold, RetentionPolicy, SubjectPolicy, SubjectState, SubjectStatus};
            use sqlx::types::Json;
            use sqlx::Row as _;

            use super::*;
            use crate::state::{deadline, Closure, DeadlineExtension, Decision, Derivative, Derived, DueWindow, Edge, ItemKey, Rejection, ErasureFilter, ErasureRecord, MAX_EXTENSION_MONTHS, ErasureStats, ConsoleSession, ExpiredItem, Feed, FeedEvent, GovernedFlip, HoldRecord, PendingFlip, SignedHead, ItemRecord, JobOutcome, PolicyChange, PurgeJob, RetentionVersion, Store, StoreError, Tombstone};

            crate::state::derivatives::derivative_sql!($db);

            type Row = <$db as sqlx::Database>::Row;
            type Tx = sqlx::Transaction<'static, $db>;

            macro_rules! select_grants {
                () => {
                    "SELECT id, tenant, subject, purpose, category, actions, granted_at, expires_at, revoked_at, policy_version, source FROM consent_grants "
                };
            }
            macro_rules! select_holds {
                () => {
                    "SELECT id, tenant, subject, reason, placed_at, placed_by, released_at, released_by FROM legal_holds "
                };
            }

            fn grant_from_row(row: &Row) -> Result<ConsentGrant, StoreError> {
                let actions: Json<BTreeSet<Action>> = row.try_get("actions")?;
                Ok(ConsentGrant {
                    id: row.try_get("id")?,
                    tenant: row.try_get("tenant")?,
                    subject: row.try_get("subject")?,
                    purpose: row.try_get("purpose")?,
                    category: row.try_get("category")?,
                    actions: actions.0,
                    granted_at: row.try_get("granted_at")?,
                    expires_at: row.try_get("expires_at")?,
                    revoked_at: row.try_get("revoked_at")?,
                    policy_version: row.try_get("policy_version")?,
                    source: row.try_get("source")?,
                })
            }

            fn hold_from_row(row: &Row) -> Result<HoldRecord, StoreError> {
                Ok(HoldRecord {
                    hold: LegalHold {
                        id: row.try_get("id")?,
                        tenant: row.try_get("tenant")?,
                        subject: row.try_get("subject")?,
                        reason: row.try_get("reason")?,
                        placed_at: row.try_get("placed_at")?,
                        released_at: row.try_get("released_at")?,
                    },
                    placed_by: row.try_get("placed_by")?,
                    released_by: row.try_get("released_by")?,
                })
            }

            fn audit_from_row(row: &Row) -> Result<AuditRecord, StoreError> {
                let tenant_seq: Option<i64> = row.try_get("tenant_seq")?;
                let tenant_chain = match tenant_seq {
                    Some(seq) => Some(TenantLink {
                        seq,
                        prev_hash: row.try_get("tenant_prev_hash")?,
                        hash: row.try_get("tenant_hash")?,
                    }),
                    None => None,
                };
                Ok(AuditRecord {
                    seq: row.try_get("seq")?,
                    tenant_chain,
                    entry: AuditEntry {
                        at: row.try_get("at")?,
                        tenant: row.try_get("tenant")?,
                        actor: row.try_get("actor")?,
                        action: row.try_get("action")?,
                        request_id: row.try_get("request_id")?,
                        subject_ref: row.try_get("subject_ref")?,
                        target: row.try_get("target")?,
                        target_ref: row.try_get("target_ref")?,
                        result: row.try_get("result")?,
                        attempt: row.try_get("attempt")?,
                    },
                    prev_hash: row.try_get("prev_hash")?,
                    hash: row.try_get("hash")?,
                    legacy_hash: row.try_get("legacy_hash")?,
                })
            }

            /// Seals `entry` after the current head, inside the caller's transaction, with the
            /// head locked so that concurrent appends queue instead of forking the chain. Links are
            /// keyed with the audit key, always: a chain not keyed (written before links were, or
            /// marked so since) or keyed with another key takes nothing more, and with it no
            /// change (each is written with its event).
            async fn append_in(tx: &mut Tx, key: &std::sync::OnceLock<Vec<u8>>, entry: AuditEntry) -> Result<AuditRecord, StoreError> {
                let key = key.get().ok_or(StoreError::NoSubjectKey)?;
                let head = sqlx::query(<$store>::LOCK_AUDIT_HEAD).fetch_one(&mut **tx).await?;
                let version: i32 = head.try_get("chain_version")?;
                let kept_check: Option<String> = head.try_get("key_check")?;
                let head = ChainHead { seq: head.try_get("seq")?, hash: head.try_get("hash")? };
                if version != crate::state::KEYED_CHAIN {
                    return Err(StoreError::AuditUnkeyed);
                }
                let check = lethe_policy::audit::key_check(key);
                match kept_check {
                    Some(kept) if kept != check => return Err(StoreError::WrongAuditKey),
                    Some(_) => {}
                    None => {
                        sqlx::query("UPDATE audit_chain SET key_check = $1 WHERE id = 1")
                            .bind(&check)
                            .execute(&mut **tx)
                            .await?;
                    }
                }
                let links = Links::Keyed(key);
                // The whole chain's head is locked: the tenant's head cannot move meanwhile.
                let tenant_head = match &entry.tenant {
                    Some(tenant) => tenant_head_in(&mut **tx, tenant).await?,
                    None => ChainHead::default(),
                };
                let record = seal(links, &head, &tenant_head, entry);
                let e = &record.entry;
                let link = record.tenant_chain.as_ref();
                sqlx::query(
                    "INSERT INTO audit_events (seq, at, tenant, actor, action, request_id, subject_ref, target, target_ref, result, attempt, prev_hash, hash, tenant_seq, tenant_prev_hash, tenant_hash)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
                )
                .bind(record.seq)
                .bind(e.at)
                .bind(&e.tenant)
                .bind(&e.actor)
                .bind(&e.action)
                .bind(&e.request_id)
                .bind(&e.subject_ref)
                .bind(&e.target)
                .bind(&e.target_ref)
                .bind(&e.result)
                .bind(e.attempt)
                .bind(&record.prev_hash)
                .bind(&record.hash)
                .bind(link.map(|l| l.seq))
                .bind(link.map(|l| l.prev_hash.clone()))
                .bind(link.map(|l| l.hash.clone()))
                .execute(&mut **tx)
                .await?;
                if let (Some(tenant), Some(link)) = (&e.tenant, link) {
                    sqlx::query(
                        "INSERT INTO audit_tenant_heads (tenant, seq, hash) VALUES ($1, $2, $3)
                         ON CONFLICT (tenant) DO UPDATE SET seq = excluded.seq, hash = excluded.hash",
                    )
                    .bind(tenant)
                    .bind(link.seq)
                    .bind(&link.hash)
                    .execute(&mut **tx)
                    .await?;
                }
                sqlx::query("UPDATE audit_chain SET seq = $1, hash = $2 WHERE id = 1")
                    .bind(record.seq)
                    .bind(&record.hash)
                    .execute(&mut **tx)
                    .await?;
                Ok(record)
            }

            /// The head of a tenant's chain (the genesis hash before its first event).
            async fn tenant_head_in<'e, E>(executor: E, tenant: &str) -> Result<ChainHead, StoreError>
            where
                E: sqlx::Executor<'e, Database = $db>,
            {
                let row = sqlx::query("SELECT seq, hash FROM audit_tenant_heads WHERE tenant = $1")
                    .bind(tenant)
                    .fetch_optional(executor)
                    .await?;
                match row {
                    Some(row) => Ok(ChainHead { seq: row.try_get("seq")?, hash: row.try_get("hash")? }),
                    None => Ok(ChainHead::default()),
                }
            }

            /// Commits `tx` and tells every cache: first the other replicas (inside the
            /// transaction, so they hear of it only if it commits), then this process.
            async fn commit_change(store: &$store, tx: Tx, change: PolicyChange) -> Result<(), StoreError> {
                commit_changes(store, tx, vec![change]).await
            }

            async fn commit_changes(store: &$store, mut tx: Tx, changes: Vec<PolicyChange>) -> Result<(), StoreError> {
                for change in &changes {
                    <$store>::notify(&mut tx, change).await?;
                }
                tx.commit().await?;
                for change in changes {
                    store.feed.publish(FeedEvent::Changed(change));
                }
                Ok(())
            }

            const ERASURE_COLUMNS: &str = "id, tenant, subject, aliases, ticket, reason, state, requested_by, requested_at, due_at, approvals, suppressed_at, completed_at, updated_at, extended_months, extension_reason, extended_by, extended_at, rejection_reason, rejected_by, rejected_at";

            /// Adds to `select` the condition that a request's deadline falls in `due`.
            fn push_due(select: &mut sqlx::QueryBuilder<$db>, due: &DueWindow) {
                if let Some(from) = due.from {
                    select.push(" AND due_at >= ").push_bind(from);
                }
                if let Some(to) = due.to {
                    select.push(" AND due_at < ").push_bind(to);
                }
            }

            fn erasure_from_row(row: &Row) -> Result<ErasureRecord, StoreError> {
                let state: String = row.try_get("state")?;
                let aliases: Json<Vec<String>> = row.try_get("aliases")?;
                let approvals: Json<Vec<String>> = row.try_get("approvals")?;
                Ok(ErasureRecord {
                    id: row.try_get("id")?,
                    tenant: row.try_get("tenant")?,
                    subject: row.try_get("subject")?,
                    aliases: aliases.0,
                    ticket: row.try_get("ticket")?,
                    reason: row.try_get("reason")?,
                    state: ErasureState::parse(&state).ok_or_else(|| StoreError::Corrupt(format!("unknown erasure state {state:?}")))?,
                    requested_by: row.try_get("requested_by")?,
                    requested_at: row.try_get("requested_at")?,
                    deadline: row.try_get("due_at")?,
                    approvals: approvals.0,
                    suppressed_at: row.try_get("suppressed_at")?,
                    completed_at: row.try_get("completed_at")?,
                    updated_at: row.try_get("updated_at")?,
                    extension: extension_from_row(row)?,
                    rejection: rejection_from_row(row)?,
                })
            }

            fn rejection_from_row(row: &Row) -> Result<Option<Rejection>, StoreError> {
                let reason: Option<String> = row.try_get("rejection_reason")?;
                let by: Option<String> = row.try_get("rejected_by")?;
                let at: Option<DateTime<Utc>> = row.try_get("rejected_at")?;
                Ok(match (reason, by, at) {
                    (Some(reason), Some(by), Some(at)) => Some(Rejection { reason, by, at }),
                    (None, None, None) => None,
                    _ => return Err(StoreError::Corrupt("a rejection without its reason, author or date".into())),
                })
            }

            fn extension_from_row(row: &Row) -> Result<Option<DeadlineExtension>, StoreError> {
                let months: i32 = row.try_get("extended_months")?;
                let Ok(months @ 1..) = u32::try_from(months) else {
                    return Ok(None);
                };
                let (Some(reason), Some(by), Some(at)) = (row.try_get("extension_reason")?, row.try_get("extended_by")?, row.try_get("extended_at")?) else {
                    return Err(StoreError::Corrupt("an extended deadline without its reason, author or date".into()));
                };
                Ok(Some(DeadlineExtension { months, reason, by, at }))
            }

            /// Moves a request along the state machine; an illegal step is refused, never written.
            fn step(record: &mut ErasureRecord, event: ErasureEvent, at: DateTime<Utc>) -> Result<(), StoreError> {
                record.state = lethe_policy::erasure::transition(record.state, event)
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?;
                record.updated_at = at;
                Ok(())
            }

            async fn save_erasure(tx: &mut Tx, record: &ErasureRecord) -> Result<(), StoreError> {
                sqlx::query("UPDATE erasure_requests SET state = $1, approvals = $2, suppressed_at = $3, completed_at = $4, updated_at = $5, subject = $7, aliases = $8 WHERE id = $6")
                    .bind(record.state.as_str())
                    .bind(Json(&record.approvals))
                    .bind(record.suppressed_at)
                    .bind(record.completed_at)
                    .bind(record.updated_at)
                    .bind(&record.id)
                    .bind(&record.subject)
                    .bind(Json(&record.aliases))
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            }

            /// Whether an active hold covers any key of the request.
            async fn held(tx: &mut Tx, record: &ErasureRecord, at: DateTime<Utc>) -> Result<bool, StoreError> {
                let sql = concat!(select_holds!(), "WHERE tenant = $1 AND released_at IS NULL");
                let rows = sqlx::query(sql).bind(&record.tenant).fetch_all(&mut **tx).await?;
                let holds: Vec<LegalHold> = rows.iter().map(hold_from_row).map(|h| h.map(|h| h.hold)).collect::<Result<_, _>>()?;
                Ok(record.keys().any(|key| lethe_policy::hold::is_held(&holds, &record.tenant, key, at)))
            }

            /// The flip, inside the caller's transaction: every key suppressed in a new epoch,
            /// everything derived from the subject's items (its closure) hidden, the request
            /// suppressed, its purge jobs released. Returns the changes to broadcast.
            /// Where governed databases must apply the flip too, the request is `propagating`
            /// until each has ([`Store::flip_applied`]), and says `suppressed` only then.
            async fn flip(tx: &mut Tx, subject_key: &std::sync::OnceLock<Vec<u8>>, record: &mut ErasureRecord, closure: Closure, governed: &[String], at: DateTime<Utc>) -> Result<Vec<PolicyChange>, StoreError> {
                let mut changes = Vec::new();
                for key in record.keys() {
                    sqlx::query(
                        "INSERT INTO subjects (tenant, subject, status, epoch, created_at, updated_at) VALUES ($1, $2, 'suppressed', 1, $3, $3)
                         ON CONFLICT (tenant, subject) DO UPDATE SET status = 'suppressed', epoch = subjects.epoch + 1, updated_at = $3",
                    )
                    .bind(&record.tenant)
                    .bind(key)
                    .bind(at)
                    .execute(&mut **tx)
                    .await?;
                    changes.push(PolicyChange::of_subject(&record.tenant, key));
                }
                if governed.is_empty() {
                    step(record, ErasureEvent::Suppress, at)?;
                    record.suppressed_at = Some(at);
                } else {
                    step(record, ErasureEvent::FlipPending, at)?;
                    for database in governed {
                        sqlx::query("INSERT INTO erasure_flips (request_id, database) VALUES ($1, $2) ON CONFLICT (request_id, database) DO NOTHING")
                            .bind(&record.id)
                            .bind(database)
                            .execute(&mut **tx)
                            .await?;
                    }
                }
                save_erasure(tx, record).await?;
                sqlx::query("UPDATE purge_jobs SET state = 'pending', next_attempt_at = $1, updated_at = $1 WHERE request_id = $2 AND state = 'waiting'")
                    .bind(at)
                    .bind(&record.id)
                    .execute(&mut **tx)
                    .await?;
                if extend_closure(tx, subject_key, record, closure, at).await? {
                    changes.push(PolicyChange::of_derivatives(&record.tenant));
                }
                Ok(changes)
            }

            /// Holds or flips a request that has just become authorised.
            async fn hold_or_flip(
                tx: &mut Tx,
                subject_key: &std::sync::OnceLock<Vec<u8>>,
                record: &mut ErasureRecord,
                closure: Closure,
                governed: &[String],
                at: DateTime<Utc>,
                audit: &AuditEntry,
            ) -> Result<Vec<PolicyChange>, StoreError> {
                if held(tx, record, at).await? {
                    step(record, ErasureEvent::HoldPlaced, at)?;
                    save_erasure(tx, record).await?;
                    append_in(tx, subject_key, AuditEntry { action: "erasure.hold".into(), target: "erasure".into(), target_ref: Some(record.id.clone()), ..audit.clone() }).await?;
                    return Ok(Vec::new());
                }
                let changes = flip(tx, subject_key, record, closure, governed, at).await?;
                // `erasure.suppress` once the flip holds everywhere; until then it is on its way.
                let action = if record.state == ErasureState::Suppressed { "erasure.suppress" } else { "erasure.flip" };
                append_in(tx, subject_key, AuditEntry { action: action.into(), target: "erasure".into(), target_ref: Some(record.id.clone()), ..audit.clone() }).await?;
                Ok(changes)
            }

            fn strictest(a: SubjectStatus, b: SubjectStatus) -> SubjectStatus {
                let rank = |s: SubjectStatus| match s {
                    SubjectStatus::Active => 0,
                    SubjectStatus::Suppressed => 1,
                    SubjectStatus::Erased => 2,
                };
                if rank(b) > rank(a) { b } else { a }
            }

            /// The name the store keeps `subject` under once its erasure completed.
            fn forgotten_name(key: &std::sync::OnceLock<Vec<u8>>, tenant: &str, subject: &str) -> Result<String, StoreError> {
                let key = key.get().ok_or(StoreError::NoSubjectKey)?;
                Ok(lethe_policy::audit::forgotten(key, tenant, subject))
            }

            /// Forgets an erased subject's key, inside the completing transaction: every row that
            /// names it names its reference instead. Requests still running keep their keys until
            /// they complete: their purges need them.
            async fn forget(tx: &mut Tx, tenant: &str, key: &str, name: &str, at: DateTime<Utc>) -> Result<(), StoreError> {
                sqlx::query(
                    "INSERT INTO subjects (tenant, subject, status, epoch, created_at, updated_at)
                     SELECT tenant, $3, 'erased', epoch, created_at, $4 FROM subjects WHERE tenant = $1 AND subject = $2
                     ON CONFLICT (tenant, subject) DO UPDATE SET status = 'erased', updated_at = $4,
                         epoch = CASE WHEN excluded.epoch > subjects.epoch THEN excluded.epoch ELSE subjects.epoch END",
                )
                .bind(tenant)
                .bind(key)
                .bind(name)
                .bind(at)
                .execute(&mut **tx)
                .await?;
                for table in ["consent_grants", "legal_holds", "items", "threads"] {
                    let sql = sqlx::AssertSqlSafe(format!("UPDATE {table} SET subject = $3 WHERE tenant = $1 AND subject = $2"));
                    sqlx::query(sql).bind(tenant).bind(key).bind(name).execute(&mut **tx).await?;
                }
                // The store's own names of the subject's items may hold its key too (a LangGraph
                // namespace, an id the client chose): those are renamed alike. A replay finds such
                // items again by their stamps and namespaces, not by these ids.
                let rows = sqlx::query("SELECT store, collection, item_id, source_ref, parents FROM items WHERE tenant = $1 AND subject = $2")
                    .bind(tenant)
                    .bind(name)
                    .fetch_all(&mut **tx)
                    .await?;
                let mut renamed = Vec::new();
                for row in &rows {
                    let item_id: String = row.try_get("item_id")?;
                    let source_ref: Option<String> = row.try_get("source_ref")?;
                    let parents: Json<Vec<String>> = row.try_get("parents")?;
                    let holds = |text: &str| text.contains(key);
                    if !holds(&item_id) && !source_ref.as_deref().is_some_and(holds) && !parents.0.iter().any(|p| holds(p)) {
                        continue;
                    }
                    let (store, collection): (String, String) = (row.try_get("store")?, row.try_get("collection")?);
                    sqlx::query("UPDATE items SET item_id = $4, source_ref = $5, parents = $6 WHERE store = $1 AND collection = $2 AND item_id = $3")
                        .bind(&store)
                        .bind(&collection)
                        .bind(&item_id)
                        .bind(item_id.replace(key, name))
                        .bind(source_ref.map(|r| r.replace(key, name)))
                        .bind(Json(parents.0.iter().map(|p| p.replace(key, name)).collect::<Vec<_>>()))
                        .execute(&mut **tx)
                        .await?;
                    if holds(&item_id) {
                        renamed.push((ItemKey { store, collection, item: item_id.clone() }, item_id.replace(key, name)));
                    }
                }
                rename_in_lineage(tx, tenant, &renamed).await?;
                forget_in_lineage(tx, tenant, key, name).await?;
                <$store>::forget_shared(tx, tenant, key, name).await?;
                sqlx::query("UPDATE threads SET thread_id = REPLACE(thread_id, $2, $3) WHERE tenant = $1 AND subject = $3")
                    .bind(tenant)
                    .bind(key)
                    .bind(name)
                    .execute(&mut **tx)
                    .await?;
                sqlx::query(
                    "INSERT INTO processors (tenant, subject, processor, first_at, last_at)
                     SELECT tenant, $3, processor, first_at, last_at FROM processors WHERE tenant = $1 AND subject = $2
                     ON CONFLICT (tenant, subject, processor) DO UPDATE SET
                         first_at = CASE WHEN excluded.first_at < processors.first_at THEN excluded.first_at ELSE processors.first_at END,
                         last_at = CASE WHEN excluded.last_at > processors.last_at THEN excluded.last_at ELSE processors.last_at END",
                )
                .bind(tenant)
                .bind(key)
                .bind(name)
                .execute(&mut **tx)
                .await?;
                sqlx::query("DELETE FROM processors WHERE tenant = $1 AND subject = $2").bind(tenant).bind(key).execute(&mut **tx).await?;
                sqlx::query("DELETE FROM subjects WHERE tenant = $1 AND subject = $2").bind(tenant).bind(key).execute(&mut **tx).await?;
                Ok(())
            }

            /// Forgets every key of a completing request (see `forget`); the record then names the
            /// subject and its aliases by reference. Answers the changes to broadcast.
            async fn forget_request(tx: &mut Tx, subject_key: &std::sync::OnceLock<Vec<u8>>, record: &mut ErasureRecord, at: DateTime<Utc>) -> Result<Vec<PolicyChange>, StoreError> {
                let mut changes = Vec::new();
                let mut names = Vec::new();
                for key in record.keys() {
                    let name = forgotten_name(subject_key, &record.tenant, key)?;
                    forget(tx, &record.tenant, key, &name, at).await?;
                    changes.push(PolicyChange::of_subject(&record.tenant, key));
                    names.push(name);
                }
                let mut names = names.into_iter();
                record.subject = names.next().unwrap_or_default();
                record.aliases = names.collect();
                Ok(changes)
            }

            /// Moves a request on from where its purge jobs and its derivatives stand, inside the
            /// caller's transaction: once every job is done, what the closure reaches now is
            /// recorded and verification looks for the subject's live lineage rows and for
            /// derivatives decided for erasure but not verified gone, in every purged store; a
            /// clean request whose derivatives are all decided completes (its keys forgotten, a
            /// tombstone kept). Answers the changes to broadcast and whether it completed.
            async fn advance(
                tx: &mut Tx,
                subject_key: &std::sync::OnceLock<Vec<u8>>,
                closure: Closure,
                record: &mut ErasureRecord,
                now: DateTime<Utc>,
                audit: &AuditEntry,
            ) -> Result<(Vec<PolicyChange>, bool), StoreError> {
                let rows = sqlx::query("SELECT target, state FROM purge_jobs WHERE request_id = $1 AND state <> 'cancelled'").bind(&record.id).fetch_all(&mut **tx).await?;
                let jobs: Vec<(String, JobState)> = rows
                    .iter()
                    .map(|r| {
                        let state: String = r.try_get("state")?;
                        let state = JobState::parse(&state).ok_or_else(|| StoreError::Corrupt(format!("purge job state {state:?}")))?;
                        Ok((r.try_get("target")?, state))
                    })
                    .collect::<Result<_, StoreError>>()?;
                let mut changes = Vec::new();
                let mut found = Verification::default();
                if verification_due(&jobs) {
                    // A write that landed after the flip on a replica slow to hear of it may have
                    // derived from the subject since: the closure is looked at again.
                    if extend_closure(tx, subject_key, record, closure, now).await? {
                        changes.push(PolicyChange::of_derivatives(&record.tenant));
                    }
                    for (target, _) in &jobs {
                        let store_name = target_store(target);
                        for key in record.keys() {
                            let live: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM items WHERE tenant = $1 AND subject = $2 AND store = $3 AND deleted_at IS NULL")
                                .bind(&record.tenant)
                                .bind(key)
                                .bind(store_name)
                                .fetch_one(&mut **tx)
                                .await?;
                            if live > 0 {
                                found.unverified.insert(target.clone());
                            }
                        }
                    }
                    let targets: Vec<String> = jobs.iter().map(|(t, _)| t.clone()).collect();
                    let (unverified, undecided) = derivatives_left(tx, &record.id, &targets).await?;
                    found.unverified.extend(unverified);
                    found.undecided = undecided;
                }
                let next = progress(record.state, &jobs, &found).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                for event in &next.events {
                    step(record, *event, now)?;
                }
                if next.completed() {
                    record.completed_at = Some(now);
                    // From here on the store knows the subject only by its reference.
                    changes.extend(forget_request(tx, subject_key, record, now).await?);
                    let scope = serde_json::json!({ "keys": record.keys().collect::<Vec<_>>(), "targets": jobs.iter().map(|(t, _)| t).collect::<Vec<_>>() });
                    sqlx::query("INSERT INTO tombstones (request_id, tenant, subject, scope, erased_at) VALUES ($1, $2, $3, $4, $5)")
                        .bind(&record.id)
                        .bind(&record.tenant)
                        .bind(&record.subject)
                        .bind(Json(scope))
                        .bind(now)
                        .execute(&mut **tx)
                        .await?;
                }
                for target in &next.rerun {
                    sqlx::query("UPDATE purge_jobs SET state = $1, next_attempt_at = $2, updated_at = $2 WHERE request_id = $3 AND target = $4")
                        .bind(JobState::Retrying.as_str())
                        .bind(now)
                        .bind(&record.id)
                        .bind(target)
                        .execute(&mut **tx)
                        .await?;
                }
                for action in &next.audit {
                    let event = AuditEntry { action: (*action).into(), target: "erasure".into(), target_ref: Some(record.id.clone()), ..audit.clone() };
                    append_in(tx, subject_key, event).await?;
                }
                save_erasure(tx, record).await?;
                Ok((changes, next.completed()))
            }

            /// After a completion: the erased keys' old row versions are scrubbed from the files.
            async fn scrubbed(store: &$store) {
                if let Err(e) = store.scrub().await {
                    tracing::warn!(error = %e, "the state store's files may still hold the erased keys until its next scrub");
                }
            }

            fn status_of(text: &str) -> Result<SubjectStatus, StoreError> {
                SubjectStatus::parse(text).ok_or_else(|| StoreError::Corrupt(format!("unknown subject status {text:?}")))
            }

            #[async_trait]
            impl Store for $store {
                fn backend(&self) -> &'static str {
                    <$store>::BACKEND
                }

                async fn migrate(&self) -> Result<Vec<i64>, StoreError> {
                    let applied = self.run_migrations().await?;
                    // Requests filed before deadlines were kept (migration 6) get the default
                    // month; looked for every time, so an interrupted start finishes the job.
                    let rows = sqlx::query("SELECT id, requested_at FROM erasure_requests WHERE due_at IS NULL").fetch_all(&self.pool).await?;
                    for row in &rows {
                        let requested: DateTime<Utc> = row.try_get("requested_at")?;
                        sqlx::query("UPDATE erasure_requests SET due_at = $1 WHERE id = $2")
                            .bind(deadline(requested, 1))
                            .bind(row.try_get::<String, _>("id")?)
                            .execute(&self.pool)
                            .await?;
                    }
                    Ok(applied)
                }

                async fn ping(&self) -> Result<(), StoreError> {
                    sqlx::query("SELECT 1").execute(&self.pool).await?;
                    Ok(())
                }

                async fn generated_secret(&self, name: &str, fresh: &[u8], at: DateTime<Utc>) -> Result<Vec<u8>, StoreError> {
                    sqlx::query("INSERT INTO generated_secrets (name, value, created_at) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING")
                        .bind(name)
                        .bind(fresh)
                        .bind(at)
                        .execute(&self.pool)
                        .await?;
                    Ok(sqlx::query_scalar("SELECT value FROM generated_secrets WHERE name = $1")
                        .bind(name)
                        .fetch_one(&self.pool)
                        .await?)
                }

                fn use_subject_key(&self, key: &[u8]) {
                    // The first key stays: a store is opened with one configuration.
                    let _ = self.subject_key.set(key.to_vec());
                }

                async fn subject(&self, tenant: &str, subject: &str) -> Result<Option<SubjectState>, StoreError> {
                    let name = forgotten_name(&self.subject_key, tenant, subject)?;
                    let rows = sqlx::query("SELECT status, epoch FROM subjects WHERE tenant = $1 AND subject IN ($2, $3)")
                        .bind(tenant)
                        .bind(subject)
                        .bind(&name)
                        .fetch_all(&self.pool)
                        .await?;
                    // Under its key, and under its reference once an erasure of it completed: the
                    // stricter state and the later epoch decide.
                    let mut state: Option<SubjectState> = None;
                    for row in &rows {
                        let found = SubjectState { status: status_of(&row.try_get::<String, _>("status")?)?, epoch: row.try_get("epoch")? };
                        state = Some(match state {
                            None => found,
                            Some(seen) => SubjectState { status: strictest(seen.status, found.status), epoch: seen.epoch.max(found.epoch) },
                        });
                    }
                    Ok(state)
                }

                fn feed(&self) -> &std::sync::Arc<Feed> {
                    &self.feed
                }

                async fn subject_policy(&self, tenant: &str, subject: &str) -> Result<SubjectPolicy, StoreError> {
                    let state = self.subject(tenant, subject).await?.unwrap_or_default();
                    let grants = self.grants(tenant, subject).await?;
                    Ok(SubjectPolicy { state, grants })
                }

                async fn create_grant(&self, grant: &ConsentGrant, audit: AuditEntry) -> Result<(), StoreError> {
                    let mut tx = self.write_tx().await?;
                    sqlx::query(
                        "INSERT INTO subjects (tenant, subject, status, epoch, created_at, updated_at)
                         VALUES ($1, $2, 'active', 0, $3, $3) ON CONFLICT (tenant, subject) DO NOTHING",
                    )
                    .bind(&grant.tenant)
                    .bind(&grant.subject)
                    .bind(grant.granted_at)
                    .execute(&mut *tx)
                    .await?;
                    let name = forgotten_name(&self.subject_key, &grant.tenant, &grant.subject)?;
                    let statuses: Vec<String> = sqlx::query_scalar("SELECT status FROM subjects WHERE tenant = $1 AND subject IN ($2, $3)")
                        .bind(&grant.tenant)
                        .bind(&grant.subject)
                        .bind(&name)
                        .fetch_all(&mut *tx)
                        .await?;
                    for status in &statuses {
                        if status_of(status)? != SubjectStatus::Active {
                            return Err(StoreError::SubjectNotActive);
                        }
                    }
                    sqlx::query(
                        "INSERT INTO consent_grants (id, tenant, subject, purpose, category, actions, granted_at, expires_at, revoked_at, policy_version, source)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                    )
                    .bind(&grant.id)
                    .bind(&grant.tenant)
                    .bind(&grant.subject)
                    .bind(&grant.purpose)
                    .bind(&grant.category)
                    .bind(Json(&grant.actions))
                    .bind(grant.granted_at)
                    .bind(grant.expires_at)
                    .bind(grant.revoked_at)
                    .bind(grant.policy_version)
                    .bind(&grant.source)
                    .execute(&mut *tx)
                    .await?;
                    append_in(&mut tx, &self.subject_key, audit).await?;
                    let change = PolicyChange::of_subject(&grant.tenant, &grant.subject);
                    commit_change(self, tx, change).await
                }

                async fn grant(&self, id: &str) -> Result<ConsentGrant, StoreError> {
                    let sql = concat!(select_grants!(), "WHERE id = $1");
                    let row = sqlx::query(sql).bind(id).fetch_one(&self.pool).await?;
                    grant_from_row(&row)
                }

                async fn revoke_grant(&self, id: &str, at: DateTime<Utc>, audit: AuditEntry) -> Result<ConsentGrant, StoreError> {
                    let mut tx = self.write_tx().await?;
                    let updated = sqlx::query("UPDATE consent_grants SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
                        .bind(at)
                        .bind(id)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                    let sql = concat!(select_grants!(), "WHERE id = $1");
                    let grant = grant_from_row(&sqlx::query(sql).bind(id).fetch_one(&mut *tx).await?)?;
                    if updated == 0 {
                        return Err(StoreError::AlreadyRevoked);
                    }
                    let sql = concat!(select_grants!(), "WHERE tenant = $1 AND subject = $2");
                    let rows = sqlx::query(sql).bind(&grant.tenant).bind(&grant.subject).fetch_all(&mut *tx).await?;
                    let grants: Vec<ConsentGrant> = rows.iter().map(grant_from_row).collect::<Result<_, _>>()?;
                    let still_covered =
                        lethe_policy::consent::coverage_end(&grants, &grant.purpose, &grant.category, Action::Store, at).is_some();
                    if !still_covered {
                        sqlx::query(
                            "UPDATE items SET expires_at = $1 WHERE tenant = $2 AND subject = $3 AND purpose = $4 AND category = $5
                             AND deleted_at IS NULL AND expires_at > $1",
                        )
                        .bind(at)
                        .bind(&grant.tenant)
                        .bind(&grant.subject)
                        .bind(&grant.purpose)
                        .bind(&grant.category)
                        .execute(&mut *tx)
                        .await?;
                    }
                    append_in(&mut tx, &self.subject_key, audit).await?;
                    let change = PolicyChange::of_subject(&grant.tenant, &grant.subject);
                    commit_change(self, tx, change).await?;
                    Ok(grant)
                }

                async fn grants(&self, tenant: &str, subject: &str) -> Result<Vec<ConsentGrant>, StoreError> {
                    let sql = concat!(select_grants!(), "WHERE tenant = $1 AND subject = $2 ORDER BY granted_at, id");
                    let rows = sqlx::query(sql).bind(tenant).bind(subject).fetch_all(&self.pool).await?;
                    rows.iter().map(grant_from_row).collect()
                }

                async fn retention(&self, tenant: &str) -> Result<Option<RetentionVersion>, StoreError> {
                    let row = sqlx::query(
                        "SELECT version, policy, created_at, created_by FROM retention_rule_sets
                         WHERE tenant = $1 ORDER BY version DESC LIMIT 1",
                    )
                    .bind(tenant)
                    .fetch_optional(&self.pool)
                    .await?;
                    row.map(|row| {
                        let policy: Json<RetentionPolicy> = row.try_get("policy")?;
                        Ok(RetentionVersion {
                            version: row.try_get("version")?,
                            policy: policy.0,
                            created_at: row.try_get("created_at")?,
                            created_by: row.try_get("created_by")?,
                        })
                    })
                    .transpose()
                }

                async fn known_subjects(&self) -> Result<Vec<(String, String)>, StoreError> {
                    let rows = sqlx::query("SELECT tenant, subject FROM subjects ORDER BY tenant, subject")
                        .fetch_all(&self.pool)
                        .await?;
                    rows.iter()
                        .map(|row| Ok((row.try_get("tenant")?, row.try_get("subject")?)))
                        .collect()
                }

                async fn retention_tenants(&self) -> Result<Vec<String>, StoreError> {
                    Ok(sqlx::query_scalar("SELECT DISTINCT tenant FROM retention_rule_sets ORDER BY tenant")
                        .fetch_all(&self.pool)
                        .await?)
                }

                async fn replace_retention(
                    &self,
                    tenant: &str,
                    policy: &RetentionPolicy,
                    at: DateTime<Utc>,
                    actor: &str,
                    audit: AuditEntry,
                ) -> Result<RetentionVersion, StoreError> {
                    let mut tx = self.write_tx().await?;
                    let last: Option<i64> = sqlx::query_scalar("SELECT MAX(version) FROM retention_rule_sets WHERE tenant = $1")
                        .bind(tenant)
                        .fetch_one(&mut *tx)
                        .await?;
                    let version = last.unwrap_or(0) + 1;
                    sqlx::query(
                        "INSERT INTO retention_rule_sets (tenant, version, policy, created_at, created_by) VALUES ($1, $2, $3, $4, $5)",
                    )
                    .bind(tenant)
                    .bind(version)
                    .bind(Json(policy))
                    .bind(at)
                    .bind(actor)
                    .execute(&mut *tx)
                    .await?;
                    append_in(&mut tx, &self.subject_key, AuditEntry { target_ref: Some(version.to_string()), ..audit }).await?;
                    commit_change(self, tx, PolicyChange::of(tenant, None)).await?;
                    Ok(RetentionVersion { version, policy: policy.clone(), created_at: at, created_by: actor.to_owned() })
                }

                async fn place_hold(&self, hold: &HoldRecord, audit: AuditEntry) -> Result<(), StoreError> {
                    let mut tx = self.write_tx().await?;
                    let h = &hold.hold;
                    sqlx::query(
                        "INSERT INTO legal_holds (id, tenant, subject, reason, placed_at, placed_by, released_at, released_by)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                    )
                    .bind(&h.id)
                    .bind(&h.tenant)
                    .bind(&h.subject)
                    .bind(&h.reason)
                    .bind(h.placed_at)
                    .bind(&hold.placed_by)
                    .bind(h.released_at)
                    .bind(&hold.released_by)
                    .execute(&mut *tx)
                    .await?;
                    append_in(&mut tx, &self.subject_key, audit).await?;
                    // Governed databases keep held rows from their sweep.
                    commit_change(self, tx, PolicyChange::of(&h.tenant, h.subject.as_deref())).await
                }

                async fn hold(&self, id: &str) -> Result<HoldRecord, StoreError> {
                    let sql = concat!(select_holds!(), "WHERE id = $1");
                    hold_from_row(&sqlx::query(sql).bind(id).fetch_one(&self.pool).await?)
                }

                async fn release_hold(&self, id: &str, at: DateTime<Utc>, actor: &str, audit: AuditEntry) -> Result<HoldRecord, StoreError> {
                    let mut tx = self.write_tx().await?;
                    let updated = sqlx::query("UPDATE legal_holds SET released_at = $1, released_by = $2 WHERE id = $3 AND released_at IS NULL")
                        .bind(at)
                        .bind(actor)
                        .bind(id)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                    let sql = concat!(select_holds!(), "WHERE id = $1");
                    let hold = hold_from_row(&sqlx::query(sql).bind(id).fetch_one(&mut *tx).await?)?;
                    if updated == 0 {
                        return Err(StoreError::AlreadyReleased);
                    }
                    append_in(&mut tx, &self.subject_key, audit.clone()).await?;
                    // Held erasures this hold covered continue, unless another hold still covers them.
                    let sql = sqlx::AssertSqlSafe(format!("SELECT {ERASURE_COLUMNS} FROM erasure_requests WHERE tenant = $1 AND state = 'held' ORDER BY requested_at"));
                    let rows = sqlx::query(sql).bind(&hold.hold.tenant).fetch_all(&mut *tx).await?;
                    let mut changes = vec![PolicyChange::of(&hold.hold.tenant, hold.hold.subject.as_deref())];
                    for row in &rows {
                        let mut record = erasure_from_row(row)?;
                        if held(&mut tx, &record, at).await? {
                            continue;
                        }
                        step(&mut record, ErasureEvent::HoldReleased, at)?;
                        let subject_ref = audit.subject_ref.clone();
                        let resumed = AuditEntry { subject_ref, ..audit.clone() };
                        changes.extend(hold_or_flip(&mut tx, &self.subject_key, &mut record, self.closure(), self.governed(), at, &resumed).await?);
                    }
                    commit_changes(self, tx, changes).await?;
                    Ok(hold)
                }

                async fn holds(&self, tenant: &str, subject: Option<&str>) -> Result<Vec<HoldRecord>, StoreError> {
                    let sql = concat!(
                        select_holds!(),
                        "WHERE tenant = $1 AND ($2 IS NULL OR subject IS NULL OR subject = $2) ORDER BY placed_at, id"
                    );
                    let rows = sqlx::query(sql).bind(tenant).bind(subject).fetch_all(&self.pool).await?;
                    rows.iter().map(hold_from_row).collect()
                }

                async fn create_erasure(&self, request: &ErasureRecord, targets: &[String], audit: AuditEntry) -> Result<(), StoreError> {
                    let mut tx = self.write_tx().await?;
                    sqlx::query(
                        "INSERT INTO erasure_requests (id, tenant, subject, aliases, ticket, reason, state, requested_by, requested_at, approvals, suppressed_at, completed_at, updated_at, due_at)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
                    )
                    .bind(&request.id)
                    .bind(&request.tenant)
                    .bind(&request.subject)
                    .bind(Json(&request.aliases))
                    .bind(&request.ticket)
                    .bind(&request.reason)
                    .bind(request.state.as_str())
                    .bind(&request.requested_by)
                    .bind(request.requested_at)
                    .bind(Json(&request.approvals))
                    .bind(request.suppressed_at)
                    .bind(request.completed_at)
                    .bind(request.updated_at)
                    .bind(request.deadline)
                    .execute(&mut *tx)
                    .await?;
                    for target in targets {
                        sqlx::query(
                            "INSERT INTO purge_jobs (id, request_id, target, state, attempts, next_attempt_at, updated_at) VALUES ($1, $2, $3, 'waiting', 0, $4, $4)",
                        )
                        .bind(format!("pj_{}", uuid::Uuid::new_v4().simple()))
                        .bind(&request.id)
                        .bind(target)
                        .bind(request.requested_at)
                        .execute(&mut *tx)
                        .await?;
                    }
                    append_in(&mut tx, &self.subject_key, audit).await?;
                    tx.commit().await?;
                    Ok(())
                }

                async fn erasures(&self, tenant: &str, filter: &ErasureFilter, offset: u32, limit: u32) -> Result<Vec<ErasureRecord>, StoreError> {
                    let mut select = sqlx::QueryBuilder::<$db>::new(format!("SELECT {ERASURE_COLUMNS} FROM erasure_requests WHERE tenant = "));
                    select.push_bind(tenant.to_owned());
                    if let Some(state) = filter.state {
                        select.push(" AND state = ").push_bind(state.to_string());
                    }
                                        if filter.open {
                        select.push(" AND state NOT IN ('completed', 'rejected')");
                    }
                    if let Some(due) = &filter.due {
                        push_due(&mut select, due);
                    }
                    select.push(" ORDER BY requested_at DESC, id DESC LIMIT ").push_bind(i64::from(limit));
                    select.push(" OFFSET ").push_bind(i64::from(offset));
                    let rows = select.build().fetch_all(&self.pool).await?;
                    rows.iter().map(erasure_from_row).collect()
                }

                async fn erasure_stats(&self, tenant: &str, overdue_at: DateTime<Utc>, since: DateTime<Utc>) -> Result<ErasureStats, StoreError> {
                    let mut stats = ErasureStats::default();
                    let rows = sqlx::query("SELECT state, count(*) AS n FROM erasure_requests WHERE tenant = $1 AND state NOT IN ('completed', 'rejected') GROUP BY state")
                        .bind(tenant)
                        .fetch_all(&self.pool)
                        .await?;
                    for row in &rows {
                        stats.open.insert(row.try_get("state")?, row.try_get("n")?);
                    }
                    stats.overdue = sqlx::query_scalar("SELECT count(*) FROM erasure_requests WHERE tenant = $1 AND state NOT IN ('completed', 'rejected') AND due_at < $2")
                        .bind(tenant)
                        .bind(overdue_at)
                        .fetch_one(&self.pool)
                        .await?;
                    let rows = sqlx::query("SELECT requested_at, suppressed_at, completed_at FROM erasure_requests WHERE tenant = $1 AND requested_at >= $2 AND suppressed_at IS NOT NULL")
                        .bind(tenant)
                        .bind(since)
                        .fetch_all(&self.pool)
                        .await?;
                                        for row in &rows {
                        let requested: DateTime<Utc> = row.try_get("requested_at")?;
                        let suppressed: Option<DateTime<Utc>> = row.try_get("suppressed_at")?;
                        let completed: Option<DateTime<Utc>> = row.try_get("completed_at")?;
                        stats.online_ms.extend(suppressed.map(|at| (at - requested).num_milliseconds()));
                        stats.completion_s.extend(completed.map(|at| (at - requested).num_seconds()));
                    }
                    Ok(stats)
                }

                async fn reject_erasure(&self, id: &str, rejection: &Rejection, audit: AuditEntry) -> Result<ErasureRecord, StoreError> {
                    let mut tx = self.write_tx().await?;
                    let sql = sqlx::AssertSqlSafe(format!("SELECT {ERASURE_COLUMNS} FROM erasure_requests WHERE id = $1{}", <$store>::FOR_UPDATE));
                    let mut record = erasure_from_row(&sqlx::query(sql).bind(id).fetch_one(&mut *tx).await?)?;
                    // Refused once flipped: a suppressed subject is never made readable again.
                    record.state = lethe_policy::erasure::transition(record.state, ErasureEvent::Reject)?;
                    record.updated_at = rejection.at;
                    save_erasure(&mut tx, &record).await?;
                    sqlx::query("UPDATE erasure_requests SET rejection_reason = $1, rejected_by = $2, rejected_at = $3 WHERE id = $4")
                        .bind(&rejection.reason)
                        .bind(&rejection.by)
                        .bind(rejection.at)
                        .bind(id)
                        .execute(&mut *tx)
                        .await?;
                    // Nothing was flipped, so nothing is purged: the jobs end here.
                    sqlx::query("UPDATE purge_jobs SET state = 'cancelled', updated_at = $1 WHERE request_id = $2 AND state = 'waiting'")
                        .bind(rejection.at)
                        .bind(id)
                        .execute(&mut *tx)
                        .await?;
                    append_in(&mut tx, &self.subject_key, audit).await?;
                    tx.commit().await?;
                    record.rejection = Some(rejection.clone());
                    Ok(record)
                }

                async fn extend_erasure(&self, id: &str, extension: &DeadlineExtension, audit: AuditEntry) -> Result<ErasureRecord, StoreError> {
                    let mut tx = self.write_tx().await?;
                    let sql = sqlx::AssertSqlSafe(format!("SELECT {ERASURE_COLUMNS} FROM erasure_requests WHERE id = $1{}", <$store>::FOR_UPDATE));
                    let mut record = erasure_from_row(&sqlx::query(sql).bind(id).fetch_one(&mut *tx).await?)?;
                    // Once, while the request is open and within its first deadline.
                    if record.extension.is_some() || record.state.is_final() || record.deadline <= extension.at || !(1..=MAX_EXTENSION_MONTHS).contains(&extension.months) {
                        return Err(StoreError::NotExtendable);
                    }
                    record.deadline = deadline(record.deadline, extension.months);
                    record.extension = Some(extension.clone());
                    record.updated_at = extension.at;
                    sqlx::query("UPDATE erasure_requests SET due_at = $1, extended_months = $2, extension_reason = $3, extended_by = $4, extended_at = $5, updated_at = $5 WHERE id = $6")
                        .bind(record.deadline)
                        .bind(extension.months as i32)
                        .bind(&extension.reason)
                        .bind(&extension.by)
                        .bind(extension.at)
                        .bind(id)
                        .execute(&mut *tx)
                        .await?;
                    append_in(&mut tx, &self.subject_key, audit).await?;
                    tx.commit().await?;
                    Ok(record)
                }

                async fn erasure(&self, id: &str) -> Result<ErasureRecord, StoreError> {
                    let sql = sqlx::AssertSqlSafe(format!("SELECT {ERASURE_COLUMNS} FROM erasure_requests WHERE id = $1"));
                    erasure_from_row(&sqlx::query(sql).bind(id).fetch_one(&self.pool).await?)
                }

                async fn purge_jobs(&self, request_id: &str) -> Result<Vec<PurgeJob>, StoreError> {
                    let rows = sqlx::query(
                        "SELECT id, request_id, target, state, attempts, next_attempt_at, last_error, result, updated_at
                         FROM purge_jobs WHERE request_id = $1 ORDER BY target",
                    )
                    .bind(request_id)
                    .fetch_all(&self.pool)
                    .await?;
                    rows.iter()
                        .map(|row| {
                            let result: Option<Json<serde_json::Value>> = row.try_get("result")?;
                            Ok(PurgeJob {
                                id: row.try_get("id")?,
                                request_id: row.try_get("request_id")?,
                                target: row.try_get("target")?,
                                state: row.try_get("state")?,
                                attempts: row.try_get("attempts")?,
                                next_attempt_at: row.try_get("next_attempt_at")?,
                                last_error: row.try_get("last_error")?,
                                result: result.map(|r| r.0),
                                updated_at: row.try_get("updated_at")?,
                            })
                        })
                        .collect()
                }

                async fn approve_erasure(
                    &self,
                    id: &str,
                    actor: &str,
                    required: usize,
                    at: DateTime<Utc>,
                    audit: AuditEntry,
                ) -> Result<ErasureRecord, StoreError> {
                    let mut tx = self.write_tx().await?;
                    let sql = sqlx::AssertSqlSafe(format!("SELECT {ERASURE_COLUMNS} FROM erasure_requests WHERE id = $1{}", <$store>::FOR_UPDATE));
                    let mut record = erasure_from_row(&sqlx::query(sql).bind(id).fetch_one(&mut *tx).await?)?;
                    let authorised = lethe_policy::erasure::approve(record.state, &mut record.approvals, actor, &record.requested_by, required)?;
                    record.updated_at = at;
                    save_erasure(&mut tx, &record).await?;
                    append_in(&mut tx, &self.subject_key, audit.clone()).await?;
                    let mut changes = Vec::new();
                    if authorised {
                        step(&mut record, ErasureEvent::Authorize, at)?;
                        changes = hold_or_flip(&mut tx, &self.subject_key, &mut record, self.closure(), self.governed(), at, &audit).await?;
                    }
                    commit_changes(self, tx, changes).await?;
                    Ok(record)
                }

                async fn review_erasure(
                    &self,
                    id: &str,
                    event: ErasureEvent,
                    at: DateTime<Utc>,
                    audit: AuditEntry,
                ) -> Result<ErasureRecord, StoreError> {
                    let mut tx = self.write_tx().await?;
                    let sql = sqlx::AssertSqlSafe(format!("SELECT {ERASURE_COLUMNS} FROM erasure_requests WHERE id = $1{}", <$store>::FOR_UPDATE));
                    let mut record = erasure_from_row(&sqlx::query(sql).bind(id).fetch_one(&mut *tx).await?)?;
                    let to = match event {
                        ErasureEvent::Escalate | ErasureEvent::Resume => lethe_policy::erasure::transition(record.state, event)?,
                        other => return Err(lethe_policy::IllegalTransition { from: record.state, event: other }.into()),
                    };
                    record.state = to;
                    record.updated_at = at;
                    if event == ErasureEvent::Resume {
                        sqlx::query("UPDATE purge_jobs SET state = 'pending', attempts = 0, next_attempt_at = $1, updated_at = $1 WHERE request_id = $2 AND state = 'exception'")
                            .bind(at)
                            .bind(id)
                            .execute(&mut *tx)
                            .await?;
                    }
                    save_erasure(&mut tx, &record).await?;
                    append_in(&mut tx, &self.subject_key, audit).await?;
                    tx.commit().await?;
                    Ok(record)
                }

                async fn claim_purge_job(
                    &self,
                    worker: &str,
                    now: DateTime<Utc>,
                    settled: DateTime<Utc>,
                    lease_until: DateTime<Utc>,
                ) -> Result<Option<PurgeJob>, StoreError> {
                    let mut tx = self.write_tx().await?;
                    let sql = sqlx::AssertSqlSafe(format!(
                        "SELECT id, request_id FROM purge_jobs j
                         WHERE ((state IN ('pending', 'retrying') AND next_attempt_at <= $1) OR (state = 'running' AND claimed_until < $1))
                         AND EXISTS (SELECT 1 FROM erasure_requests r WHERE r.id = j.request_id AND r.suppressed_at <= $2)
                         ORDER BY next_attempt_at LIMIT 1{}",
                        <$store>::SKIP_LOCKED
                    ));
                    let Some(row) = sqlx::query(sql).bind(now).bind(settled).fetch_optional(&mut *tx).await? else {
                        return Ok(None);
                    };
                    let (job_id, request_id): (String, String) = (row.try_get("id")?, row.try_get("request_id")?);
                    sqlx::query("UPDATE purge_jobs SET state = 'running', claimed_by = $1, claimed_until = $2, attempts = attempts + 1, updated_at = $3 WHERE id = $4")
                        .bind(worker)
                        .bind(lease_until)
                        .bind(now)
                        .bind(&job_id)
                        .execute(&mut *tx)
                        .await?;
                    let sql = sqlx::AssertSqlSafe(format!("SELECT {ERASURE_COLUMNS} FROM erasure_requests WHERE id = $1{}", <$store>::FOR_UPDATE));
                    let mut record = erasure_from_row(&sqlx::query(sql).bind(&request_id).fetch_one(&mut *tx).await?)?;
                    let event = match record.state {
                        ErasureState::Suppressed => Some(ErasureEvent::PurgeStarted),
                        ErasureState::Retrying => Some(ErasureEvent::RetryStarted),
                        _ => None,
                    };
                    let mut changes = Vec::new();
                    if let Some(event) = event {
                        // The settle period is over: writes that overtook the flip on a slow
                        // replica have landed, and what they derived from the subject is found.
                        if record.state == ErasureState::Suppressed && extend_closure(&mut tx, &self.subject_key, &record, self.closure(), now).await? {
                            changes.push(PolicyChange::of_derivatives(&record.tenant));
                        }
                        step(&mut record, event, now)?;
                        save_erasure(&mut tx, &record).await?;
                    }
                    commit_changes(self, tx, changes).await?;
                    Ok(self.purge_jobs(&request_id).await?.into_iter().find(|j| j.id == job_id))
                }

                async fn renew_purge_job(&self, job_id: &str, worker: &str, lease_until: DateTime<Utc>) -> Result<bool, StoreError> {
                    let mut tx = self.write_tx().await?;
                    let renewed = sqlx::query("UPDATE purge_jobs SET claimed_until = $1 WHERE id = $2 AND claimed_by = $3 AND state = 'running'")
                        .bind(lease_until)
                        .bind(job_id)
                        .bind(worker)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                    tx.commit().await?;
                    Ok(renewed == 1)
                }

                async fn finish_purge_job(
                    &self,
                    job_id: &str,
                    outcome: JobOutcome,
                    now: DateTime<Utc>,
                    audit: AuditEntry,
                ) -> Result<ErasureRecord, StoreError> {
                    let mut tx = self.write_tx().await?;
                    let request_id: String = sqlx::query_scalar("SELECT request_id FROM purge_jobs WHERE id = $1")
                        .bind(job_id)
                        .fetch_one(&mut *tx)
                        .await?;
                    let sql = sqlx::AssertSqlSafe(format!("SELECT {ERASURE_COLUMNS} FROM erasure_requests WHERE id = $1{}", <$store>::FOR_UPDATE));
                    let mut record = erasure_from_row(&sqlx::query(sql).bind(&request_id).fetch_one(&mut *tx).await?)?;
                    let (attempt, result, error, next) = match &outcome {
                        JobOutcome::Done(result) => (Attempt::Done, Some(Json(result.clone())), None, now),
                        JobOutcome::Failed { error, retry_at: Some(at) } => (Attempt::Failed { again: true }, None, Some(error.clone()), *at),
                        JobOutcome::Failed { error, retry_at: None } => (Attempt::Failed { again: false }, None, Some(error.clone()), now),
                    };
                    let (action, outcome_result) = match attempt {
                        Attempt::Done => ("purge.done", "ok"),
                        Attempt::Failed { .. } => ("purge.failed", "failed"),
                    };
                    append_in(&mut tx, &self.subject_key, AuditEntry { action: action.into(), result: outcome_result.into(), ..audit.clone() }).await?;
                    sqlx::query(
                        "UPDATE purge_jobs SET state = $1, result = $2, last_error = $3, next_attempt_at = $4, claimed_by = NULL, claimed_until = NULL, updated_at = $5 WHERE id = $6",
                    )
                    .bind(JobState::after(attempt).as_str())
                    .bind(result)
                    .bind(error)
                    .bind(next)
                    .bind(now)
                    .bind(job_id)
                    .execute(&mut *tx)
                    .await?;
                    let (changes, completed) = advance(&mut tx, &self.subject_key, self.closure(), &mut record, now, &audit).await?;
                    commit_changes(self, tx, changes).await?;
                    if completed {
                        scrubbed(self).await;
                    }
                    Ok(record)
                }

                async fn forget_erased(&self, at: DateTime<Utc>) -> Result<u64, StoreError> {
                    let ids: Vec<String> = sqlx::query_scalar("SELECT id FROM erasure_requests WHERE state = 'completed' AND subject NOT LIKE 'ref/%' ORDER BY id")
                        .fetch_all(&self.pool)
                        .await?;
                    for id in &ids {
                        let mut tx = self.write_tx().await?;
                        let sql = sqlx::AssertSqlSafe(format!("SELECT {ERASURE_COLUMNS} FROM erasure_requests WHERE id = $1{}", <$store>::FOR_UPDATE));
                        let mut record = erasure_from_row(&sqlx::query(sql).bind(id).fetch_one(&mut *tx).await?)?;
                        if record.subject.starts_with(lethe_policy::audit::FORGOTTEN) {
                            continue;
                        }
                        let changes = forget_request(&mut tx, &self.subject_key, &mut record, at).await?;
                        save_erasure(&mut tx, &record).await?;
                        let scope: Option<Json<serde_json::Value>> = sqlx::query_scalar("SELECT scope FROM tombstones WHERE request_id = $1")
                            .bind(id)
                            .fetch_optional(&mut *tx)
                            .await?;
                        if let Some(Json(mut scope)) = scope {
                            scope["keys"] = serde_json::json!(record.keys().collect::<Vec<_>>());
                            sqlx::query("UPDATE tombstones SET subject = $2, scope = $3 WHERE request_id = $1")
                                .bind(id)
                                .bind(&record.subject)
                                .bind(Json(scope))
                                .execute(&mut *tx)
                                .await?;
                        }
                        commit_changes(self, tx, changes).await?;
                    }
                    if !ids.is_empty() {
                        self.scrub().await?;
                    }
                    Ok(ids.len() as u64)
                }

                async fn expired_items(&self, now: DateTime<Utc>, limit: i64) -> Result<Vec<ExpiredItem>, StoreError> {
                    let rows = sqlx::query(
                        "SELECT store, collection, item_id, tenant, subject FROM items i
                         WHERE deleted_at IS NULL AND expires_at <= $1
                         AND NOT EXISTS (SELECT 1 FROM legal_holds h WHERE h.tenant = i.tenant AND h.released_at IS NULL
                                         AND (h.subject IS NULL OR h.subject = i.subject))
                         ORDER BY expires_at LIMIT $2",
                    )
                    .bind(now)
                    .bind(limit)
                    .fetch_all(&self.pool)
                    .await?;
                    rows.iter()
                        .map(|r| {
                            Ok(ExpiredItem {
                                store: r.try_get("store")?,
                                collection: r.try_get("collection")?,
                                item_id: r.try_get("item_id")?,
                                tenant: r.try_get("tenant")?,
                                subject: r.try_get("subject")?,
                            })
                        })
                        .collect()
                }

                async fn tombstones_since(&self, since: DateTime<Utc>) -> Result<Vec<Tombstone>, StoreError> {
                    let rows = sqlx::query("SELECT request_id, tenant, subject, scope, erased_at FROM tombstones WHERE erased_at >= $1 ORDER BY erased_at, request_id")
                        .bind(since)
                        .fetch_all(&self.pool)
                        .await?;
                    rows.iter()
                        .map(|row| {
                            let scope: Json<serde_json::Value> = row.try_get("scope")?;
                            Ok(Tombstone {
                                request_id: row.try_get("request_id")?,
                                tenant: row.try_get("tenant")?,
                                subject: row.try_get("subject")?,
                                scope: scope.0,
                                erased_at: row.try_get("erased_at")?,
                            })
                        })
                        .collect()
                }

                async fn lineage_items(
                    &self,
                    tenant: &str,
                    store: &str,
                    subjects: &[String],
                    include_deleted: bool,
                ) -> Result<Vec<(String, String)>, StoreError> {
                    let mut items = Vec::new();
                    for subject in subjects {
                        let rows = sqlx::query(
                            "SELECT collection, item_id FROM items WHERE tenant = $1 AND store = $2 AND subject = $3 AND ($4 OR deleted_at IS NULL)",
                        )
                        .bind(tenant)
                        .bind(store)
                        .bind(subject)
                        .bind(include_deleted)
                        .fetch_all(&self.pool)
                        .await?;
                        for row in &rows {
                            items.push((row.try_get("collection")?, row.try_get("item_id")?));
                        }
                    }
                    Ok(items)
                }

                async fn record_processors(&self, uses: &[crate::state::ProcessorUse]) -> Result<(), StoreError> {
                    let mut tx = self.write_tx().await?;
                    for u in uses {
                        sqlx::query(
                            "INSERT INTO processors (tenant, subject, processor, first_at, last_at) VALUES ($1, $2, $3, $4, $5)
                             ON CONFLICT (tenant, subject, processor) DO UPDATE SET
                               first_at = CASE WHEN excluded.first_at < processors.first_at THEN excluded.first_at ELSE processors.first_at END,
                               last_at = CASE WHEN excluded.last_at > processors.last_at THEN excluded.last_at ELSE processors.last_at END",
                        )
                        .bind(&u.tenant)
                        .bind(&u.subject)
                        .bind(&u.processor)
                        .bind(u.first_at)
                        .bind(u.last_at)
                        .execute(&mut *tx)
                        .await?;
                    }
                    tx.commit().await?;
                    Ok(())
                }

                async fn processors(&self, tenant: &str, subject: &str) -> Result<Vec<crate::state::ProcessorUse>, StoreError> {
                    let rows = sqlx::query("SELECT processor, first_at, last_at FROM processors WHERE tenant = $1 AND subject = $2 ORDER BY processor")
                        .bind(tenant)
                        .bind(subject)
                        .fetch_all(&self.pool)
                        .await?;
                    rows.iter()
                        .map(|r| {
                            Ok(crate::state::ProcessorUse {
                                tenant: tenant.to_owned(),
                                subject: subject.to_owned(),
                                processor: r.try_get("processor")?,
                                first_at: r.try_get("first_at")?,
                                last_at: r.try_get("last_at")?,
                            })
                        })
                        .collect()
                }

                async fn record_items(&self, items: &[ItemRecord]) -> Result<(), StoreError> {
                    let mut tx = self.write_tx().await?;
                    // One statement per 500 rows (13 parameters each, well under both databases' limits).
                    // A live row never changes owner: a store that kept the first writer's record
                    // keeps the first writer's lineage. A deleted one is the index of nothing, and
                    // an id the store holds again (written through Lethe, decided on what the
                    // store held) is the new writer's.
                    // One statement may not touch a row twice (PostgreSQL refuses it): the rows
                    // are applied in passes, the n-th write of an id in the n-th, as if in order.
                    for chunk in crate::state::in_passes(items).iter().flat_map(|pass| pass.chunks(500)) {
                        let mut insert = sqlx::QueryBuilder::<$db>::new(
                            "INSERT INTO items (store, collection, item_id, tenant, subject, purpose, category, layer, created_at, expires_at, epoch, source_ref, parents, deleted_at) ",
                        );
                        insert.push_values(chunk, |mut row, item| {
                            row.push_bind(item.store.clone())
                                .push_bind(item.collection.clone())
                                .push_bind(item.item_id.clone())
                                .push_bind(item.tenant.clone())
                                .push_bind(item.subject.clone())
                                .push_bind(item.purpose.clone())
                                .push_bind(item.category.clone())
                                .push_bind(item.layer.as_str())
                                .push_bind(item.created_at)
                                .push_bind(item.expires_at)
                                .push_bind(item.epoch)
                                .push_bind(item.source_ref.clone())
                                .push_bind(Json(item.parents.clone()))
                                .push("NULL");
                        });
                        insert.push(
                            " ON CONFLICT (store, collection, item_id) DO UPDATE SET
                               tenant = excluded.tenant, subject = excluded.subject, purpose = excluded.purpose,
                               category = excluded.category, layer = excluded.layer, created_at = excluded.created_at,
                               expires_at = excluded.expires_at, epoch = excluded.epoch, source_ref = excluded.source_ref,
                               parents = excluded.parents, deleted_at = NULL
                             WHERE items.deleted_at IS NOT NULL
                                OR (items.tenant = excluded.tenant AND items.subject = excluded.subject)",
                        );
                        insert.build().execute(&mut *tx).await?;
                    }
                    tx.commit().await?;
                    Ok(())
                }

                async fn item_owners(
                    &self,
                    store: &str,
                    collection: &str,
                    ids: &[String],
                ) -> Result<BTreeMap<String, (String, String)>, StoreError> {
                    let mut owners = BTreeMap::new();
                    for chunk in ids.chunks(1000) {
                        let mut select = sqlx::QueryBuilder::<$db>::new("SELECT item_id, tenant, subject FROM items WHERE store = ");
                        select.push_bind(store.to_owned()).push(" AND collection = ").push_bind(collection.to_owned()).push(" AND item_id IN (");
                        let mut list = select.separated(", ");
                        for id in chunk {
                            list.push_bind(id.clone());
                        }
                        select.push(")");
                        for row in select.build().fetch_all(&self.pool).await? {
                            owners.insert(row.try_get("item_id")?, (row.try_get("tenant")?, row.try_get("subject")?));
                        }
                    }
                    Ok(owners)
                }

                async fn item_stamps(
                    &self,
                    store: &str,
                    collection: &str,
                    ids: &[String],
                ) -> Result<BTreeMap<String, lethe_policy::Stamp>, StoreError> {
                    let mut stamps = BTreeMap::new();
                    for chunk in ids.chunks(1000) {
                        let mut select = sqlx::QueryBuilder::<$db>::new(
                            "SELECT item_id, tenant, subject, purpose, category, layer, expires_at, epoch FROM items WHERE deleted_at IS NULL AND store = ",
                        );
                        select.push_bind(store.to_owned()).push(" AND collection = ").push_bind(collection.to_owned()).push(" AND item_id IN (");
                        let mut list = select.separated(", ");
                        for id in chunk {
                            list.push_bind(id.clone());
                        }
                        select.push(")");
                        for row in select.build().fetch_all(&self.pool).await? {
                            let layer: String = row.try_get("layer")?;
                            let stamp = lethe_policy::Stamp {
                                tenant: row.try_get("tenant")?,
                                subject: row.try_get("subject")?,
                                purpose: row.try_get("purpose")?,
                                category: row.try_get("category")?,
                                layer: layer.parse().map_err(|e: String| StoreError::Corrupt(e))?,
                                expires_at: row.try_get("expires_at")?,
                                epoch: row.try_get("epoch")?,
                            };
                            stamps.insert(row.try_get("item_id")?, stamp);
                        }
                    }
                    Ok(stamps)
                }

                async fn mark_items_deleted(
                    &self,
                    store: &str,
                    collection: &str,
                    ids: &[String],
                    at: DateTime<Utc>,
                ) -> Result<u64, StoreError> {
                    // A thousand rows per statement, each chunk committed on its own: a purge of
                    // 100 000 items neither holds the write lock for seconds nor makes 100 000
                    // round trips. A mark is idempotent, so a crash between chunks loses nothing.
                    let mut marked = 0;
                    for chunk in ids.chunks(1000) {
                        let mut tx = self.write_tx().await?;
                        let mut update = sqlx::QueryBuilder::<$db>::new("UPDATE items SET deleted_at = ");
                        update.push_bind(at).push(" WHERE deleted_at IS NULL AND store = ").push_bind(store.to_owned());
                        update.push(" AND collection = ").push_bind(collection.to_owned()).push(" AND item_id IN (");
                        let mut list = update.separated(", ");
                        for id in chunk {
                            list.push_bind(id.clone());
                        }
                        update.push(")");
                        marked += update.build().execute(&mut *tx).await?.rows_affected();
                        tx.commit().await?;
                    }
                    Ok(marked)
                }

                async fn inventory(&self, tenant: &str, subject: &str) -> Result<BTreeMap<String, i64>, StoreError> {
                    let rows = sqlx::query(
                        "SELECT store, COUNT(*) AS n FROM (
                             SELECT store FROM items WHERE tenant = $1 AND subject = $2 AND deleted_at IS NULL
                             UNION ALL
                             SELECT store FROM threads WHERE tenant = $1 AND subject = $2 AND deleted_at IS NULL
                         ) AS live GROUP BY store ORDER BY store",
                    )
                    .bind(tenant)
                    .bind(subject)
                    .fetch_all(&self.pool)
                    .await?;
                    rows.iter().map(|r| Ok((r.try_get("store")?, r.try_get("n")?))).collect()
                }

                fn shared_memory(&self) -> Option<&dyn crate::state::SharedMemory> {
                    <$store>::shared(self)
                }

                fn use_closure(&self, closure: Closure) {
                    // The first stays: a store is opened with one configuration.
                    let _ = self.closure.set(closure);
                }

                fn use_governed(&self, databases: Vec<String>) {
                    // The first stays: a store is opened with one configuration.
                    let _ = self.governed.set(databases);
                }

                async fn governed_flips(&self, request_id: &str) -> Result<Vec<GovernedFlip>, StoreError> {
                    let rows = sqlx::query("SELECT database, applied_at FROM erasure_flips WHERE request_id = $1 ORDER BY database")
                        .bind(request_id)
                        .fetch_all(&self.pool)
                        .await?;
                    rows.iter()
                        .map(|row| Ok(GovernedFlip { database: row.try_get("database")?, applied_at: row.try_get("applied_at")? }))
                        .collect()
                }

                async fn pending_flips(&self, database: &str) -> Result<Vec<PendingFlip>, StoreError> {
                    let sql = sqlx::AssertSqlSafe(format!(
                        "SELECT {ERASURE_COLUMNS} FROM erasure_requests r WHERE EXISTS (SELECT 1 FROM erasure_flips f WHERE f.request_id = r.id AND f.database = $1 AND f.applied_at IS NULL) ORDER BY requested_at"
                    ));
                    let rows = sqlx::query(sql).bind(database).fetch_all(&self.pool).await?;
                    let mut pending = Vec::with_capacity(rows.len());
                    for row in &rows {
                        let record = erasure_from_row(row)?;
                        let mut keys = Vec::new();
                        for key in record.keys() {
                            // A key another request's completion forgot meanwhile has no state.
                            let epoch: Option<i64> = sqlx::query_scalar("SELECT epoch FROM subjects WHERE tenant = $1 AND subject = $2")
                                .bind(&record.tenant)
                                .bind(key)
                                .fetch_optional(&self.pool)
                                .await?;
                            keys.push((key.to_owned(), epoch));
                        }
                        pending.push(PendingFlip { request_id: record.id, tenant: record.tenant, keys });
                    }
                    Ok(pending)
                }

                async fn flip_applied(&self, request_id: &str, database: &str, at: DateTime<Utc>, audit: AuditEntry) -> Result<ErasureRecord, StoreError> {
                    let mut tx = self.write_tx().await?;
                    let sql = sqlx::AssertSqlSafe(format!("SELECT {ERASURE_COLUMNS} FROM erasure_requests WHERE id = $1{}", <$store>::FOR_UPDATE));
                    let mut record = erasure_from_row(&sqlx::query(sql).bind(request_id).fetch_one(&mut *tx).await?)?;
                    let applied = sqlx::query("UPDATE erasure_flips SET applied_at = $3 WHERE request_id = $1 AND database = $2 AND applied_at IS NULL")
                        .bind(request_id)
                        .bind(database)
                        .bind(at)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                    if applied == 0 {
                        return Ok(record);
                    }
                    let target = |action: &str, target: &str, target_ref: &str| AuditEntry { action: action.into(), target: target.into(), target_ref: Some(target_ref.to_owned()), at, ..audit.clone() };
                    append_in(&mut tx, &self.subject_key, target("governed.flip_applied", "postgres", database)).await?;
                    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM erasure_flips WHERE request_id = $1 AND applied_at IS NULL")
                        .bind(request_id)
                        .fetch_one(&mut *tx)
                        .await?;
                    if left == 0 && record.state == ErasureState::Propagating && record.suppressed_at.is_none() {
                        step(&mut record, ErasureEvent::FlipApplied, at)?;
                        record.suppressed_at = Some(at);
                        save_erasure(&mut tx, &record).await?;
                        append_in(&mut tx, &self.subject_key, target("erasure.suppress", "erasure", request_id)).await?;
                    }
                    tx.commit().await?;
                    Ok(record)
                }

                async fn record_derived(&self, derived: &[Derived]) -> Result<(), StoreError> {
                    if derived.is_empty() {
                        return Ok(());
                    }
                    let mut tx = self.write_tx().await?;
                    record_derived_in(&mut tx, &self.subject_key, derived).await?;
                    tx.commit().await?;
                    Ok(())
                }

                async fn edges_of(&self, tenant: &str, item: &ItemKey) -> Result<(Vec<Edge>, Vec<Edge>), StoreError> {
                    let mut c = self.pool.acquire().await?;
                    edges_of_in(&mut c, tenant, item).await
                }

                async fn borrowed(&self, tenant: &str, subject: &str) -> Result<Vec<Edge>, StoreError> {
                    let mut c = self.pool.acquire().await?;
                    borrowed_in(&mut c, tenant, subject).await
                }

                async fn hidden_items(&self, tenant: &str, since: DateTime<Utc>) -> Result<std::collections::HashSet<ItemKey>, StoreError> {
                    let mut c = self.pool.acquire().await?;
                    hidden_items_in(&mut c, tenant, since).await
                }

                async fn derivatives(&self, request_id: &str) -> Result<Vec<Derivative>, StoreError> {
                    let mut c = self.pool.acquire().await?;
                    derivatives_in(&mut c, request_id).await
                }

                async fn closure_of(&self, tenant: &str, keys: &[String], targets: &[String]) -> Result<Vec<Derivative>, StoreError> {
                    let mut c = self.pool.acquire().await?;
                    closure_in(&mut c, &self.subject_key, tenant, keys, &target_stores(targets), self.closure(), crate::now()).await
                }

                async fn decide_derivatives(
                    &self,
                    request_id: &str,
                    refs: &[String],
                    decision: Decision,
                    reason: &str,
                    at: DateTime<Utc>,
                    audit: AuditEntry,
                ) -> Result<ErasureRecord, StoreError> {
                    if !matches!(decision, Decision::Erase | Decision::Release) {
                        return Err(StoreError::NotDecidable("a derivative is erased or released".into()));
                    }
                    let mut tx = self.write_tx().await?;
                    let sql = sqlx::AssertSqlSafe(format!("SELECT {ERASURE_COLUMNS} FROM erasure_requests WHERE id = $1{}", <$store>::FOR_UPDATE));
                    let mut record = erasure_from_row(&sqlx::query(sql).bind(request_id).fetch_one(&mut *tx).await?)?;
                    // Flipped everywhere: a flip still on its way to a governed database cannot
                    // move the request on.
                    if !record.state.is_suppressed() || record.state.is_final() || record.suppressed_at.is_none() {
                        return Err(StoreError::NotDecidable(format!("the request is {}: only a flipped, open request's derivatives are decided, once the flip holds everywhere", record.state)));
                    }
                    let known = derivatives_in(&mut tx, request_id).await?;
                    let keys: Vec<String> = record.keys().map(str::to_owned).collect();
                    let targets: Vec<String> = sqlx::query_scalar("SELECT target FROM purge_jobs WHERE request_id = $1 AND state <> 'cancelled'")
                        .bind(request_id)
                        .fetch_all(&mut *tx)
                        .await?;
                    let purged = target_stores(&targets);
                    for reference in refs {
                        let Some(derivative) = known.iter().find(|d| d.reference == *reference) else {
                            return Err(StoreError::NotDecidable(format!("{reference} is not a derivative of this request")));
                        };
                        if derivative.decision != Decision::Undecided {
                            return Err(StoreError::NotDecidable(format!("{reference} is not undecided: {}", derivative.decision.as_str())));
                        }
                        if decision == Decision::Erase && !purged.contains(&derivative.item.store) {
                            return Err(StoreError::NotDecidable(format!(
                                "{reference} is in store {}, which no purge of this request reaches: it can only be released",
                                derivative.item.store
                            )));
                        }
                        sqlx::query("UPDATE erasure_derivatives SET decision = $3, decided_by = $4, decided_at = $5, reason = $6 WHERE request_id = $1 AND ref = $2")
                            .bind(request_id)
                            .bind(reference)
                            .bind(decision.as_str())
                            .bind(&audit.actor)
                            .bind(at)
                            .bind(reason)
                            .execute(&mut *tx)
                            .await?;
                        if decision == Decision::Release {
                            drop_closure_edges(&mut tx, &record.tenant, &keys, &derivative.item).await?;
                        }
                        let event = AuditEntry {
                            action: format!("erasure.derivative_{}", decision.as_str()),
                            target: format!("derivative/{reference}"),
                            target_ref: Some(request_id.to_owned()),
                            ..audit.clone()
                        };
                        append_in(&mut tx, &self.subject_key, event).await?;
                    }
                    let (mut changes, completed) = advance(&mut tx, &self.subject_key, self.closure(), &mut record, at, &audit).await?;
                    changes.push(PolicyChange::of_derivatives(&record.tenant));
                    commit_changes(self, tx, changes).await?;
                    if completed {
                        scrubbed(self).await;
                    }
                    Ok(record)
                }

                async fn derivatives_erased(&self, request_id: &str, refs: &[String], at: DateTime<Utc>) -> Result<(), StoreError> {
                    let mut tx = self.write_tx().await?;
                    for reference in refs {
                        sqlx::query("UPDATE erasure_derivatives SET erased_at = $3 WHERE request_id = $1 AND ref = $2 AND erased_at IS NULL")
                            .bind(request_id)
                            .bind(reference)
                            .bind(at)
                            .execute(&mut *tx)
                            .await?;
                    }
                    tx.commit().await?;
                    Ok(())
                }

                async fn certificate(&self, request_id: &str) -> Result<Option<String>, StoreError> {
                    Ok(sqlx::query_scalar("SELECT document FROM certificates WHERE request_id = $1")
                        .bind(request_id)
                        .fetch_optional(&self.pool)
                        .await?)
                }

                async fn keep_certificate(&self, request_id: &str, document: &str) -> Result<String, StoreError> {
                    let mut tx = self.write_tx().await?;
                    sqlx::query("INSERT INTO certificates (request_id, document) VALUES ($1, $2) ON CONFLICT (request_id) DO NOTHING")
                        .bind(request_id)
                        .bind(document)
                        .execute(&mut *tx)
                        .await?;
                    let kept: String = sqlx::query_scalar("SELECT document FROM certificates WHERE request_id = $1")
                        .bind(request_id)
                        .fetch_one(&mut *tx)
                        .await?;
                    tx.commit().await?;
                    Ok(kept)
                }

                async fn append_audit(&self, entry: AuditEntry) -> Result<AuditRecord, StoreError> {
                    let mut tx = self.write_tx().await?;
                    let record = append_in(&mut tx, &self.subject_key, entry).await?;
                    tx.commit().await?;
                    Ok(record)
                }

                async fn audit_page(&self, after: i64, limit: i64, tenant: Option<&str>) -> Result<Vec<AuditRecord>, StoreError> {
                    let rows = sqlx::query(
                        "SELECT seq, at, tenant, actor, action, request_id, subject_ref, target, target_ref, result, attempt, prev_hash, hash,
                                tenant_seq, tenant_prev_hash, tenant_hash, legacy_hash
                         FROM audit_events WHERE seq > $1 AND ($3 IS NULL OR tenant = $3) ORDER BY seq LIMIT $2",
                    )
                    .bind(after)
                    .bind(limit)
                    .bind(tenant)
                    .fetch_all(&self.pool)
                    .await?;
                    rows.iter().map(audit_from_row).collect()
                }

                async fn audit_of(&self, tenant: &str, refs: &[String], limit: i64) -> Result<Vec<AuditRecord>, StoreError> {
                    if refs.is_empty() {
                        return Ok(Vec::new());
                    }
                    let mut select = sqlx::QueryBuilder::<$db>::new(
                        "SELECT seq, at, tenant, actor, action, request_id, subject_ref, target, target_ref, result, attempt, prev_hash, hash,
                                tenant_seq, tenant_prev_hash, tenant_hash, legacy_hash
                         FROM audit_events WHERE tenant = ",
                    );
                    select.push_bind(tenant.to_owned()).push(" AND target_ref IN (");
                    let mut each = select.separated(", ");
                    for r in refs {
                        each.push_bind(r.clone());
                    }
                    select.push(") ORDER BY seq LIMIT ").push_bind(limit);
                    let rows = select.build().fetch_all(&self.pool).await?;
                    rows.iter().map(audit_from_row).collect()
                }

                async fn key_audit_chain(&self, at: DateTime<Utc>) -> Result<Option<ChainHead>, StoreError> {
                    const PAGE: i64 = 1000;
                    let key = self.subject_key.get().ok_or(StoreError::NoSubjectKey)?;
                    let mut tx = self.write_tx().await?;
                    let head = sqlx::query(<$store>::LOCK_AUDIT_HEAD).fetch_one(&mut *tx).await?;
                    let version: i32 = head.try_get("chain_version")?;
                    if version == crate::state::KEYED_CHAIN {
                        return Ok(None);
                    }
                    let old = ChainHead { seq: head.try_get("seq")?, hash: head.try_get("hash")? };
                    let select = "SELECT seq, at, tenant, actor, action, request_id, subject_ref, target, target_ref, result, attempt, prev_hash, hash,
                                         tenant_seq, tenant_prev_hash, tenant_hash, legacy_hash
                                  FROM audit_events WHERE seq > $1 ORDER BY seq LIMIT $2";
                    // Verified as it was written first: a broken chain is not sealed over.
                    let mut written = lethe_policy::audit::ChainVerifier::new(Links::Unkeyed);
                    let mut after: i64 = 0;
                    loop {
                        let rows = sqlx::query(select).bind(after).bind(PAGE).fetch_all(&mut *tx).await?;
                        let Some(last) = rows.last() else { break };
                        after = last.try_get("seq")?;
                        for row in &rows {
                            written.push(&audit_from_row(row)?).map_err(|e| StoreError::Corrupt(format!(
                                "the audit chain is broken at row {}: {e}; it is left unkeyed, as it was written", e.seq()
                            )))?;
                        }
                    }
                    written.finish(&old).map_err(|e| StoreError::Corrupt(format!(
                        "the audit chain is broken at row {}: {e}; it is left unkeyed, as it was written", e.seq()
                    )))?;
                    // Sealed again, link by link, with the key.
                    let links = Links::Keyed(key);
                    let mut head = ChainHead::default();
                    let mut tenant_heads: BTreeMap<String, ChainHead> = BTreeMap::new();
                    let mut after: i64 = 0;
                    loop {
                        let rows = sqlx::query(select).bind(after).bind(PAGE).fetch_all(&mut *tx).await?;
                        let Some(last) = rows.last() else { break };
                        after = last.try_get("seq")?;
                        for row in &rows {
                            let entry = audit_from_row(row)?.entry;
                            let tenant_head = entry.tenant.as_ref().and_then(|t| tenant_heads.get(t)).cloned().unwrap_or_default();
                            let record = seal(links, &head, &tenant_head, entry);
                            let link = record.tenant_chain.as_ref();
                            // The link as written stays beside the new one: heads certified
                            // before name it.
                            sqlx::query("UPDATE audit_events SET prev_hash = $2, hash = $3, tenant_prev_hash = $4, tenant_hash = $5, legacy_hash = hash WHERE seq = $1")
                                .bind(record.seq)
                                .bind(&record.prev_hash)
                                .bind(&record.hash)
                                .bind(link.map(|l| l.prev_hash.clone()))
                                .bind(link.map(|l| l.hash.clone()))
                                .execute(&mut *tx)
                                .await?;
                            if let (Some(tenant), Some(link)) = (&record.entry.tenant, link) {
                                tenant_heads.insert(tenant.clone(), ChainHead { seq: link.seq, hash: link.hash.clone() });
                            }
                            head = ChainHead { seq: record.seq, hash: record.hash };
                        }
                    }
                    for (tenant, tenant_head) in &tenant_heads {
                        sqlx::query("INSERT INTO audit_tenant_heads (tenant, seq, hash) VALUES ($1, $2, $3) ON CONFLICT (tenant) DO UPDATE SET seq = excluded.seq, hash = excluded.hash")
                            .bind(tenant)
                            .bind(tenant_head.seq)
                            .bind(&tenant_head.hash)
                            .execute(&mut *tx)
                            .await?;
                    }
                    sqlx::query("UPDATE audit_chain SET seq = $1, hash = $2, chain_version = $3, key_check = $4 WHERE id = 1")
                        .bind(head.seq)
                        .bind(&head.hash)
                        .bind(crate::state::KEYED_CHAIN)
                        .bind(lethe_policy::audit::key_check(key))
                        .execute(&mut *tx)
                        .await?;
                    let event = AuditEntry {
                        at,
                        tenant: None,
                        actor: "lethe".into(),
                        action: "audit.chain_keyed".into(),
                        request_id: String::new(),
                        subject_ref: None,
                        target: "audit".into(),
                        target_ref: Some(format!("{}:{}", old.seq, old.hash)),
                        result: "ok".into(),
                        attempt: 0,
                    };
                    append_in(&mut tx, &self.subject_key, event).await?;
                    tx.commit().await?;
                    Ok(Some(old))
                }

                async fn audit_keying(&self) -> Result<(bool, Option<String>), StoreError> {
                    let row = sqlx::query("SELECT chain_version, key_check FROM audit_chain WHERE id = 1").fetch_one(&self.pool).await?;
                    let version: i32 = row.try_get("chain_version")?;
                    Ok((version == crate::state::KEYED_CHAIN, row.try_get("key_check")?))
                }

                async fn tenant_heads(&self) -> Result<Vec<(String, ChainHead)>, StoreError> {
                    let rows = sqlx::query("SELECT tenant, seq, hash FROM audit_tenant_heads ORDER BY tenant").fetch_all(&self.pool).await?;
                    rows.iter()
                        .map(|row| Ok((row.try_get("tenant")?, ChainHead { seq: row.try_get("seq")?, hash: row.try_get("hash")? })))
                        .collect()
                }

                async fn last_signed_heads(&self) -> Result<BTreeMap<String, i64>, StoreError> {
                    let rows = sqlx::query("SELECT tenant, max(seq) AS seq FROM audit_signed_heads GROUP BY tenant").fetch_all(&self.pool).await?;
                    rows.iter().map(|row| Ok((row.try_get("tenant")?, row.try_get("seq")?))).collect()
                }

                async fn keep_signed_head(&self, head: &SignedHead) -> Result<(), StoreError> {
                    sqlx::query(
                        "INSERT INTO audit_signed_heads (tenant, seq, hash, signed_at, public_key, signature) VALUES ($1, $2, $3, $4, $5, $6)
                         ON CONFLICT (tenant, seq) DO NOTHING",
                    )
                    .bind(head.tenant.as_deref().unwrap_or_default())
                    .bind(head.seq)
                    .bind(&head.hash)
                    .bind(head.signed_at)
                    .bind(&head.signature.public_key)
                    .bind(&head.signature.value)
                    .execute(&self.pool)
                    .await?;
                    Ok(())
                }

                async fn signed_heads(&self, tenant: Option<&str>) -> Result<Vec<SignedHead>, StoreError> {
                    let rows = sqlx::query("SELECT tenant, seq, hash, signed_at, public_key, signature FROM audit_signed_heads WHERE tenant = $1 ORDER BY seq")
                        .bind(tenant.unwrap_or_default())
                        .fetch_all(&self.pool)
                        .await?;
                    rows.iter()
                        .map(|row| {
                            let tenant: String = row.try_get("tenant")?;
                            Ok(SignedHead {
                                tenant: (!tenant.is_empty()).then_some(tenant),
                                seq: row.try_get("seq")?,
                                hash: row.try_get("hash")?,
                                signed_at: row.try_get("signed_at")?,
                                signature: crate::state::HeadSignature::ed25519(row.try_get("public_key")?, row.try_get("signature")?),
                            })
                        })
                        .collect()
                }

                async fn create_session(&self, session: &ConsoleSession) -> Result<(), StoreError> {
                    let mut tx = self.write_tx().await?;
                    sqlx::query("DELETE FROM console_sessions WHERE expires_at <= $1")
                        .bind(session.created_at)
                        .execute(&mut *tx)
                        .await?;
                    sqlx::query(
                        "INSERT INTO console_sessions (id_hash, claims, csrf, created_at, last_seen_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6)",
                    )
                    .bind(&session.id_hash)
                    .bind(&session.claims)
                    .bind(&session.csrf)
                    .bind(session.created_at)
                    .bind(session.last_seen_at)
                    .bind(session.expires_at)
                    .execute(&mut *tx)
                    .await?;
                    tx.commit().await?;
                    Ok(())
                }

                async fn session(&self, id_hash: &str) -> Result<Option<ConsoleSession>, StoreError> {
                    let row = sqlx::query("SELECT id_hash, claims, csrf, created_at, last_seen_at, expires_at FROM console_sessions WHERE id_hash = $1")
                        .bind(id_hash)
                        .fetch_optional(&self.pool)
                        .await?;
                    row.map(|row| {
                        Ok(ConsoleSession {
                            id_hash: row.try_get("id_hash")?,
                            claims: row.try_get("claims")?,
                            csrf: row.try_get("csrf")?,
                            created_at: row.try_get("created_at")?,
                            last_seen_at: row.try_get("last_seen_at")?,
                            expires_at: row.try_get("expires_at")?,
                        })
                    })
                    .transpose()
                }

                async fn touch_session(&self, id_hash: &str, at: DateTime<Utc>) -> Result<(), StoreError> {
                    let mut tx = self.write_tx().await?;
                    sqlx::query("UPDATE console_sessions SET last_seen_at = $2 WHERE id_hash = $1 AND last_seen_at < $2")
                        .bind(id_hash)
                        .bind(at)
                        .execute(&mut *tx)
                        .await?;
                    tx.commit().await?;
                    Ok(())
                }

                async fn end_session(&self, id_hash: &str) -> Result<bool, StoreError> {
                    let mut tx = self.write_tx().await?;
                    let ended = sqlx::query("DELETE FROM console_sessions WHERE id_hash = $1")
                        .bind(id_hash)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                    tx.commit().await?;
                    Ok(ended == 1)
                }

                async fn revoke_token(&self, jti: &str, at: DateTime<Utc>, by: &str, audit: AuditEntry) -> Result<(), StoreError> {
                    let mut tx = self.write_tx().await?;
                    let inserted = sqlx::query("INSERT INTO revoked_tokens (jti, revoked_at, revoked_by) VALUES ($1, $2, $3) ON CONFLICT (jti) DO NOTHING")
                        .bind(jti)
                        .bind(at)
                        .bind(by)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                    if inserted == 0 {
                        return Err(StoreError::AlreadyRevoked);
                    }
                    append_in(&mut tx, &self.subject_key, audit).await?;
                    commit_change(self, tx, PolicyChange::of_revoked_token(jti)).await
                }

                async fn revoked_tokens(&self) -> Result<std::collections::HashSet<String>, StoreError> {
                    Ok(sqlx::query_scalar("SELECT jti FROM revoked_tokens").fetch_all(&self.pool).await?.into_iter().collect())
                }

                async fn audit_head(&self, tenant: Option<&str>) -> Result<ChainHead, StoreError> {
                    match tenant {
                        Some(tenant) => tenant_head_in(&self.pool, tenant).await,
                        None => {
                            let row = sqlx::query("SELECT seq, hash FROM audit_chain WHERE id = 1").fetch_one(&self.pool).await?;
                            Ok(ChainHead { seq: row.try_get("seq")?, hash: row.try_get("hash")? })
                        }
                    }
                }
            }
        }
    };
}
pub(crate) use impl_store;
