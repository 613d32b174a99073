//! The step every route takes once a store has taken a write: a flip may have committed while
//! the write was in flight (decided before it, landed after it), of the write's own subject or of
//! a subject it derives from. What it overtook is undone and the write refused, so that nothing
//! lands behind an erasure's purge; the rest is recorded.

use std::future::Future;

use lethe_policy::{Refusal, still_current};

use super::DataState;
use super::derivation::Derivations;
use super::error::DataError;
use crate::state::ItemRecord;

/// When a write's lineage rows are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recording {
    /// Before the check, at once: the store holds no stamp of its own, so the row is the only
    /// trace of the item until the check is done (provider objects). Undone rows are marked
    /// deleted.
    First,
    /// After the check, at once: the client's next request is decided on the row (threads).
    AtOnce,
    /// After the check, in the lineage writer's next batch (items the store keeps stamped);
    /// the write waits for the batch when one of its records is derived, as an erasure decides
    /// a derivative on its row.
    Batched,
    /// Never: the rows are in lineage already, as they are (a key written again with the stamp
    /// it held). Only checked; undone rows are marked deleted.
    Known,
}

/// Keeps what the store took (`rows`, of one store and collection), or undoes what a flip
/// overtook (of a row's subject, or of a subject one of its `derived` parents is of): `undo` is
/// given the overtaken rows and answers those it could not undo, which stay recorded for the
/// purge to find. Refuses with the overtaking flip's reason when anything was overtaken.
pub async fn keep_unless_overtaken<F, Fut>(
    state: &DataState,
    tenant: &str,
    rows: Vec<ItemRecord>,
    recording: Recording,
    derived: Option<&Derivations>,
    undo: F,
) -> Result<(), DataError>
where
    F: FnOnce(Vec<ItemRecord>) -> Fut,
    Fut: Future<Output = Vec<ItemRecord>>,
{
    if recording == Recording::First {
        state.store.record_items(&rows).await?;
    }
    // Collected first: iterator adaptors held across the await would make the future not Send.
    let subjects: Vec<&str> = rows
        .iter()
        .map(|r| r.subject.as_str())
        .chain(derived.into_iter().flat_map(Derivations::owners))
        .collect();
    let view = state.policy.view(tenant, subjects).await?;
    let mut refusal: Option<Refusal> = None;
    let still = |row: &ItemRecord| {
        still_current(&view, &row.stamp())?;
        match derived.and_then(|d| d.of(&row.item_id)) {
            Some(derivation) => derivation.check(&view, tenant),
            None => Ok(()),
        }
    };
    let (current, overtaken): (Vec<_>, Vec<_>) =
        rows.into_iter().partition(|row| match still(row) {
            Ok(()) => true,
            Err(r) => {
                refusal.get_or_insert(r);
                false
            }
        });
    let left = if overtaken.is_empty() {
        Vec::new()
    } else {
        let ids: Vec<String> = overtaken.iter().map(|r| r.item_id.clone()).collect();
        let left = undo(overtaken.clone()).await;
        if matches!(recording, Recording::First | Recording::Known) {
            // The rows are in already: mark those undone deleted.
            let undone: Vec<String> = ids
                .into_iter()
                .filter(|id| !left.iter().any(|r| r.item_id == *id))
                .collect();
            if let Some(row) = overtaken.first() {
                state
                    .store
                    .mark_items_deleted(&row.store, &row.collection, &undone, crate::now())
                    .await?;
            }
        }
        left
    };
    match recording {
        Recording::First | Recording::Known => {}
        Recording::AtOnce => {
            let kept: Vec<ItemRecord> = current.into_iter().chain(left).collect();
            state.store.record_items(&kept).await?;
        }
        Recording::Batched => {
            let kept: Vec<ItemRecord> = current.into_iter().chain(left).collect();
            let derives = |row: &ItemRecord| {
                derived
                    .and_then(|d| d.of(&row.item_id))
                    .is_some_and(|r| !r.parents.is_empty())
            };
            if kept.iter().any(derives) {
                if !state.lineage.record_now(kept).await {
                    return Err(DataError::new(
                        hyper::StatusCode::SERVICE_UNAVAILABLE,
                        crate::error_shape::Code::StateUnavailable,
                        "the state store is unavailable",
                    ));
                }
            } else {
                state.lineage.record(kept).await;
            }
        }
    }
    refusal.map_or(Ok(()), |r| Err(r.into()))
}
