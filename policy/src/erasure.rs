//! The erasure request state machine, as pure transitions.
//!
//! `requested -> authorized -> suppressed -> propagating <-> retrying -> verifying -> completed`,
//! with `rejected`, `held` (legal hold) and `exception -> manual_review -> propagating`. Where
//! governed databases must apply a flip too, `authorized -> propagating -> suppressed`: the
//! request says `suppressed` only once the flip holds in every one of them.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErasureState {
    Requested,
    Authorized,
    Held,
    Suppressed,
    Propagating,
    Retrying,
    Verifying,
    Completed,
    Rejected,
    Exception,
    ManualReview,
}

impl ErasureState {
    pub const ALL: [ErasureState; 11] = [
        ErasureState::Requested,
        ErasureState::Authorized,
        ErasureState::Held,
        ErasureState::Suppressed,
        ErasureState::Propagating,
        ErasureState::Retrying,
        ErasureState::Verifying,
        ErasureState::Completed,
        ErasureState::Rejected,
        ErasureState::Exception,
        ErasureState::ManualReview,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErasureState::Requested => "requested",
            ErasureState::Authorized => "authorized",
            ErasureState::Held => "held",
            ErasureState::Suppressed => "suppressed",
            ErasureState::Propagating => "propagating",
            ErasureState::Retrying => "retrying",
            ErasureState::Verifying => "verifying",
            ErasureState::Completed => "completed",
            ErasureState::Rejected => "rejected",
            ErasureState::Exception => "exception",
            ErasureState::ManualReview => "manual_review",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == s)
    }

    pub fn is_final(self) -> bool {
        matches!(self, ErasureState::Completed | ErasureState::Rejected)
    }

    /// From `suppressed` on, the subject is unreadable; nothing may take that back.
    pub fn is_suppressed(self) -> bool {
        matches!(
            self,
            ErasureState::Suppressed
                | ErasureState::Propagating
                | ErasureState::Retrying
                | ErasureState::Verifying
                | ErasureState::Completed
                | ErasureState::Exception
                | ErasureState::ManualReview
        )
    }
}

