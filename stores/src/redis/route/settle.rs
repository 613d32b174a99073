//! After Redis took a write: what lineage records of the keys it holds, unless a flip overtook
//! the write (then they are unlinked again and the write refused).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use lethe_policy::Stamp;

use super::{Connection, KEYS, refused_with, unavailable};
use crate::data::DataState;
use crate::data::lineage::LineageWriter;
use crate::data::overtaken::{Recording, keep_unless_overtaken};
use crate::redis::resp::Reply;
use crate::state::ItemRecord;

/// The most keys a route remembers the lineage row of.
pub(super) const RECORDED_KEYS: u64 = 100_000;

/// The stamp each key's lineage row holds, as this route recorded it. A key written again keeps
/// its deadline (a write over a key is clamped to the deadline it holds), so a session cache
/// rewritten all day would record the same row at every write: a write whose stamp is the one
/// recorded is only checked. A key that left Redis and came back holds a new deadline, so a row
/// marked deleted since (by another replica, the purge, the sweeper) is recorded again; and when
/// the lineage writer drops a batch, every row is forgotten, since it may have been one of them.
#[derive(Debug)]
pub(in crate::redis) struct Recorded {
    rows: moka::sync::Cache<String, Arc<Stamp>>,
    /// The lineage writer's dropped batches when `rows` was last looked at.
    drops_seen: std::sync::atomic::AtomicU64,
}

impl Recorded {
    pub(in crate::redis) fn new() -> Recorded {
        Recorded {
            rows: moka::sync::Cache::new(RECORDED_KEYS),
            drops_seen: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The rows remembered, none if `lineage` dropped a batch since the last look.
    fn rows(&self, lineage: &LineageWriter) -> &moka::sync::Cache<String, Arc<Stamp>> {
        let dropped = lineage.dropped();
        if self
            .drops_seen
            .swap(dropped, std::sync::atomic::Ordering::AcqRel)
            != dropped
        {
            self.rows.invalidate_all();
        }
        &self.rows
    }
}

impl Connection<'_> {
    /// After Redis took a command: the keys it removed are marked deleted in lineage, and the
    /// keys it holds written are kept unless a flip overtook the write (the data plane's own
    /// step: the overtaken keys are unlinked again and the write refused; those that cannot be
    /// are recorded for the purge), recorded in lineage for the dry run, the inventory and the
    /// sweeper (which unlinks a revoked consent's keys).
    pub(super) async fn settled(
        &mut self,
        written: &[(String, Stamp)],
        deleted: &[String],
        answer: Reply,
    ) -> Reply {
        if matches!(answer, Reply::Error(_)) {
            return answer;
        }
        let now = crate::now();
        let state: &DataState = self.state;
        let recorded = self.recorded.rows(&state.lineage);
        if !deleted.is_empty() {
            for key in deleted {
                recorded.invalidate(key);
            }
            if self
                .state
                .store
                .mark_items_deleted(&self.route.name, KEYS, deleted, now)
                .await
                .is_err()
            {
                return unavailable("state_unavailable", "the state store cannot be written");
            }
        }
        let (known, new): (Vec<_>, Vec<_>) = written.iter().partition(|(key, stamp)| {
            recorded
                .get(key.as_str())
                .is_some_and(|held| *held == *stamp)
        });
        // Both groups are checked whatever the first found: a flip that overtook one key of a
        // write overtook its other keys too, and each is undone.
        let mut refusal = None;
        for (group, recording) in [(known, Recording::Known), (new, Recording::Batched)] {
            if group.is_empty() {
                continue;
            }
            let kept = self.keep(&group, recording, now).await;
            for (key, stamp) in group {
                match kept {
                    Ok(()) if recording == Recording::Batched => {
                        recorded.insert(key.clone(), Arc::new(stamp.clone()));
                    }
                    Ok(()) => {}
                    // What was undone (or not) is recorded as it is: found again next time.
                    Err(_) => recorded.invalidate(key.as_str()),
                }
            }
            if let Err(e) = kept {
                refusal.get_or_insert(e);
            }
        }
        match refusal {
            None => answer,
            Some(e) if e.status == hyper::StatusCode::SERVICE_UNAVAILABLE => {
                unavailable(e.code.as_str(), &e.message)
            }
            Some(e) => refused_with(e.code.as_str(), &e.message),
        }
    }

    /// Keeps the keys `written` (of one tenant) unless a flip overtook them: those are unlinked.
    pub(super) async fn keep(
        &mut self,
        written: &[&(String, Stamp)],
        recording: Recording,
        now: DateTime<Utc>,
    ) -> Result<(), crate::data::error::DataError> {
        let Some((_, first)) = written.first() else {
            return Ok(());
        };
        let tenant = first.tenant.clone();
        let rows = written
            .iter()
            .map(|(key, stamp)| {
                ItemRecord::stamped(
                    &self.route.name,
                    KEYS,
                    key.clone(),
                    stamp.clone(),
                    now,
                    None,
                )
            })
            .collect();
        let state: &Arc<DataState> = self.state;
        let undo = |overtaken: Vec<ItemRecord>| async move {
            let unlink: Vec<Vec<u8>> = std::iter::once(b"UNLINK".to_vec())
                .chain(overtaken.iter().map(|r| r.item_id.as_bytes().to_vec()))
                .collect();
            match self.call(&[unlink]).await {
                Ok(_) => Vec::new(),
                Err(_) => overtaken,
            }
        };
        keep_unless_overtaken(state, &tenant, rows, recording, None, undo).await
    }
}
