//! Consent grants and the question "does an active grant cover this use, now?".

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Declares the closed set of consent actions from one list: the enum, [`Action::ALL`] and each
/// action's name. Everything else that names actions (the OpenAPI document Lethe serves, the
/// console's form, the CLI's `--actions`, the SQL installed in governed databases) takes them from
/// here, and a test compares each with this list.
macro_rules! actions {
    ($($(#[$doc:meta])* $variant:ident = $name:literal,)*) => {
        /// What may be done with a subject's data. The set is closed: adding an action is a
        /// policy change.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum Action {
            $($(#[$doc])* #[serde(rename = $name)] $variant,)*
        }

        impl Action {
            pub const ALL: &[Action] = &[$(Action::$variant),*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(Action::$variant => $name),*
                }
            }
        }
    };
}

actions! {
    /// Keep the data in a memory store.
    Store = "store",
    /// Serve it back on a read.
    Retrieve = "retrieve",
    /// Compute embeddings from it.
    Embed = "embed",
    /// Send it to a model provider.
    SendToProvider = "send_to_provider",
    /// Let the provider keep what it is sent (stored responses, conversations, files).
    ProviderRetention = "provider_retention",
    /// Use it to train a model.
    Train = "train",
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown action {0:?}")]
pub struct UnknownAction(pub String);

impl FromStr for Action {
    type Err = UnknownAction;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Action::ALL
            .iter()
            .copied()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| UnknownAction(s.to_owned()))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConsentStatus {
    /// Granted with a start in the future.
    Pending,
    Active,
    Revoked,
    Expired,
}

impl ConsentStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ConsentStatus::Pending => "pending",
            ConsentStatus::Active => "active",
            ConsentStatus::Revoked => "revoked",
            ConsentStatus::Expired => "expired",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsentGrant {
    pub id: String,
    pub tenant: String,
    pub subject: String,
    pub purpose: String,
    pub category: String,
    pub actions: BTreeSet<Action>,
    pub granted_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
    pub policy_version: i64,
    pub source: String,
}

impl ConsentGrant {
    /// Revocation wins over expiry: a revoked grant reports `revoked` even after it would have expired.
    pub fn status(&self, now: DateTime<Utc>) -> ConsentStatus {
        if self.revoked_at.is_some_and(|at| at <= now) {
            ConsentStatus::Revoked
        } else if self.expires_at.is_some_and(|at| at <= now) {
            ConsentStatus::Expired
        } else if self.granted_at > now {
            ConsentStatus::Pending
        } else {
            ConsentStatus::Active
        }
    }

    pub fn covers(
        &self,
        purpose: &str,
        category: &str,
        action: Action,
        now: DateTime<Utc>,
    ) -> bool {
        self.purpose == purpose
            && self.category == category
            && self.actions.contains(&action)
            && self.status(now) == ConsentStatus::Active
    }
}

/// The grants that cover (purpose, category, action) at `now`.
pub fn covering<'a>(
    grants: &'a [ConsentGrant],
    purpose: &'a str,
    category: &'a str,
    action: Action,
    now: DateTime<Utc>,
) -> impl Iterator<Item = &'a ConsentGrant> + 'a {
    grants
        .iter()
        .filter(move |g| g.covers(purpose, category, action, now))
}

/// How long consent for this use lasts: `None` when nothing covers it, `Some(None)` when a
/// covering grant has no end, otherwise the latest end among the covering grants.
pub fn coverage_end(
    grants: &[ConsentGrant],
    purpose: &str,
    category: &str,
    action: Action,
    now: DateTime<Utc>,
) -> Option<Option<DateTime<Utc>>> {
    covering(grants, purpose, category, action, now).fold(None, |end, g| {
        match (end, g.expires_at) {
            (None, e) => Some(e),
            (Some(None), _) | (_, None) => Some(None),
            (Some(Some(a)), Some(b)) => Some(Some(a.max(b))),
        }
    })
}

/// When a use decided at `decided` lost its consent to a withdrawal: the earliest revocation
/// since `decided` of a grant for (purpose, category) that left the use uncovered, as the
/// withdrawal itself judged it. A record of that use written after the withdrawal expires then,
/// as the withdrawal expired those written before it.
pub fn withdrawn_since(
    grants: &[ConsentGrant],
    purpose: &str,
    category: &str,
    decided: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    grants
        .iter()
        .filter(|g| g.purpose == purpose && g.category == category)
        .filter_map(|g| g.revoked_at)
        .filter(|at| *at >= decided)
        .filter(|at| coverage_end(grants, purpose, category, Action::Store, *at).is_none())
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(h: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, h, 0, 0).unwrap()
    }

    fn grant(expires: Option<u32>, revoked: Option<u32>) -> ConsentGrant {
        ConsentGrant {
            id: "g1".into(),
            tenant: "acme".into(),
            subject: "u1".into(),
            purpose: "personalization".into(),
            category: "preference".into(),
            actions: [Action::Store, Action::Retrieve].into(),
            granted_at: t(1),
            expires_at: expires.map(t),
            revoked_at: revoked.map(t),
            policy_version: 1,
            source: "signup".into(),
        }
    }

    #[test]
    fn a_status_is_named_as_the_api_serialises_it() {
        for status in [
            ConsentStatus::Pending,
            ConsentStatus::Active,
            ConsentStatus::Revoked,
            ConsentStatus::Expired,
        ] {
            assert_eq!(
                serde_json::to_value(status).unwrap(),
                serde_json::Value::from(status.as_str())
            );
        }
    }

    #[test]
    fn status_over_time() {
        // (expires, revoked, now, expected)
        let cases = [
            (None, None, 0, ConsentStatus::Pending),
            (None, None, 1, ConsentStatus::Active),
            (Some(5), None, 4, ConsentStatus::Active),
            (Some(5), None, 5, ConsentStatus::Expired),
            (None, Some(3), 3, ConsentStatus::Revoked),
            (Some(2), Some(3), 4, ConsentStatus::Revoked),
            (None, Some(3), 2, ConsentStatus::Active),
        ];
        for (expires, revoked, now, expected) in cases {
            assert_eq!(
                grant(expires, revoked).status(t(now)),
                expected,
                "expires={expires:?} revoked={revoked:?} now={now}"
            );
        }
    }

    #[test]
    fn covers_needs_every_part() {
        let g = grant(None, None);
        assert!(g.covers("personalization", "preference", Action::Store, t(2)));
        assert!(!g.covers("training", "preference", Action::Store, t(2)));
        assert!(!g.covers("personalization", "health", Action::Store, t(2)));
        assert!(!g.covers("personalization", "preference", Action::Train, t(2)));
    }

    #[test]
    fn coverage_end_takes_the_latest_and_open_ended_wins() {
        let short = grant(Some(5), None);
        let long = ConsentGrant {
            expires_at: Some(t(9)),
            ..grant(None, None)
        };
        let open = grant(None, None);
        let now = t(2);
        let end = |gs: &[ConsentGrant]| {
            coverage_end(gs, "personalization", "preference", Action::Store, now)
        };
        assert_eq!(end(&[]), None);
        assert_eq!(end(std::slice::from_ref(&short)), Some(Some(t(5))));
        assert_eq!(end(&[short.clone(), long]), Some(Some(t(9))));
        assert_eq!(end(&[short, open]), Some(None));
    }

    #[test]
    fn a_use_decided_before_a_withdrawal_that_left_it_uncovered_lost_its_consent_then() {
        let revoked = |id: &str, at: u32| ConsentGrant {
            id: id.into(),
            ..grant(None, Some(at))
        };
        let other_purpose = ConsentGrant {
            purpose: "training".into(),
            ..revoked("g3", 3)
        };
        let open = ConsentGrant {
            id: "g4".into(),
            ..grant(None, None)
        };
        let since = |grants: &[ConsentGrant], decided: u32| {
            withdrawn_since(grants, "personalization", "preference", t(decided))
        };
        // (grants, decided at, lost its consent at)
        let cases: [(Vec<ConsentGrant>, u32, Option<u32>); 7] = [
            (vec![], 2, None),
            (vec![grant(None, None)], 2, None),
            (vec![revoked("g1", 3)], 2, Some(3)),
            (vec![revoked("g1", 3)], 3, Some(3)),
            // Withdrawn before the decision: decided without it, the record's own deadline holds.
            (vec![revoked("g1", 3)], 4, None),
            // Another grant still covered the use when this one was withdrawn.
            (vec![revoked("g1", 3), open], 2, None),
            (
                vec![revoked("g1", 5), revoked("g2", 3), other_purpose],
                2,
                Some(5),
            ),
        ];
        for (grants, decided, lost) in cases {
            assert_eq!(
                since(&grants, decided),
                lost.map(t),
                "{grants:?} decided at {decided}"
            );
        }
    }

    #[test]
    fn actions_round_trip_through_their_names() {
        for &a in Action::ALL {
            assert_eq!(a.as_str().parse::<Action>(), Ok(a));
            assert_eq!(serde_json::to_value(a).unwrap(), a.as_str());
        }
        assert!("delete".parse::<Action>().is_err());
    }
}
