//! The SQL of the audit chain: appending, reading, keying, signed heads, for both backends.
//! Expanded inside `impl_store!`, in its module: its imports, `Row`, `Tx` and shared helpers are in
//! scope.

/// Implements [`AuditLog`](crate::AuditLog) for `$store` over `$db`.
macro_rules! audit_sql {
    ($store:ty, $db:ty) => {
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
        async fn append_in(
            tx: &mut Tx,
            key: &std::sync::OnceLock<Vec<u8>>,
            entry: AuditEntry,
        ) -> Result<AuditRecord, StoreError> {
            let key = key.get().ok_or(StoreError::NoSubjectKey)?;
            let head = sqlx::query(<$store>::LOCK_AUDIT_HEAD)
                .fetch_one(&mut **tx)
                .await?;
            let version: i32 = head.try_get("chain_version")?;
            let kept_check: Option<String> = head.try_get("key_check")?;
            let head = ChainHead {
                seq: head.try_get("seq")?,
                hash: head.try_get("hash")?,
            };
            if version != crate::KEYED_CHAIN {
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
                "INSERT INTO audit_events (seq, at, tenant, actor, action, request_id, \
                    subject_ref, target, target_ref, result, attempt, prev_hash, hash, \
                    tenant_seq, tenant_prev_hash, tenant_hash)
                    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, \
                    $14, $15, $16)",
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
                    "INSERT INTO audit_tenant_heads (tenant, seq, hash) VALUES ($1, \
                        $2, $3)
                        ON CONFLICT (tenant) DO UPDATE SET seq = excluded.seq, hash = \
                        excluded.hash",
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
            let row = sqlx::query(
                "SELECT seq, hash FROM audit_tenant_heads WHERE \
                tenant = $1",
            )
            .bind(tenant)
            .fetch_optional(executor)
            .await?;
            match row {
                Some(row) => Ok(ChainHead {
                    seq: row.try_get("seq")?,
                    hash: row.try_get("hash")?,
                }),
                None => Ok(ChainHead::default()),
            }
        }

        /// Every audit row after `$1`, `$2` at most, in order: the chain read a page at a time.
        const AUDIT_PAGE: &str = "SELECT seq, at, tenant, actor, action, request_id, \
            subject_ref, target, target_ref, result, attempt, prev_hash, hash, tenant_seq, \
            tenant_prev_hash, tenant_hash, legacy_hash \
            FROM audit_events WHERE seq > $1 ORDER BY seq LIMIT $2";

        /// The next page of the chain after row `after`, which it moves to its last row.
        async fn audit_page(tx: &mut Tx, after: &mut i64) -> Result<Vec<Row>, StoreError> {
            const PAGE: i64 = 1000;
            let rows = sqlx::query(AUDIT_PAGE)
                .bind(*after)
                .bind(PAGE)
                .fetch_all(&mut **tx)
                .await?;
            if let Some(last) = rows.last() {
                *after = last.try_get("seq")?;
            }
            Ok(rows)
        }

        /// The unkeyed chain verified as it was written, up to `head`: a broken chain is not
        /// sealed over.
        async fn verify_unkeyed(tx: &mut Tx, head: &ChainHead) -> Result<(), StoreError> {
            let broken = |e: lethe_policy::audit::ChainBreak| {
                StoreError::Corrupt(format!(
                    "the audit chain is broken at row {}: {e}; it is left unkeyed, as it was \
                    written",
                    e.seq()
                ))
            };
            let mut written = lethe_policy::audit::ChainVerifier::new(Links::Unkeyed);
            let mut after: i64 = 0;
            loop {
                let rows = audit_page(tx, &mut after).await?;
                if rows.is_empty() {
                    break;
                }
                for row in &rows {
                    written.push(&audit_from_row(row)?).map_err(broken)?;
                }
            }
            written.finish(head).map_err(broken)?;
            Ok(())
        }

        /// Every row sealed again, link by link, with `key`, and each tenant's head written;
        /// answers the chain's new head.
        async fn reseal(tx: &mut Tx, key: &[u8]) -> Result<ChainHead, StoreError> {
            let links = Links::Keyed(key);
            let mut head = ChainHead::default();
            let mut tenant_heads: BTreeMap<String, ChainHead> = BTreeMap::new();
            let mut after: i64 = 0;
            loop {
                let rows = audit_page(tx, &mut after).await?;
                if rows.is_empty() {
                    break;
                }
                for row in &rows {
                    let entry = audit_from_row(row)?.entry;
                    let tenant_head = entry
                        .tenant
                        .as_ref()
                        .and_then(|t| tenant_heads.get(t))
                        .cloned()
                        .unwrap_or_default();
                    let record = seal(links, &head, &tenant_head, entry);
                    let link = record.tenant_chain.as_ref();
                    // The link as written stays beside the new one: heads certified before name
                    // it.
                    sqlx::query(
                        "UPDATE audit_events SET prev_hash = $2, hash = $3, tenant_prev_hash = \
                        $4, tenant_hash = $5, legacy_hash = hash WHERE seq = $1",
                    )
                    .bind(record.seq)
                    .bind(&record.prev_hash)
                    .bind(&record.hash)
                    .bind(link.map(|l| l.prev_hash.clone()))
                    .bind(link.map(|l| l.hash.clone()))
                    .execute(&mut **tx)
                    .await?;
                    if let (Some(tenant), Some(link)) = (&record.entry.tenant, link) {
                        tenant_heads.insert(
                            tenant.clone(),
                            ChainHead {
                                seq: link.seq,
                                hash: link.hash.clone(),
                            },
                        );
                    }
                    head = ChainHead {
                        seq: record.seq,
                        hash: record.hash,
                    };
                }
            }
            for (tenant, tenant_head) in &tenant_heads {
                sqlx::query(
                    "INSERT INTO audit_tenant_heads (tenant, seq, hash) VALUES ($1, $2, $3) \
                    ON CONFLICT (tenant) DO UPDATE SET seq = excluded.seq, hash = excluded.hash",
                )
                .bind(tenant)
                .bind(tenant_head.seq)
                .bind(&tenant_head.hash)
                .execute(&mut **tx)
                .await?;
            }
            Ok(head)
        }

        #[async_trait]
        impl AuditLog for $store {
            async fn append_audit(&self, entry: AuditEntry) -> Result<AuditRecord, StoreError> {
                let mut tx = self.write_tx().await?;
                let record = append_in(&mut tx, &self.subject_key, entry).await?;
                tx.commit().await?;
                Ok(record)
            }

            async fn audit_page(
                &self,
                after: i64,
                limit: i64,
                tenant: Option<&str>,
            ) -> Result<Vec<AuditRecord>, StoreError> {
                let rows = sqlx::query(
                    "SELECT seq, at, tenant, actor, action, request_id, subject_ref, \
                        target, target_ref, result, attempt, prev_hash, hash,
                            tenant_seq, tenant_prev_hash, tenant_hash, legacy_hash
                        FROM audit_events WHERE seq > $1 AND ($3 IS NULL OR tenant = \
                        $3) ORDER BY seq LIMIT $2",
                )
                .bind(after)
                .bind(limit)
                .bind(tenant)
                .fetch_all(&self.pool)
                .await?;
                rows.iter().map(audit_from_row).collect()
            }

            async fn audit_of(
                &self,
                tenant: &str,
                refs: &[String],
                limit: i64,
            ) -> Result<Vec<AuditRecord>, StoreError> {
                if refs.is_empty() {
                    return Ok(Vec::new());
                }
                let mut select = sqlx::QueryBuilder::<$db>::new(
                    "SELECT seq, at, tenant, actor, action, request_id, subject_ref, \
                        target, target_ref, result, attempt, prev_hash, hash,
                            tenant_seq, tenant_prev_hash, tenant_hash, legacy_hash
                        FROM audit_events WHERE tenant = ",
                );
                select
                    .push_bind(tenant.to_owned())
                    .push(" AND target_ref IN (");
                let mut each = select.separated(", ");
                for r in refs {
                    each.push_bind(r.clone());
                }
                select.push(") ORDER BY seq LIMIT ").push_bind(limit);
                let rows = select.build().fetch_all(&self.pool).await?;
                rows.iter().map(audit_from_row).collect()
            }

            async fn key_audit_chain(
                &self,
                at: DateTime<Utc>,
            ) -> Result<Option<ChainHead>, StoreError> {
                let key = self.subject_key.get().ok_or(StoreError::NoSubjectKey)?;
                let mut tx = self.write_tx().await?;
                let head = sqlx::query(<$store>::LOCK_AUDIT_HEAD)
                    .fetch_one(&mut *tx)
                    .await?;
                let version: i32 = head.try_get("chain_version")?;
                if version == crate::KEYED_CHAIN {
                    return Ok(None);
                }
                let old = ChainHead {
                    seq: head.try_get("seq")?,
                    hash: head.try_get("hash")?,
                };
                verify_unkeyed(&mut tx, &old).await?;
                let head = reseal(&mut tx, key).await?;
                sqlx::query(
                    "UPDATE audit_chain SET seq = $1, hash = $2, chain_version \
                    = $3, key_check = $4 WHERE id = 1",
                )
                .bind(head.seq)
                .bind(&head.hash)
                .bind(crate::KEYED_CHAIN)
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
                let row = sqlx::query(
                    "SELECT chain_version, key_check FROM \
                    audit_chain WHERE id = 1",
                )
                .fetch_one(&self.pool)
                .await?;
                let version: i32 = row.try_get("chain_version")?;
                Ok((
                    version == crate::KEYED_CHAIN,
                    row.try_get("key_check")?,
                ))
            }

            async fn tenant_heads(&self) -> Result<Vec<(String, ChainHead)>, StoreError> {
                let rows = sqlx::query(
                    "SELECT tenant, seq, hash FROM \
                    audit_tenant_heads ORDER BY tenant",
                )
                .fetch_all(&self.pool)
                .await?;
                rows.iter()
                    .map(|row| {
                        Ok((
                            row.try_get("tenant")?,
                            ChainHead {
                                seq: row.try_get("seq")?,
                                hash: row.try_get("hash")?,
                            },
                        ))
                    })
                    .collect()
            }

            async fn last_signed_heads(&self) -> Result<BTreeMap<String, i64>, StoreError> {
                let rows = sqlx::query(
                    "SELECT tenant, max(seq) AS seq FROM \
                    audit_signed_heads GROUP BY tenant",
                )
                .fetch_all(&self.pool)
                .await?;
                rows.iter()
                    .map(|row| Ok((row.try_get("tenant")?, row.try_get("seq")?)))
                    .collect()
            }

            async fn keep_signed_head(&self, head: &SignedHead) -> Result<(), StoreError> {
                sqlx::query(
                    "INSERT INTO audit_signed_heads (tenant, seq, hash, signed_at, \
                        public_key, signature) VALUES ($1, $2, $3, $4, $5, $6)
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

            async fn signed_heads(
                &self,
                tenant: Option<&str>,
            ) -> Result<Vec<SignedHead>, StoreError> {
                let rows = sqlx::query(
                    "SELECT tenant, seq, hash, signed_at, \
                    public_key, signature FROM audit_signed_heads WHERE tenant = $1 \
                    ORDER BY seq",
                )
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
                            signature: crate::HeadSignature::ed25519(
                                row.try_get("public_key")?,
                                row.try_get("signature")?,
                            ),
                        })
                    })
                    .collect()
            }

            async fn audit_head(&self, tenant: Option<&str>) -> Result<ChainHead, StoreError> {
                match tenant {
                    Some(tenant) => tenant_head_in(&self.pool, tenant).await,
                    None => {
                        let row = sqlx::query(
                            "SELECT seq, hash FROM audit_chain WHERE \
                            id = 1",
                        )
                        .fetch_one(&self.pool)
                        .await?;
                        Ok(ChainHead {
                            seq: row.try_get("seq")?,
                            hash: row.try_get("hash")?,
                        })
                    }
                }
            }
        }
    };
}
pub(crate) use audit_sql;
