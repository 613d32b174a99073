//! Which tenant, subject and use a Redis key names. A route's `[[routes.keys]]` patterns are the
//! stamp: `{tenant}:{subject}:*` says that `acme:alice:chat` is alice's of acme, kept for the
//! pattern's purpose and category. The first pattern that matches decides; a key no pattern
//! matches is nobody's and is refused. Pure: no I/O.

use serde::Deserialize;

/// One `[[routes.keys]]` entry of a Redis route.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyRule {
    /// Literal text, `{tenant}` and `{subject}` once each, and an optional `*` at the end.
    pub pattern: String,
    pub purpose: String,
    pub category: String,
}

/// Whose a key is and what it is kept for, as its pattern says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner<'k> {
    pub tenant: &'k str,
    pub subject: &'k str,
    pub purpose: &'k str,
    pub category: &'k str,
}

/// A piece of a pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Tenant,
    Subject,
    /// `*` at the end: any rest, possibly empty.
    Rest,
}

/// A pattern read into its pieces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    pieces: Vec<Piece>,
    purpose: String,
    category: String,
    /// The pattern as written, for `SCAN MATCH` and the purge.
    pub text: String,
}

impl Pattern {
    /// Reads a rule, or says what is wrong with it.
    pub fn of(rule: &KeyRule) -> Result<Pattern, String> {
        let mut pieces = Vec::new();
        let mut rest = rule.pattern.as_str();
        while !rest.is_empty() {
            let (piece, after) = if let Some(after) = rest.strip_prefix("{tenant}") {
                (Piece::Tenant, after)
            } else if let Some(after) = rest.strip_prefix("{subject}") {
                (Piece::Subject, after)
            } else if let Some(after) = rest.strip_prefix('*') {
                if !after.is_empty() {
                    return Err(format!("pattern {:?}: `*` may only end it", rule.pattern));
                }
                (Piece::Rest, after)
            } else {
                let end = rest.find(['{', '*']).unwrap_or(rest.len()).max(1);
                let text = &rest[..end];
                if text.contains(['?', '[', ']', '\\', '{', '}']) {
                    return Err(format!(
                        "pattern {:?}: only literal text, {{tenant}}, {{subject}} and a final `*`",
                        rule.pattern
                    ));
                }
                (Piece::Text(text.to_owned()), &rest[end..])
            };
            // Two placeholders side by side could not be told apart.
            let placeholder = |p: &Piece| matches!(p, Piece::Tenant | Piece::Subject);
            if placeholder(&piece) && pieces.last().is_some_and(placeholder) {
                return Err(format!(
                    "pattern {:?}: put a separator between {{tenant}} and {{subject}}",
                    rule.pattern
                ));
            }
            pieces.push(piece);
            rest = after;
        }
        let once = |p: Piece| pieces.iter().filter(|x| **x == p).count() == 1;
        if !once(Piece::Tenant) || !once(Piece::Subject) {
            return Err(format!(
                "pattern {:?}: must name {{tenant}} and {{subject}} once each",
                rule.pattern
            ));
        }
        Ok(Pattern {
            pieces,
            purpose: rule.purpose.clone(),
            category: rule.category.clone(),
            text: rule.pattern.clone(),
        })
    }

    /// Whose `key` is under this pattern: `{tenant}` and `{subject}` each take one or more bytes
    /// up to the first byte of what follows them (all the rest at the end), so a key has one
    /// owner only.
    pub fn owner<'k>(&'k self, key: &'k str) -> Option<Owner<'k>> {
        let (mut tenant, mut subject) = (None, None);
        let mut rest = key;
        for (i, piece) in self.pieces.iter().enumerate() {
            match piece {
                Piece::Text(text) => rest = rest.strip_prefix(text.as_str())?,
                Piece::Rest => rest = "",
                Piece::Tenant | Piece::Subject => {
                    let end = match self.pieces.get(i + 1) {
                        Some(Piece::Text(next)) => rest.find(next.as_str())?,
                        Some(_) => return None,
                        None => rest.len(),
                    };
                    let value = &rest[..end];
                    if value.is_empty() {
                        return None;
                    }
                    match piece {
                        Piece::Tenant => tenant = Some(value),
                        _ => subject = Some(value),
                    }
                    rest = &rest[end..];
                }
            }
        }
        Some(Owner {
            tenant: tenant?,
            subject: subject?,
            purpose: &self.purpose,
            category: &self.category,
        })
        .filter(|_| rest.is_empty())
    }
}

/// The owner of `key` under the first of `patterns` that matches it.
pub fn owner<'k>(patterns: &'k [Pattern], key: &'k str) -> Option<Owner<'k>> {
    patterns.iter().find_map(|p| p.owner(key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pattern(text: &str) -> Result<Pattern, String> {
        Pattern::of(&KeyRule {
            pattern: text.to_owned(),
            purpose: "support".into(),
            category: "conversation".into(),
        })
    }

    #[test]
    fn a_key_names_its_tenant_and_subject_by_its_pattern() {
        let sessions = pattern("{tenant}:{subject}:*").unwrap();
        let history = pattern("message_store:{tenant}:{subject}").unwrap();
        let cases = [
            (&sessions, "acme:alice:chat:1", Some(("acme", "alice"))),
            (&sessions, "acme:alice:", Some(("acme", "alice"))),
            (&sessions, "acme:alice", None),
            (&sessions, "acme::x", None),
            (&sessions, ":alice:x", None),
            (&history, "message_store:acme:bob", Some(("acme", "bob"))),
            (
                &history,
                "message_store:acme:bob:x",
                Some(("acme", "bob:x")),
            ),
            (&history, "message_store:acme", None),
            (&history, "other:acme:bob", None),
        ];
        for (p, key, want) in cases {
            let got = p.owner(key).map(|o| (o.tenant, o.subject));
            assert_eq!(got, want, "{} on {key}", p.text);
        }
        let both = [history.clone(), sessions.clone()];
        let first = owner(&both, "message_store:acme:bob").unwrap();
        assert_eq!((first.purpose, first.category), ("support", "conversation"));
    }

    #[test]
    fn patterns_that_cannot_say_whose_a_key_is_are_refused() {
        for bad in [
            "{tenant}:*",
            "{subject}:*",
            "{tenant}{subject}",
            "{tenant}:{subject}:{subject}",
            "{tenant}:*:{subject}",
            "{tenant}:{subject}:?",
            "{tenant}:[ab]:{subject}",
            "",
        ] {
            assert!(pattern(bad).is_err(), "{bad:?} accepted");
        }
    }

    proptest! {
        /// A key made from a tenant and a subject without the separator is read back as theirs,
        /// and no key is given an owner that does not appear in it.
        #[test]
        fn owners_round_trip(tenant in "[a-z0-9_]{1,12}", subject in "[a-zA-Z0-9@._-]{1,20}", tail in "[ -~]{0,20}") {
            let p = pattern("{tenant}:{subject}:*").unwrap();
            let key = format!("{tenant}:{subject}:{tail}");
            let owner = p.owner(&key).unwrap();
            prop_assert_eq!((owner.tenant, owner.subject), (tenant.as_str(), subject.as_str()));
        }

        #[test]
        fn any_key_is_read_without_panic(key in "\\PC{0,40}") {
            let p = pattern("x{tenant}.{subject}").unwrap();
            if let Some(owner) = p.owner(&key) {
                prop_assert!(key.contains(owner.tenant) && key.contains(owner.subject));
            }
        }
    }
}