impl fmt::Display for ErasureState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErasureEvent {
    /// The required approvals are in.
    Authorize,
    Reject,
    /// A legal hold covers the subject at the moment of the flip.
    HoldPlaced,
    HoldReleased,
    /// Subject state and epoch committed, invalidation broadcast.
    Suppress,
    /// Subject state and epoch committed in the state store, not yet applied by every governed
    /// database (its open transactions may still read or write the subject).
    FlipPending,
    /// The last governed database applied the flip: it holds everywhere.
    FlipApplied,
    PurgeStarted,
    PurgeFailed,
    RetryStarted,
    RetriesExhausted,
    Escalate,
    /// An operator resolved the exception and sends the purge out again.
    Resume,
    PurgeDone,
    VerificationFailed,
    Verified,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an erasure request in state {from} cannot take {event:?}")]
pub struct IllegalTransition {
    pub from: ErasureState,
    pub event: ErasureEvent,
}

/// The next state, or a refusal naming the illegal step.
pub fn transition(
    from: ErasureState,
    event: ErasureEvent,
) -> Result<ErasureState, IllegalTransition> {
    use ErasureEvent as E;
    use ErasureState as S;
    let to = match (from, event) {
        (S::Requested, E::Authorize) => S::Authorized,
        (S::Requested | S::Authorized | S::Held, E::Reject) => S::Rejected,
        (S::Authorized, E::HoldPlaced) => S::Held,
        (S::Held, E::HoldReleased) => S::Authorized,
        (S::Authorized, E::Suppress) => S::Suppressed,
        (S::Authorized, E::FlipPending) => S::Propagating,
        (S::Propagating, E::FlipApplied) => S::Suppressed,
        (S::Suppressed, E::PurgeStarted) => S::Propagating,
        (S::Propagating | S::Verifying, E::PurgeFailed) => S::Retrying,
        (S::Retrying, E::RetryStarted) => S::Propagating,
        (S::Retrying, E::RetriesExhausted) => S::Exception,
        (S::Exception, E::Escalate) => S::ManualReview,
        (S::ManualReview, E::Resume) => S::Propagating,
        (S::Propagating | S::Retrying, E::PurgeDone) => S::Verifying,
        (S::Verifying, E::VerificationFailed) => S::Propagating,
        (S::Verifying, E::Verified) => S::Completed,
        _ => return Err(IllegalTransition { from, event }),
    };
    Ok(to)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const EVENTS: [ErasureEvent; 16] = [
        ErasureEvent::Authorize,
        ErasureEvent::Reject,
        ErasureEvent::HoldPlaced,
        ErasureEvent::HoldReleased,
        ErasureEvent::Suppress,
        ErasureEvent::FlipPending,
        ErasureEvent::FlipApplied,
        ErasureEvent::PurgeStarted,
        ErasureEvent::PurgeFailed,
        ErasureEvent::RetryStarted,
        ErasureEvent::RetriesExhausted,
        ErasureEvent::Escalate,
        ErasureEvent::Resume,
        ErasureEvent::PurgeDone,
        ErasureEvent::VerificationFailed,
        ErasureEvent::Verified,
    ];

    /// Every legal step, written out once so that the table above is checked against a second
    /// statement of the same diagram.
    const LEGAL: [(ErasureState, ErasureEvent, ErasureState); 20] = {
        use ErasureEvent as E;
        use ErasureState as S;
        [
            (S::Requested, E::Authorize, S::Authorized),
            (S::Requested, E::Reject, S::Rejected),
            (S::Authorized, E::Reject, S::Rejected),
            (S::Held, E::Reject, S::Rejected),
            (S::Authorized, E::HoldPlaced, S::Held),
            (S::Held, E::HoldReleased, S::Authorized),
            (S::Authorized, E::Suppress, S::Suppressed),
            (S::Authorized, E::FlipPending, S::Propagating),
            (S::Propagating, E::FlipApplied, S::Suppressed),
            (S::Suppressed, E::PurgeStarted, S::Propagating),
            (S::Propagating, E::PurgeFailed, S::Retrying),
            (S::Verifying, E::PurgeFailed, S::Retrying),
            (S::Retrying, E::RetryStarted, S::Propagating),
            (S::Retrying, E::RetriesExhausted, S::Exception),
            (S::Exception, E::Escalate, S::ManualReview),
            (S::ManualReview, E::Resume, S::Propagating),
            (S::Propagating, E::PurgeDone, S::Verifying),
            (S::Retrying, E::PurgeDone, S::Verifying),
            (S::Verifying, E::VerificationFailed, S::Propagating),
            (S::Verifying, E::Verified, S::Completed),
        ]
    };

    #[test]
    fn every_pair_is_legal_exactly_when_listed() {
        for from in ErasureState::ALL {
            for event in EVENTS {
                let listed = LEGAL
                    .iter()
                    .find(|(f, e, _)| *f == from && *e == event)
                    .map(|(_, _, to)| *to);
                match (transition(from, event), listed) {
                    (Ok(to), Some(expected)) => assert_eq!(to, expected),
                    (Err(e), None) => assert_eq!(e, IllegalTransition { from, event }),
                    (got, listed) => panic!("{from} + {event:?}: got {got:?}, listed {listed:?}"),
                }
            }
        }
    }

    #[test]
    fn the_happy_path_and_the_hold() {
        use ErasureEvent::*;
        let path = [
            Authorize,
            HoldPlaced,
            HoldReleased,
            Suppress,
            PurgeStarted,
            PurgeFailed,
            RetryStarted,
            PurgeDone,
            Verified,
        ];
        let end = path
            .into_iter()
            .try_fold(ErasureState::Requested, transition);
        assert_eq!(end, Ok(ErasureState::Completed));
    }

    #[test]
    fn states_round_trip_by_name() {
        for s in ErasureState::ALL {
            assert_eq!(ErasureState::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
    }

    proptest! {
        /// Whatever the events, a request never leaves the suppressed region once in it, and
        /// final states take nothing.
        #[test]
        fn suppression_is_never_undone(events in proptest::collection::vec(proptest::sample::select(EVENTS.to_vec()), 0..40)) {
            let mut state = ErasureState::Requested;
            for event in events {
                match transition(state, event) {
                    Ok(next) => {
                        prop_assert!(!state.is_final());
                        prop_assert!(!state.is_suppressed() || next.is_suppressed());
                        state = next;
                    }
                    Err(e) => prop_assert_eq!(e.from, state),
                }
            }
        }
    }
}

/// Why an approval is not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ApprovalError {
    #[error("this actor has already approved the request")]
    AlreadyApproved,
    #[error("the request is not waiting for approval")]
    NotAwaitingApproval,
    #[error(
        "this actor's id differs from an approver's only in case or whitespace: one person cannot approve twice under two spellings"
    )]
    ConfusableApprover,
    #[error(
        "the person who filed the request cannot also approve it when two approvals are required"
    )]
    RequesterCannotApprove,
}

