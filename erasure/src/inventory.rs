//! The dry run of an erasure: what lineage records of a subject in each store, and what each
//! store itself holds, found as its purge would find it, with nothing changed. Shown before a
//! request is filed, so the DPO sees its scope.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::Target;
use crate::purge::Subjects;
use crate::state::{Store, StoreError};

/// The purge targets of the configuration, to be counted.
pub struct Inventory {
    store: Arc<dyn Store>,
    targets: Vec<(String, Target)>,
    audit_key: Arc<[u8]>,
    /// How long one store may take to count: one that does not answer is `unknown`, not a wait.
    timeout: Duration,
}

/// One store's share of a subject, before the erasure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoreCount {
    /// The erasure target, e.g. `chroma:<route>`.
    pub target: String,
    /// The lineage ids the store is searched by.
    pub lineage: u64,
    /// What the store holds of the subject now, by its own count; absent when it could not be
    /// asked (then `unknown` says why).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unknown: Option<String>,
}

impl Inventory {
    /// `targets`: erasure target name -> target, in the order they are shown; each store is
    /// given `timeout` to count.
    pub fn new(
        store: Arc<dyn Store>,
        targets: Vec<(String, Target)>,
        audit_key: Arc<[u8]>,
        timeout: Duration,
    ) -> Inventory {
        Inventory {
            store,
            targets,
            audit_key,
            timeout,
        }
    }

    /// Each store's count of the subject `keys` (a subject and its aliases) of `tenant`, asked
    /// of every store at once. Lineage must be readable; a store that cannot count is `unknown`.
    pub async fn count(
        &self,
        tenant: &str,
        keys: Vec<String>,
    ) -> Result<Vec<StoreCount>, StoreError> {
        let subjects = Subjects::new(tenant, keys, Arc::clone(&self.audit_key));
        let mut asked = tokio::task::JoinSet::new();
        let mut counts = Vec::with_capacity(self.targets.len());
        for (i, (name, target)) in self.targets.iter().enumerate() {
            let lineage = target.lineage(self.store.as_ref(), &subjects).await?;
            counts.push(StoreCount {
                target: name.clone(),
                lineage: lineage.len() as u64,
                held: None,
                unknown: None,
            });
            let (connector, subjects) = (Arc::clone(&target.connector), subjects.clone());
            let timeout = self.timeout;
            asked.spawn(async move {
                let counted =
                    tokio::time::timeout(timeout, connector.count(&subjects, &lineage)).await;
                (i, counted)
            });
        }
        while let Some(answer) = asked.join_next().await {
            let Ok((i, counted)) = answer else {
                continue;
            };
            let Some(count) = counts.get_mut(i) else {
                continue;
            };
            match counted {
                Ok(Ok(n)) => count.held = Some(n),
                Ok(Err(e)) => count.unknown = Some(e.to_string()),
                Err(_) => {
                    count.unknown = Some(format!(
                        "the store did not answer within {} ms",
                        self.timeout.as_millis()
                    ));
                }
            }
        }
        for count in &mut counts {
            if count.held.is_none() && count.unknown.is_none() {
                count.unknown = Some("the count failed inside Lethe".into());
            }
        }
        Ok(counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Holding, item};
    use crate::{Connector, ConnectorError, PurgeReport};
    use async_trait::async_trait;

    /// Never answers.
    struct Silent;

    #[async_trait]
    impl Connector for Silent {
        async fn purge(
            &self,
            _: &Subjects,
            _: &[(String, String)],
        ) -> Result<PurgeReport, ConnectorError> {
            std::future::pending().await
        }

        async fn count(&self, _: &Subjects, _: &[(String, String)]) -> Result<u64, ConnectorError> {
            std::future::pending().await
        }
    }

    #[tokio::test]
    async fn each_store_is_counted_beside_lineage_and_a_silent_one_is_unknown() {
        let store = crate::testing::migrated(&crate::testing::fresh_sqlite_url()).await;
        store
            .record_items(&[
                item("chroma", "a", "u1"),
                item("chroma", "b", "u1-old"),
                item("chroma", "c", "u2"),
            ])
            .await
            .unwrap();
        let target = |connector: Arc<dyn Connector>| Target::own("chroma", connector);
        let inventory = Inventory::new(
            Arc::clone(&store),
            vec![
                (
                    "chroma:chroma".into(),
                    target(Arc::new(Holding { extra: 1 })),
                ),
                ("chroma:stuck".into(), target(Arc::new(Silent))),
            ],
            Arc::from(crate::testing::AUDIT_KEY),
            Duration::from_millis(200),
        );
        let counts = inventory
            .count("acme", vec!["u1".into(), "u1-old".into()])
            .await
            .unwrap();
        assert_eq!(
            counts[0],
            StoreCount {
                target: "chroma:chroma".into(),
                lineage: 2,
                held: Some(3),
                unknown: None,
            },
            "the subject's two items and its alias's, plus one only the store knows"
        );
        assert_eq!((counts[1].lineage, counts[1].held), (2, None));
        assert_eq!(
            counts[1].unknown.as_deref(),
            Some("the store did not answer within 200 ms")
        );
    }
}
