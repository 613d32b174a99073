//! Legal holds: while one applies, erasure waits and the retention sweeper skips.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LegalHold {
    pub id: String,
    pub tenant: String,
    /// `None` holds the whole tenant.
    pub subject: Option<String>,
    pub reason: String,
    pub placed_at: DateTime<Utc>,
    pub released_at: Option<DateTime<Utc>>,
}

impl LegalHold {
    pub fn is_active(&self, now: DateTime<Utc>) -> bool {
        self.placed_at <= now && self.released_at.is_none_or(|at| at > now)
    }

    pub fn applies_to(&self, tenant: &str, subject: &str) -> bool {
        self.tenant == tenant && self.subject.as_deref().is_none_or(|s| s == subject)
    }
}

/// Whether an active hold covers (tenant, subject) at `now`.
pub fn is_held(holds: &[LegalHold], tenant: &str, subject: &str, now: DateTime<Utc>) -> bool {
    holds
        .iter()
        .any(|h| h.is_active(now) && h.applies_to(tenant, subject))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(h: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, h, 0, 0).unwrap()
    }

    fn hold(subject: Option<&str>, released: Option<u32>) -> LegalHold {
        LegalHold {
            id: "h".into(),
            tenant: "acme".into(),
            subject: subject.map(str::to_owned),
            reason: "litigation".into(),
            placed_at: t(1),
            released_at: released.map(t),
        }
    }

    #[test]
    fn holds_cover_their_scope_while_active() {
        // (hold subject, released, asked tenant, asked subject, now, held?)
        let cases = [
            (None, None, "acme", "u1", 2, true),
            (None, None, "other", "u1", 2, false),
            (Some("u1"), None, "acme", "u1", 2, true),
            (Some("u1"), None, "acme", "u2", 2, false),
            (Some("u1"), Some(3), "acme", "u1", 2, true),
            (Some("u1"), Some(3), "acme", "u1", 3, false),
            (None, None, "acme", "u1", 0, false),
        ];
        for (subject, released, tenant, asked, now, expected) in cases {
            let holds = [hold(subject, released)];
            assert_eq!(
                is_held(&holds, tenant, asked, t(now)),
                expected,
                "{subject:?} {released:?} {tenant} {asked} {now}"
            );
        }
    }
}