/// Adds `actor`'s approval to `approvals` (actors who approved so far); answers whether the
/// request is now authorised. Approvals come from different people: an id that differs from an
/// approver's only in case or whitespace is the same person, and with two required, the person
/// who filed the request (`requester`) is never one of the approvers.
pub fn approve(
    state: ErasureState,
    approvals: &mut Vec<String>,
    actor: &str,
    requester: &str,
    required: usize,
) -> Result<bool, ApprovalError> {
    if state != ErasureState::Requested {
        return Err(ApprovalError::NotAwaitingApproval);
    }
    if approvals.iter().any(|a| a == actor) {
        return Err(ApprovalError::AlreadyApproved);
    }
    if approvals.iter().any(|a| crate::names::confusable(a, actor)) {
        return Err(ApprovalError::ConfusableApprover);
    }
    if required >= 2 && crate::names::confusable(requester, actor) {
        return Err(ApprovalError::RequesterCannotApprove);
    }
    approvals.push(actor.to_owned());
    Ok(approvals.len() >= required.max(1))
}

#[cfg(test)]
mod approval_tests {
    use super::*;

    #[test]
    fn approvals_come_from_different_people() {
        use ApprovalError as E;
        // (required, requester, approvers in order, expected outcome of each)
        type Case<'a> = (
            usize,
            &'a str,
            &'a [&'a str],
            &'a [Result<bool, ApprovalError>],
        );
        let cases: [Case; 9] = [
            (1, "clerk", &["dpo"], &[Ok(true)]),
            (1, "dpo", &["dpo"], &[Ok(true)]),
            (
                2,
                "clerk",
                &["dpo", "dpo"],
                &[Ok(false), Err(E::AlreadyApproved)],
            ),
            (2, "clerk", &["dpo", "counsel"], &[Ok(false), Ok(true)]),
            (0, "clerk", &["dpo"], &[Ok(true)]),
            (
                2,
                "clerk",
                &["dpo-a", "DPO-A"],
                &[Ok(false), Err(E::ConfusableApprover)],
            ),
            (
                2,
                "clerk",
                &["dpo-a", "dpo -a"],
                &[Ok(false), Err(E::ConfusableApprover)],
            ),
            // The requester is not one of two approvers, in any spelling.
            (
                2,
                "dpo-a",
                &["dpo-a", "counsel"],
                &[Err(E::RequesterCannotApprove), Ok(false)],
            ),
            (
                2,
                "dpo-a",
                &["counsel", "DPO-A"],
                &[Ok(false), Err(E::RequesterCannotApprove)],
            ),
        ];
        for (required, requester, approvers, expected) in cases {
            let mut approvals = Vec::new();
            for (actor, want) in approvers.iter().zip(expected) {
                assert_eq!(
                    approve(
                        ErasureState::Requested,
                        &mut approvals,
                        actor,
                        requester,
                        required
                    ),
                    *want,
                    "{required} {requester} {approvers:?}"
                );
            }
        }
        let mut approvals = vec!["dpo".to_owned()];
        assert_eq!(
            approve(ErasureState::Held, &mut approvals, "counsel", "clerk", 2),
            Err(ApprovalError::NotAwaitingApproval)
        );
        assert_eq!(approvals, ["dpo"], "a refused approval is not recorded");
    }
}
