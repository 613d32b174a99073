//! Canonical names: every identifier a client sends (a tenant, a subject key or alias, a purpose,
//! a category, an actor) is brought to one spelling before anything is decided on it, or refused.
//! Two spellings that look alike must not be two subjects: `carol` written decomposed is
//! `carol`; `carol ` (a trailing space) and names carrying invisible characters (a bidi
//! override, a zero-width space) are refused. A tenant may declare its subject keys
//! case-insensitive (e-mail addresses): `Carol` is then `carol`.

use std::borrow::Cow;
use std::collections::BTreeSet;

use unicode_normalization::UnicodeNormalization;

/// The longest name, in bytes, once normalised.
pub const MAX_NAME_BYTES: usize = 200;

/// Why a name is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("must not be empty")]
    Empty,
    #[error("must be at most 200 bytes")]
    TooLong,
    #[error("must not begin or end with whitespace")]
    EdgeWhitespace,
    #[error("must not contain control or invisible formatting characters")]
    Invisible,
    #[error("must not contain '/'")]
    Slash,
}

/// The control characters (general category Cc), which `char::is_control` finds.
pub const CONTROL: &[(char, char)] = &[('\u{0}', '\u{1F}'), ('\u{7F}', '\u{9F}')];

/// The whitespace `char::is_whitespace` finds (Unicode's White_Space), which no name begins or
/// ends with.
pub const WHITESPACE: &[(char, char)] = &[
    ('\u{9}', '\u{D}'),
    ('\u{20}', '\u{20}'),
    ('\u{85}', '\u{85}'),
    ('\u{A0}', '\u{A0}'),
    ('\u{1680}', '\u{1680}'),
    ('\u{2000}', '\u{200A}'),
    ('\u{2028}', '\u{2029}'),
    ('\u{202F}', '\u{202F}'),
    ('\u{205F}', '\u{205F}'),
    ('\u{3000}', '\u{3000}'),
];

/// Unicode's format characters (general category Cf: bidi controls, zero-width and joiners,
/// soft hyphen, tags...), the other default-ignorable ones (variation selectors, fillers, the
/// grapheme joiner), and the line and paragraph separators: they change how a name looks, or
/// hide in it.
pub const INVISIBLE: &[(char, char)] = &[
    ('\u{00AD}', '\u{00AD}'),
    ('\u{034F}', '\u{034F}'),
    ('\u{0600}', '\u{0605}'),
    ('\u{061C}', '\u{061C}'),
    ('\u{06DD}', '\u{06DD}'),
    ('\u{070F}', '\u{070F}'),
    ('\u{0890}', '\u{0891}'),
    ('\u{08E2}', '\u{08E2}'),
    ('\u{115F}', '\u{1160}'),
    ('\u{17B4}', '\u{17B5}'),
    ('\u{180B}', '\u{180F}'),
    ('\u{200B}', '\u{200F}'),
    ('\u{2028}', '\u{202E}'),
    ('\u{2060}', '\u{2064}'),
    ('\u{2066}', '\u{206F}'),
    ('\u{3164}', '\u{3164}'),
    ('\u{FE00}', '\u{FE0F}'),
    ('\u{FEFF}', '\u{FEFF}'),
    ('\u{FFA0}', '\u{FFA0}'),
    ('\u{FFF9}', '\u{FFFB}'),
    ('\u{110BD}', '\u{110BD}'),
    ('\u{110CD}', '\u{110CD}'),
    ('\u{13430}', '\u{1343F}'),
    ('\u{1BCA0}', '\u{1BCA3}'),
    ('\u{1D173}', '\u{1D17A}'),
    ('\u{E0000}', '\u{E0FFF}'),
];

fn invisible(c: char) -> bool {
    c.is_control() || INVISIBLE.iter().any(|&(lo, hi)| (lo..=hi).contains(&c))
}

/// A name in its one spelling: NFC, with nothing invisible and no whitespace at its edges, not
/// empty, at most [`MAX_NAME_BYTES`]; `fold`: case folded too (a tenant's case-insensitive
/// subject keys). Borrowed when it was canonical already.
pub fn canonical(name: &str, fold: bool) -> Result<Cow<'_, str>, NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.chars().any(invisible) {
        return Err(NameError::Invisible);
    }
    if name.starts_with(char::is_whitespace) || name.ends_with(char::is_whitespace) {
        return Err(NameError::EdgeWhitespace);
    }
    let mut name: Cow<'_, str> = match unicode_normalization::is_nfc_quick(name.chars()) {
        unicode_normalization::IsNormalized::Yes => Cow::Borrowed(name),
        _ => {
            let normal: String = name.nfc().collect();
            if normal == name {
                Cow::Borrowed(name)
            } else {
                Cow::Owned(normal)
            }
        }
    };
    if fold
        && name
            .chars()
            .any(|c| c.to_lowercase().ne(std::iter::once(c)))
    {
        // Lowercasing can leave a decomposed sequence (İ): normalised again.
        name = Cow::Owned(name.to_lowercase().nfc().collect());
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(NameError::TooLong);
    }
    Ok(name)
}

/// A name that also takes part in `tenant/subject` references (tenants, subject keys): no `/`.
pub fn canonical_key(name: &str, fold: bool) -> Result<Cow<'_, str>, NameError> {
    let name = canonical(name, fold)?;
    if name.contains('/') {
        return Err(NameError::Slash);
    }
    Ok(name)
}

/// The tenants whose subject keys are case-insensitive.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Folding(BTreeSet<String>);

impl Folding {
    pub fn new(tenants: impl IntoIterator<Item = String>) -> Folding {
        Folding(tenants.into_iter().collect())
    }

    /// Whether the tenant's subject keys are folded.
    pub fn folds(&self, tenant: &str) -> bool {
        self.0.contains(tenant)
    }

    /// The tenants whose keys are folded.
    pub fn tenants(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }

    /// A subject key (or alias) of `tenant` in its one spelling.
    pub fn subject<'a>(&self, tenant: &str, key: &'a str) -> Result<Cow<'a, str>, NameError> {
        canonical_key(key, self.folds(tenant))
    }
}

/// Two canonical names a person could not tell apart: the same but for case, whitespace or
/// compatibility forms (fullwidth letters, ligatures).
pub fn confusable(a: &str, b: &str) -> bool {
    let plain = |s: &str| -> String {
        s.nfkc()
            .filter(|c| !c.is_whitespace())
            .flat_map(char::to_lowercase)
            .collect()
    };
    plain(a) == plain(b)
}

#[cfg(test)]
mod tests;
