//! Retention rules and the computation of `retain_until`.
//!
//! Lethe computes every item's expiry; a client may only ask for an earlier one.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

/// Which copy of a fact an item is: the raw record, something derived from it, or a cache entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    Raw,
    Derived,
    Cache,
}

impl Layer {
    pub fn as_str(self) -> &'static str {
        match self {
            Layer::Raw => "raw",
            Layer::Derived => "derived",
            Layer::Cache => "cache",
        }
    }
}

impl FromStr for Layer {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Layer::Raw, Layer::Derived, Layer::Cache]
            .into_iter()
            .find(|l| l.as_str() == s)
            .ok_or_else(|| format!("unknown layer {s:?} (expected raw, derived or cache)"))
    }
}

/// A positive age written the way people write it: `30d`, `12h`, `90m`, `45s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MaxAge {
    seconds: i64,
}

impl MaxAge {
    pub fn from_seconds(seconds: i64) -> Result<Self, MaxAgeError> {
        if seconds <= 0 {
            Err(MaxAgeError::NotPositive)
        } else {
            Ok(MaxAge { seconds })
        }
    }

    pub fn seconds(self) -> i64 {
        self.seconds
    }

    pub fn as_delta(self) -> TimeDelta {
        // `seconds` is positive and the parser bounds it, so this cannot fail; saturate anyway.
        TimeDelta::try_seconds(self.seconds).unwrap_or(TimeDelta::MAX)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MaxAgeError {
    #[error("a retention age must be greater than zero")]
    NotPositive,
    #[error("a retention age looks like 30d, 12h, 90m or 45s")]
    Malformed,
    #[error("a retention age must be at most 100 years")]
    TooLong,
}

const UNITS: [(char, i64); 4] = [('d', 86_400), ('h', 3_600), ('m', 60), ('s', 1)];
const HUNDRED_YEARS: i64 = 100 * 366 * 86_400;

impl FromStr for MaxAge {
    type Err = MaxAgeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let unit = s.chars().last().ok_or(MaxAgeError::Malformed)?;
        let (_, scale) = UNITS
            .into_iter()
            .find(|(u, _)| *u == unit)
            .ok_or(MaxAgeError::Malformed)?;
        let number = s.strip_suffix(unit).ok_or(MaxAgeError::Malformed)?;
        let value: i64 = number.parse().map_err(|_| MaxAgeError::Malformed)?;
        if value <= 0 {
            return Err(MaxAgeError::NotPositive);
        }
        let seconds = value.checked_mul(scale).ok_or(MaxAgeError::TooLong)?;
        if seconds > HUNDRED_YEARS {
            return Err(MaxAgeError::TooLong);
        }
        MaxAge::from_seconds(seconds)
    }
}

impl fmt::Display for MaxAge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (unit, scale) = UNITS
            .into_iter()
            .find(|(_, scale)| self.seconds % scale == 0)
            .unwrap_or(('s', 1));
        write!(f, "{}{unit}", self.seconds / scale)
    }
}

impl Serialize for MaxAge {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MaxAge {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// `(purpose, category[, layer]) -> max age`; a rule without a layer covers every layer that has
/// no rule of its own. `legal_end` is a fixed date past which nothing under the rule may be kept
/// (the end of a contract or of a statutory duty).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionRule {
    pub purpose: String,
    pub category: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<Layer>,
    pub max_age: MaxAge,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub legal_end: Option<DateTime<Utc>>,
}

/// The date a purpose stops (a campaign, a study); nothing kept for it outlives that date.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PurposeEnd {
    pub purpose: String,
    pub ends_at: DateTime<Utc>,
}

/// One version of a tenant's retention rules.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionPolicy {
    pub rules: Vec<RetentionRule>,
    #[serde(default)]
    pub purpose_ends: Vec<PurposeEnd>,
}

impl RetentionPolicy {
    /// The rule for this exact layer, else the layer-less rule for (purpose, category).
    pub fn rule_for(&self, purpose: &str, category: &str, layer: Layer) -> Option<&RetentionRule> {
        let mut matching = self
            .rules
            .iter()
            .filter(|r| r.purpose == purpose && r.category == category);
        let mut fallback = None;
        for rule in matching.by_ref() {
            match rule.layer {
                Some(l) if l == layer => return Some(rule),
                None => fallback = Some(rule),
                Some(_) => {}
            }
        }
        fallback
    }

