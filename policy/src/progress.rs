//! How an erasure request moves on as its purge jobs finish: a pure function of the request's
//! state, every job's state and what verification found. The rules, as compliance staff read
//! them, are the cases in `policy/tests/erasure_progress.toml`.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::erasure::{ErasureEvent, ErasureState, IllegalTransition, transition};

/// Where one store's purge job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Filed with a request that is not yet flipped (held, awaiting approval).
    Waiting,
    /// Due to run.
    Pending,
    /// Claimed by a worker.
    Running,
    /// Failed; runs again after its backoff.
    Retrying,
    Done,
    /// Failed for good (attempts used up, or a failure no retry can mend): a person must look.
    Exception,
}

impl JobState {
    pub const ALL: [JobState; 6] = [
        JobState::Waiting,
        JobState::Pending,
        JobState::Running,
        JobState::Retrying,
        JobState::Done,
        JobState::Exception,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Waiting => "waiting",
            JobState::Pending => "pending",
            JobState::Running => "running",
            JobState::Retrying => "retrying",
            JobState::Done => "done",
            JobState::Exception => "exception",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == s)
    }

    /// The state a job's attempt leaves it in.
    pub fn after(attempt: Attempt) -> JobState {
        match attempt {
            Attempt::Done => JobState::Done,
            Attempt::Failed { again: true } => JobState::Retrying,
            Attempt::Failed { again: false } => JobState::Exception,
        }
    }
}

/// How one attempt at a store's purge ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    Done,
    /// `again`: another attempt will follow (attempts are left, and the failure is one a retry
    /// may mend).
    Failed {
        again: bool,
    },
}

/// What follows for the request once a job has finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// The request's steps, in order; `state` is where they lead.
    pub events: Vec<ErasureEvent>,
    pub state: ErasureState,
    /// The request's audit events, in order (`erasure.complete`, ...).
    pub audit: Vec<&'static str>,
    /// Stores whose purge runs again: verification found the subject still there.
    pub rerun: Vec<String>,
}

impl Progress {
    /// The request is completed: its subjects are erased and a tombstone is kept.
    pub fn completed(&self) -> bool {
        self.state == ErasureState::Completed
    }
}

/// Verification is due once every job is done: then the caller finds the stores where lineage
/// still holds a live row of the subject (or an erased derivative is still held), and the
/// derivatives still waiting for a person, for [`progress`].
pub fn verification_due(jobs: &[(String, JobState)]) -> bool {
    jobs.iter().all(|(_, s)| *s == JobState::Done)
}

/// What verification found, once every job was done.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Verification {
    /// Stores where the subject, or a derivative decided for erasure, is still found.
    #[serde(default)]
    pub unverified: BTreeSet<String>,
    /// Derivatives stamped to other subjects that a person has yet to erase or release.
    #[serde(default)]
    pub undecided: usize,
}

/// The request's next steps, given its state, every job's state (the one just finished
/// included) and what verification found (only read when every job is done).
///
/// - A job in `exception`: the request goes to `exception` for a person (through `retrying`).
/// - Every job done: verification. Not clean: back to `propagating` with the unclean stores'
///   purges run again. Clean, but derivatives of other subjects undecided: the request waits in
///   `verifying` until a person decides them. Clean and decided: `completed`.
/// - A job retrying: the request is `retrying`.
/// - Otherwise (jobs still running): nothing changes.
pub fn progress(
    state: ErasureState,
    jobs: &[(String, JobState)],
    found: &Verification,
) -> Result<Progress, IllegalTransition> {
    use ErasureEvent as E;
    let any = |s: JobState| jobs.iter().any(|(_, j)| *j == s);
    let mut events = Vec::new();
    let mut audit = Vec::new();
    let mut rerun = Vec::new();
    let mut now = state;
    let mut go = |event: ErasureEvent, now: &mut ErasureState| -> Result<(), IllegalTransition> {
        *now = transition(*now, event)?;
        events.push(event);
        Ok(())
    };
    if any(JobState::Exception) {
        if now == ErasureState::Propagating {
            go(E::PurgeFailed, &mut now)?;
        }
        if now == ErasureState::Retrying {
            go(E::RetriesExhausted, &mut now)?;
            audit.push("erasure.exception");
        }
    } else if verification_due(jobs) {
        // A request waiting in `verifying` is looked at again as decisions come in.
        let waiting = now == ErasureState::Verifying;
        if !waiting {
            go(E::PurgeDone, &mut now)?;
        }
        if !found.unverified.is_empty() {
            go(E::VerificationFailed, &mut now)?;
            rerun = jobs
                .iter()
                .filter(|(target, _)| found.unverified.contains(target))
                .map(|(target, _)| target.clone())
                .collect();
            audit.push("erasure.verification_failed");
        } else if found.undecided > 0 {
            if !waiting {
                audit.push("erasure.awaiting_review");
            }
        } else {
            go(E::Verified, &mut now)?;
            audit.push("erasure.complete");
        }
    } else if any(JobState::Retrying) && now == ErasureState::Propagating {
        go(E::PurgeFailed, &mut now)?;
    }
    Ok(Progress {
        events,
        state: now,
        audit,
        rerun,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_job() -> impl Strategy<Value = JobState> {
        proptest::sample::select(JobState::ALL.to_vec())
    }

    proptest! {
        /// Nothing but a clean verification of every store, with every derivative decided,
        /// completes a request; a failure never makes it less suppressed than it was.
        #[test]
        fn only_every_store_done_and_clean_completes(
            state in proptest::sample::select(vec![ErasureState::Propagating, ErasureState::Retrying]),
            jobs in proptest::collection::vec(any_job(), 1..5),
            dirty in proptest::collection::vec(any::<bool>(), 5),
            undecided in 0usize..3,
        ) {
            let jobs: Vec<(String, JobState)> =
                jobs.into_iter().enumerate().map(|(i, j)| (format!("t{i}"), j)).collect();
            let unverified: BTreeSet<String> = jobs
                .iter()
                .zip(&dirty)
                .filter(|(_, d)| **d)
                .map(|((t, _), _)| t.clone())
                .collect();
            let found = Verification { unverified: unverified.clone(), undecided };
            let next = progress(state, &jobs, &found).unwrap();
            if next.completed() {
                prop_assert!(jobs.iter().all(|(_, j)| *j == JobState::Done));
                prop_assert!(unverified.is_empty());
                prop_assert_eq!(undecided, 0);
            }
            prop_assert!(next.state.is_suppressed());
            prop_assert!(next.rerun.iter().all(|t| unverified.contains(t)));
        }
    }

    #[test]
    fn job_states_round_trip_and_follow_attempts() {
        for s in JobState::ALL {
            assert_eq!(JobState::parse(s.as_str()), Some(s));
        }
        assert_eq!(JobState::parse("finished"), None);
        assert_eq!(JobState::after(Attempt::Done), JobState::Done);
        assert_eq!(
            JobState::after(Attempt::Failed { again: true }),
            JobState::Retrying
        );
        assert_eq!(
            JobState::after(Attempt::Failed { again: false }),
            JobState::Exception
        );
    }
}
