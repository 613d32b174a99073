//! A data subject's state and deletion epoch.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SubjectStatus {
    #[default]
    Active,
    /// Under erasure: unreadable and unwritable; stores are being purged.
    Suppressed,
    /// Erasure completed and certified.
    Erased,
}

impl SubjectStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            SubjectStatus::Active => "active",
            SubjectStatus::Suppressed => "suppressed",
            SubjectStatus::Erased => "erased",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            SubjectStatus::Active,
            SubjectStatus::Suppressed,
            SubjectStatus::Erased,
        ]
        .into_iter()
        .find(|status| status.as_str() == s)
    }
}

/// The epoch increments on every suppression; writes carry the epoch they were authorised under,
/// so a write authorised before a suppression can never land after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SubjectState {
    pub status: SubjectStatus,
    pub epoch: i64,
}

impl SubjectState {
    pub fn is_active(self) -> bool {
        self.status == SubjectStatus::Active
    }

    /// The flip: suppressed, in a new epoch.
    pub fn suppressed(self) -> SubjectState {
        SubjectState {
            status: SubjectStatus::Suppressed,
            epoch: self.epoch.saturating_add(1),
        }
    }

    pub fn erased(self) -> SubjectState {
        SubjectState {
            status: SubjectStatus::Erased,
            epoch: self.epoch,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suppression_moves_to_a_new_epoch_and_erasure_keeps_it() {
        let s = SubjectState::default();
        assert!(s.is_active());
        let suppressed = s.suppressed();
        assert_eq!(
            suppressed,
            SubjectState {
                status: SubjectStatus::Suppressed,
                epoch: 1
            }
        );
        assert_eq!(suppressed.erased().epoch, 1);
        assert!(!suppressed.is_active() && !suppressed.erased().is_active());
        assert_eq!(
            SubjectState {
                status: SubjectStatus::Active,
                epoch: i64::MAX
            }
            .suppressed()
            .epoch,
            i64::MAX
        );
    }

    #[test]
    fn statuses_round_trip() {
        for s in [
            SubjectStatus::Active,
            SubjectStatus::Suppressed,
            SubjectStatus::Erased,
        ] {
            assert_eq!(SubjectStatus::parse(s.as_str()), Some(s));
        }
        assert_eq!(SubjectStatus::parse("gone"), None);
    }
}
