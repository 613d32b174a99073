//! What a store must do to be purged: the [`Connector`] trait every store's connector
//! implements, what a purge reports, how it fails, and the subject's keys it is given. The erasure
//! worker (`erasure/`) drives connectors; the stores (`stores/`, and the erasure-only stores in
//! `erasure/`) implement them; neither is imported here.

pub mod error;
pub mod physical;
mod subjects;

use async_trait::async_trait;
use serde::Serialize;

use crate::state::ExpiredItem;
pub use error::ConnectorError;
pub use physical::{Copy, Physical};
pub use subjects::Subjects;

/// What one store held of a subject, and what is left.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PurgeReport {
    pub before: u64,
    pub deleted: u64,
    pub remaining: u64,
    /// What the purge removed from the store's files, and every copy that remains.
    pub physical: physical::Physical,
    /// Records the verification probe found that still belong to the subject (stores the probe
    /// searches only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_hits: Option<u64>,
}

impl PurgeReport {
    /// A purge before it counts anything: the copies the store keeps, and whether it probes
    /// (then its hits start at zero).
    pub fn starting(physical: physical::Physical, probing: bool) -> PurgeReport {
        PurgeReport {
            before: 0,
            deleted: 0,
            remaining: 0,
            physical,
            probe_hits: probing.then_some(0),
        }
    }
}

/// A store Lethe can purge.
#[async_trait]
pub trait Connector: Send + Sync {
    /// Deletes every record of `subjects` (by stamp and by the lineage ids given), and counts
    /// what remains. Lineage rows of the deleted items are the caller's to mark.
    async fn purge(
        &self,
        subjects: &Subjects,
        lineage: &[(String, String)],
    ) -> Result<PurgeReport, ConnectorError>;

    /// Counts what the store holds of `subjects`, found as [`Connector::purge`] finds it (by
    /// stamp and by the lineage ids given), changing nothing: the dry-run inventory shown before
    /// an erasure is filed.
    async fn count(
        &self,
        subjects: &Subjects,
        lineage: &[(String, String)],
    ) -> Result<u64, ConnectorError>;

    /// Deletes items whose retention lineage says has run out (the retention sweeper's work);
    /// answers how many the store deleted. Where items carry their stamp, an item the store holds
    /// under another owner's stamp is that owner's, not the expired one: it stays. Stores Lethe
    /// does not write items to have none.
    async fn delete_items(
        &self,
        collection: &str,
        items: &[ExpiredItem],
    ) -> Result<u64, ConnectorError> {
        let _ = items;
        Err(ConnectorError::Misconfigured(format!(
            "{collection}: this store holds no items Lethe tracks"
        )))
    }

    /// How many of `items` the store still holds for the owner lineage names (an item it holds
    /// under another owner's stamp is not that owner's): how an erased derivative is verified
    /// gone. Stores Lethe does not write items to hold none of them.
    async fn held_items(
        &self,
        collection: &str,
        items: &[ExpiredItem],
    ) -> Result<u64, ConnectorError> {
        let _ = items;
        Err(ConnectorError::Misconfigured(format!(
            "{collection}: this store holds no items Lethe tracks"
        )))
    }

    /// Brings what an earlier Lethe wrote into the shape this one reads (Chroma: the owner key
    /// of records stamped before it); answers how many items it changed. The sweeper runs it at
    /// start, and at every sweep after until a pass fails nowhere and changes nothing.
    async fn upgrade(&self) -> Result<u64, ConnectorError> {
        Ok(0)
    }
}
