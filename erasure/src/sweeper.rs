//! The retention sweeper: items whose `expires_at` has passed (or whose consent was revoked) are
//! deleted from their store in the background, unless a legal hold covers them. Reads hide them
//! already, so the sweeper's lag never leaks anything. What the replicas share of the lineage
//! window is dropped once it is older than the window.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use lethe_policy::audit::AuditEntry;

use super::route_connectors;
use crate::config::Config;
use crate::data::forward::Route;
use crate::purge::Connector;
use crate::state::{ExpiredItem, Store, StoreError};

pub struct Sweeper {
    store: Arc<dyn Store>,
    /// Lineage store name (the route) -> its connector.
    connectors: HashMap<String, Arc<dyn Connector>>,
    interval: Duration,
    /// `[lineage] window`.
    window: Duration,
    /// Where each sweep is counted.
    metrics: Arc<crate::data::metrics::DataMetrics>,
}

impl Sweeper {
    pub fn from_config(
        config: &Config,
        routes: &[Route],
        store: Arc<dyn Store>,
        audit_key: &Arc<[u8]>,
    ) -> Result<Sweeper, String> {
        let connectors = route_connectors(config, routes, audit_key)?
            .into_iter()
            .map(|c| (c.route, c.connector))
            .collect();
        Ok(Sweeper {
            store,
            connectors,
            interval: config.erasure.sweep_interval.0,
            window: config.lineage.window.0,
            metrics: Arc::default(),
        })
    }

    /// The same sweeper, its sweeps counted in `metrics`.
    pub fn observed_by(self, metrics: Arc<crate::data::metrics::DataMetrics>) -> Self {
        Sweeper { metrics, ..self }
    }

    /// Sweeps every `interval` until `stop`, which also ends a pass under way: an interrupted
    /// pass leaves its rows live, and the next one (after a restart) deletes them again.
    pub async fn run(self, stop: impl Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        let mut to_upgrade: Vec<&String> = self.connectors.keys().collect();
        loop {
            tokio::select! {
                () = self.pass(&mut to_upgrade) => {}
                () = &mut stop => return,
            }
            tokio::select! {
                () = tokio::time::sleep(self.interval) => {}
                () = &mut stop => return,
            }
        }
    }

    /// One pass: items of an earlier Lethe brought up to date (`to_upgrade`: the routes whose
    /// last upgrade changed something or failed), then expired items deleted.
    async fn pass<'a>(&'a self, to_upgrade: &mut Vec<&'a String>) {
        for route in std::mem::take(to_upgrade) {
            match self.connectors[route].upgrade().await {
                Ok(0) => {}
                // Again until a pass finds nothing: one that ran beside deletes may have
                // skipped records.
                Ok(n) => {
                    tracing::info!(route = %route, items = n, "items written by an earlier Lethe brought up to date");
                    to_upgrade.push(route);
                }
                Err(e) => {
                    tracing::warn!(route = %route, error = %e, "items written by an earlier Lethe not brought up to date yet; retrying at the next sweep");
                    to_upgrade.push(route);
                }
            }
        }
        let swept = self.sweep_once().await;
        self.metrics.swept(swept.as_ref().ok().copied());
        match swept {
            Ok(0) => {}
            Ok(n) => tracing::info!(items = n, "retention sweep deleted expired items"),
            Err(e) => tracing::warn!(error = %e, "retention sweep could not reach the state store"),
        }
    }

    /// One pass over at most 1000 expired items; answers how many were deleted.
    pub async fn sweep_once(&self) -> Result<u64, StoreError> {
        let now = crate::now();
        if let Some(shared) = self.store.shared_memory() {
            let window = chrono::TimeDelta::from_std(self.window).unwrap_or(chrono::TimeDelta::MAX);
            shared.forget_before(now - window).await?;
        }
        let mut by_place: BTreeMap<(String, String), Vec<ExpiredItem>> = BTreeMap::new();
        for item in self.store.expired_items(now, 1000).await? {
            by_place
                .entry((item.store.clone(), item.collection.clone()))
                .or_default()
                .push(item);
        }
        let mut swept = 0;
        for ((store, collection), items) in by_place {
            let Some(connector) = self.connectors.get(&store) else {
                tracing::warn!(%store, "expired items in a store this configuration cannot purge");
                continue;
            };
            let ids: Vec<String> = items.iter().map(|i| i.item_id.clone()).collect();
            let result = match connector.delete_items(&collection, &items).await {
                Ok(_) => {
                    self.store
                        .mark_items_deleted(&store, &collection, &ids, now)
                        .await?;
                    swept += ids.len() as u64;
                    "ok"
                }
                Err(e) => {
                    tracing::warn!(%store, error = %e, "retention sweep failed; retrying next pass");
                    "failed"
                }
            };
            // One event per tenant whose items the pass took up, so each tenant sees its own.
            let mut per_tenant: BTreeMap<&str, usize> = BTreeMap::new();
            for item in &items {
                *per_tenant.entry(item.tenant.as_str()).or_default() += 1;
            }
            for (tenant, n) in per_tenant {
                self.store
                    .append_audit(AuditEntry {
                        at: crate::now(),
                        tenant: Some(tenant.to_owned()),
                        actor: "retention-sweeper".into(),
                        action: "retention.sweep".into(),
                        request_id: format!("sweep-{}", now.timestamp()),
                        subject_ref: None,
                        target: format!("{store}/{collection}"),
                        target_ref: Some(n.to_string()),
                        result: result.into(),
                        attempt: 1,
                    })
                    .await?;
            }
        }
        Ok(swept)
    }
}