    pub fn purpose_end(&self, purpose: &str) -> Option<DateTime<Utc>> {
        self.purpose_ends
            .iter()
            .filter(|p| p.purpose == purpose)
            .map(|p| p.ends_at)
            .min()
    }

    /// Every problem at once, each naming the rule it is about.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        let mut seen = BTreeSet::new();
        for (i, rule) in self.rules.iter().enumerate() {
            check_name(&mut problems, &format!("rules[{i}].purpose"), &rule.purpose);
            check_name(
                &mut problems,
                &format!("rules[{i}].category"),
                &rule.category,
            );
            if !seen.insert((&rule.purpose, &rule.category, rule.layer)) {
                problems.push(format!(
                    "rules[{i}]: a rule for ({}, {}, {}) is already defined",
                    rule.purpose,
                    rule.category,
                    rule.layer.map_or("any layer", Layer::as_str)
                ));
            }
        }
        let mut purposes = BTreeSet::new();
        for (i, end) in self.purpose_ends.iter().enumerate() {
            check_name(
                &mut problems,
                &format!("purpose_ends[{i}].purpose"),
                &end.purpose,
            );
            if !purposes.insert(&end.purpose) {
                problems.push(format!(
                    "purpose_ends[{i}]: purpose {} already has an end",
                    end.purpose
                ));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

/// Purposes and categories: non-empty, at most 200 bytes, no control characters.
/// A purpose or category as decisions will meet it: in its one spelling already.
fn check_name(problems: &mut Vec<String>, field: &str, value: &str) {
    match crate::names::canonical_key(value, false) {
        Ok(name) if name == value => {}
        Ok(_) => problems.push(format!(
            "{field}: must be written in Unicode NFC (its composed form)"
        )),
        Err(e) => problems.push(format!("{field}: {e}")),
    }
}

/// Everything that bounds how long one item may be kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionBounds {
    pub created_at: DateTime<Utc>,
    pub max_age: MaxAge,
    pub consent_end: Option<DateTime<Utc>>,
    pub purpose_end: Option<DateTime<Utc>>,
    pub legal_end: Option<DateTime<Utc>>,
    /// What the client asked for; it can only shorten the result.
    pub requested: Option<DateTime<Utc>>,
}

/// `min(created_at + max_age, consent end, purpose end, legal end, requested)`.
pub fn retain_until(b: &RetentionBounds) -> DateTime<Utc> {
    let by_age = b
        .created_at
        .checked_add_signed(b.max_age.as_delta())
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    [b.consent_end, b.purpose_end, b.legal_end, b.requested]
        .into_iter()
        .flatten()
        .fold(by_age, DateTime::min)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    fn day(d: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, d, 0, 0, 0).unwrap()
    }

    #[test]
    fn ages_parse_and_print() {
        let cases = [
            ("30d", Ok(30 * 86_400), "30d"),
            ("12h", Ok(12 * 3_600), "12h"),
            ("90m", Ok(90 * 60), "90m"),
            ("86400s", Ok(86_400), "1d"),
            ("0d", Err(MaxAgeError::NotPositive), ""),
            ("-5d", Err(MaxAgeError::NotPositive), ""),
            ("5", Err(MaxAgeError::Malformed), ""),
            ("d", Err(MaxAgeError::Malformed), ""),
            ("", Err(MaxAgeError::Malformed), ""),
            ("1.5d", Err(MaxAgeError::Malformed), ""),
            ("99999999999999d", Err(MaxAgeError::TooLong), ""),
            ("40000d", Err(MaxAgeError::TooLong), ""),
        ];
        for (text, expected, printed) in cases {
            let parsed = text.parse::<MaxAge>();
            assert_eq!(parsed.map(MaxAge::seconds), expected, "{text}");
            if let Ok(age) = text.parse::<MaxAge>() {
                assert_eq!(age.to_string(), printed);
            }
        }
    }

    fn rule(layer: Option<Layer>, age: &str) -> RetentionRule {
        RetentionRule {
            purpose: "personalization".into(),
            category: "preference".into(),
            layer,
            max_age: age.parse().unwrap(),
            legal_end: None,
        }
    }

    #[test]
    fn layer_rule_wins_over_the_general_one() {
        let policy = RetentionPolicy {
            rules: vec![rule(None, "365d"), rule(Some(Layer::Cache), "1d")],
            purpose_ends: vec![],
        };
        let age = |l| {
            policy
                .rule_for("personalization", "preference", l)
                .map(|r| r.max_age.to_string())
        };
        assert_eq!(age(Layer::Cache).as_deref(), Some("1d"));
        assert_eq!(age(Layer::Raw).as_deref(), Some("365d"));
        assert!(
            policy
                .rule_for("training", "preference", Layer::Raw)
                .is_none()
        );
    }

    #[test]
    fn validation_reports_every_problem() {
        let policy = RetentionPolicy {
            rules: vec![
                rule(None, "1d"),
                rule(None, "2d"),
                RetentionRule {
                    purpose: " ".into(),
                    category: "".into(),
                    ..rule(None, "1d")
                },
            ],
            purpose_ends: vec![
                PurposeEnd {
                    purpose: "x".into(),
                    ends_at: day(1),
                },
                PurposeEnd {
                    purpose: "x".into(),
                    ends_at: day(2),
                },
            ],
        };
        let problems = policy.validate().unwrap_err();
        assert_eq!(problems.len(), 4, "{problems:#?}");
        assert!(problems[0].starts_with("rules[1]"));
    }

    #[test]
    fn unknown_fields_and_zero_ages_are_refused() {
        let zero = r#"{"rules":[{"purpose":"p","category":"c","max_age":"0d"}]}"#;
        assert!(serde_json::from_str::<RetentionPolicy>(zero).is_err());
        let extra = r#"{"rules":[{"purpose":"p","category":"c","max_age":"1d","colour":"red"}]}"#;
        assert!(serde_json::from_str::<RetentionPolicy>(extra).is_err());
    }

    #[test]
    fn the_tightest_bound_wins() {
        let base = RetentionBounds {
            created_at: day(1),
            max_age: "10d".parse().unwrap(),
            consent_end: None,
            purpose_end: None,
            legal_end: None,
            requested: None,
        };
        assert_eq!(retain_until(&base), day(11));
        assert_eq!(
            retain_until(&RetentionBounds {
                consent_end: Some(day(5)),
                ..base
            }),
            day(5)
        );
        assert_eq!(
            retain_until(&RetentionBounds {
                purpose_end: Some(day(4)),
                ..base
            }),
            day(4)
        );
        assert_eq!(
            retain_until(&RetentionBounds {
                legal_end: Some(day(3)),
                ..base
            }),
            day(3)
        );
        assert_eq!(
            retain_until(&RetentionBounds {
                requested: Some(day(2)),
                ..base
            }),
            day(2)
        );
        // Asking for later than policy allows changes nothing.
        assert_eq!(
            retain_until(&RetentionBounds {
                requested: Some(day(30)),
                ..base
            }),
            day(11)
        );
    }

    fn instant() -> impl Strategy<Value = DateTime<Utc>> {
        (0i64..4_000_000_000).prop_map(|s| Utc.timestamp_opt(s, 0).unwrap())
    }

    proptest! {
        #[test]
        fn retain_until_never_exceeds_a_bound(
            created_at in instant(),
            age in 1i64..HUNDRED_YEARS,
            consent_end in proptest::option::of(instant()),
            purpose_end in proptest::option::of(instant()),
            legal_end in proptest::option::of(instant()),
            requested in proptest::option::of(instant()),
        ) {
            let b = RetentionBounds {
                created_at,
                max_age: MaxAge::from_seconds(age).unwrap(),
                consent_end, purpose_end, legal_end, requested,
            };
            let until = retain_until(&b);
            prop_assert!(until <= created_at + TimeDelta::seconds(age));
            for bound in [consent_end, purpose_end, legal_end, requested].into_iter().flatten() {
                prop_assert!(until <= bound);
            }
            // And it is one of the bounds, not something earlier.
            let candidates = [Some(created_at + TimeDelta::seconds(age)), consent_end, purpose_end, legal_end, requested];
            prop_assert!(candidates.into_iter().flatten().any(|c| c == until));
        }

        #[test]
        fn ages_round_trip(seconds in 1i64..HUNDRED_YEARS) {
            let age = MaxAge::from_seconds(seconds).unwrap();
            prop_assert_eq!(age.to_string().parse::<MaxAge>(), Ok(age));
        }
    }
}
