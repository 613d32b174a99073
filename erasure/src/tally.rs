//! What a store's purge attempts found and deleted, counted across attempts: an attempt that
//! deletes and then fails (the probe found an unattributed record, some remain) keeps its counts
//! for the next, so that the certificate says what the store held and what went, not only what
//! the last attempt saw. Pure: no I/O.

use serde::{Deserialize, Serialize};

use crate::purge::PurgeReport;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    /// The first count taken, before anything was deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<u64>,
    /// Every attempt's deletions.
    pub deleted: u64,
    /// Attempts that ended before their connector could count (an error in the middle of a
    /// purge may have deleted records no count shows): the certificate says so.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub uncounted_attempts: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Tally {
    /// The tally earlier attempts left with the job; none before the first.
    pub fn of(earlier: Option<&serde_json::Value>) -> Tally {
        earlier
            .and_then(|value| serde_json::from_value(value.clone()).ok())
            .unwrap_or_default()
    }

    /// With an attempt that counted.
    pub fn counted(self, report: &PurgeReport) -> Tally {
        Tally {
            before: self.before.or(Some(report.before)),
            deleted: self.deleted.saturating_add(report.deleted),
            ..self
        }
    }

    /// With an attempt that ended before it could count.
    pub fn uncounted(self) -> Tally {
        Tally {
            uncounted_attempts: self.uncounted_attempts.saturating_add(1),
            ..self
        }
    }

    /// The report of the last attempt, with the counts of every attempt.
    pub fn into_report(self, mut report: PurgeReport) -> PurgeReport {
        report.before = self.before.unwrap_or(report.before);
        report.deleted = self.deleted;
        report
    }

    pub fn value(self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(before: u64, deleted: u64, remaining: u64) -> PurgeReport {
        PurgeReport {
            before,
            deleted,
            remaining,
            physical: Default::default(),
            probe_hits: None,
        }
    }

    #[test]
    fn before_is_the_first_count_and_deletions_add_up() {
        let cases = [
            // (attempts as (before, deleted) or None for uncounted, before, deleted, uncounted)
            (vec![Some((5, 5)), Some((0, 0))], 5, 5, 0),
            (vec![Some((5, 3)), Some((2, 2))], 5, 5, 0),
            (vec![None, Some((4, 4))], 4, 4, 1),
            (vec![Some((7, 7))], 7, 7, 0),
        ];
        for (attempts, before, deleted, uncounted) in cases {
            let mut tally = Tally::of(None);
            for attempt in &attempts {
                // Through the job's stored result, as the next attempt reads it.
                let stored = tally.value();
                tally = match attempt {
                    Some((b, d)) => Tally::of(Some(&stored)).counted(&report(*b, *d, 0)),
                    None => Tally::of(Some(&stored)).uncounted(),
                };
            }
            let last = tally.into_report(report(0, 0, 0));
            assert_eq!(
                (last.before, last.deleted, tally.uncounted_attempts),
                (before, deleted, uncounted),
                "{attempts:?}"
            );
        }
    }

    #[test]
    fn a_result_that_is_no_tally_starts_afresh() {
        for junk in [serde_json::json!("x"), serde_json::json!({"before": "5"})] {
            assert_eq!(Tally::of(Some(&junk)), Tally::default());
        }
    }
}
