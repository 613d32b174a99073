//! Helpers for tests: those of the state store (`lethe_state::testing`), and stand-ins of the
//! purge's connectors.

use std::sync::Arc;

pub use lethe_state::testing::*;

/// The subjects of one purge, known by key, in tests.
pub fn subjects(tenant: &str, keys: &[&str]) -> crate::purge::Subjects {
    crate::purge::Subjects::new(
        tenant,
        keys.iter().map(|k| (*k).to_owned()).collect(),
        Arc::from(AUDIT_KEY),
    )
}

/// A stand-in store that holds what lineage names and `extra` records lineage does not know;
/// it refuses to purge (the dry run's tests).
pub struct Holding {
    pub extra: u64,
}

#[async_trait::async_trait]
impl crate::purge::Connector for Holding {
    async fn purge(
        &self,
        _: &crate::purge::Subjects,
        _: &[(String, String)],
    ) -> Result<crate::purge::PurgeReport, crate::purge::ConnectorError> {
        Err(crate::purge::ConnectorError::Unavailable(
            "a dry run purges nothing".into(),
        ))
    }

    async fn count(
        &self,
        _: &crate::purge::Subjects,
        lineage: &[(String, String)],
    ) -> Result<u64, crate::purge::ConnectorError> {
        Ok(lineage.len() as u64 + self.extra)
    }
}
