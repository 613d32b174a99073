//! What an erasure did to the bytes a store keeps, and every copy it could not remove: where it
//! is, what of the subject it holds, why it remains, and the date by which it will be gone, or
//! why no date can be given. The certificate says no more than this.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Physical {
    /// What the purge removed from the store's files ("AOF rewritten", "VACUUM memories").
    pub done: Vec<String>,
    /// Every copy that remains.
    pub remaining: Vec<Copy>,
    /// What the physical verification looked for in what the store still keeps, and what it
    /// found (a finding is also a remaining copy).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub verified: Vec<String>,
}

/// A copy of the subject's data that outlives the purge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Copy {
    /// Where: a file or a mechanism of the store.
    pub place: String,
    /// What of the subject it holds (records, vectors, text, ids).
    pub holds: String,
    /// Why it is still there.
    pub why: String,
    /// By when it will be gone, from the store's own settings.
    pub until: Option<DateTime<Utc>>,
    /// Why no date can be given; set exactly when `until` is not.
    pub unknown: Option<String>,
}

impl Copy {
    /// A copy gone by `until`.
    pub fn until(place: &str, holds: &str, why: &str, until: DateTime<Utc>) -> Copy {
        Copy {
            place: place.to_owned(),
            holds: holds.to_owned(),
            why: why.to_owned(),
            until: Some(until),
            unknown: None,
        }
    }

    /// A copy whose end no setting of the store can date.
    pub fn unknown(place: &str, holds: &str, why: &str, reason: &str) -> Copy {
        Copy {
            place: place.to_owned(),
            holds: holds.to_owned(),
            why: why.to_owned(),
            until: None,
            unknown: Some(reason.to_owned()),
        }
    }
}

impl Physical {
    pub fn done(done: impl IntoIterator<Item = String>) -> Physical {
        Physical {
            done: done.into_iter().collect(),
            ..Physical::default()
        }
    }

    pub fn with(mut self, copy: Copy) -> Physical {
        self.remaining.push(copy);
        self
    }
}
