//! Derivative lineage, decided without I/O: which trace a request belongs to (W3C
//! `traceparent`), what a text quotes (keyed fingerprints of its runs of normalised words), and
//! whether something derived from stored items may still be made.
//!
//! A fingerprint is a 64-bit SipHash-1-3 of a run of word hashes, both keyed with a tenant's own
//! key (derived from the audit key): it reveals nothing of the text, and the same text in another
//! tenant has other fingerprints, so one tenant's text never matches another's.

use std::hash::Hasher;

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use siphasher::sip::SipHasher13;
use unicode_normalization::UnicodeNormalization;

use crate::decision::{PolicyView, Refusal};

/// The longest run of words a quote may be configured to need.
pub const MAX_QUOTE_WORDS: usize = 64;

/// A W3C trace id: the 16 bytes a `traceparent` header names, never all zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TraceId(pub [u8; 16]);

impl TraceId {
    /// The trace of a `traceparent` value (`version-traceid-parentid-flags`, lowercase hex), or
    /// `None` when it is not a valid one: the W3C recommendation has an invalid header ignored,
    /// not refused.
    pub fn from_traceparent(value: &str) -> Option<TraceId> {
        let bytes = value.trim().as_bytes();
        let field = |from: usize, len: usize| -> Option<&[u8]> {
            let slice = bytes.get(from..from + len)?;
            slice
                .iter()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
                .then_some(slice)
        };
        let version = field(0, 2)?;
        // Version ff is forbidden; version 00 is exactly 55 characters, later ones may add
        // fields after a dash.
        let length_ok = match version {
            b"ff" => false,
            b"00" => bytes.len() == 55,
            _ => bytes.len() == 55 || bytes.get(55) == Some(&b'-'),
        };
        let dashes = [2, 35, 52].iter().all(|&i| bytes.get(i) == Some(&b'-'));
        let trace = field(3, 32)?;
        let parent = field(36, 16)?;
        field(53, 2)?;
        if !length_ok || !dashes || parent.iter().all(|&b| b == b'0') {
            return None;
        }
        let mut id = [0u8; 16];
        for (i, pair) in trace.chunks(2).enumerate() {
            let text = std::str::from_utf8(pair).ok()?;
            *id.get_mut(i)? = u8::from_str_radix(text, 16).ok()?;
        }
        (id != [0; 16]).then_some(TraceId(id))
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

/// The keys of one tenant's fingerprints.
#[derive(Clone, PartialEq, Eq)]
pub struct QuoteKey {
    word: (u64, u64),
    run: (u64, u64),
}

impl std::fmt::Debug for QuoteKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("QuoteKey(..)")
    }
}

/// What Lethe keeps of a text: the fingerprint of every run of `quote_words` consecutive
/// normalised words, and a digest of the whole (to know a text seen before without looking at
/// every run again).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fingerprints {
    pub runs: Vec<u64>,
    pub digest: u64,
}

impl QuoteKey {
    /// The tenant's keys: `HMAC-SHA256(secret, "lethe/quotes/" tenant)`, split in four.
    pub fn of_tenant(secret: &[u8], tenant: &str) -> QuoteKey {
        let mut words = [0u64; 4];
        // HMAC accepts keys of any length, so this never takes the error branch.
        if let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) {
            mac.update(b"lethe/quotes/");
            mac.update(tenant.as_bytes());
            let bytes = mac.finalize().into_bytes();
            for (word, chunk) in words.iter_mut().zip(bytes.chunks(8)) {
                let mut le = [0u8; 8];
                le.copy_from_slice(chunk);
                *word = u64::from_le_bytes(le);
            }
        }
        let [a, b, c, d] = words;
        QuoteKey {
            word: (a, b),
            run: (c, d),
        }
    }

    fn word_hash(&self, word: &[u8]) -> u64 {
        let mut h = SipHasher13::new_with_keys(self.word.0, self.word.1);
        h.write(word);
        h.finish()
    }

    /// The keyed fingerprint of a run's rolling sum.
    fn finish(&self, sum: u64) -> u64 {
        let mut h = SipHasher13::new_with_keys(self.run.0, self.run.1);
        h.write(&sum.to_le_bytes());
        h.finish()
    }

    /// The fingerprints of `text` for quotes of `quote_words` words (clamped to 1 ..=
    /// [`MAX_QUOTE_WORDS`]); a text with fewer words has no runs (and cannot quote, nor be
    /// quoted).
    ///
    /// Each run's word hashes (keyed, so pseudo-random to whoever lacks the key) are combined by
    /// a cyclic polynomial (each word rotated by its place in the run), rolled one word at a
    /// time, and the sum is keyed again: one short hash per run rather than one per word of it.
    pub fn fingerprints(&self, text: &str, quote_words: usize) -> Fingerprints {
        let run = quote_words.clamp(1, MAX_QUOTE_WORDS);
        let mut hashes = Vec::new();
        words(text, |w| hashes.push(self.word_hash(w)));
        let mut runs = Vec::with_capacity(hashes.len().saturating_sub(run - 1));
        let mut sum = 0u64;
        let mut all = SipHasher13::new_with_keys(self.run.1, self.run.0);
        let shift = u32::try_from(run).unwrap_or(0);
        for (i, &h) in hashes.iter().enumerate() {
            all.write(&h.to_le_bytes());
            sum = sum.rotate_left(1) ^ h;
            if let Some(&gone) = i.checked_sub(run).and_then(|j| hashes.get(j)) {
                sum ^= gone.rotate_left(shift);
            }
            if i + 1 >= run {
                runs.push(self.finish(sum));
            }
        }
        Fingerprints {
            runs,
            digest: all.finish(),
        }
    }
}

/// Calls `each` with every normalised word of `text`: compatibility-composed (NFKC), in lower
/// case, each a run of letters and digits; everything else (punctuation, spaces, symbols)
/// separates words and is dropped.
pub fn words(text: &str, mut each: impl FnMut(&[u8])) {
    if text.is_ascii() {
        let mut lower = Vec::new();
        for word in text
            .as_bytes()
            .split(|b| !b.is_ascii_alphanumeric())
            .filter(|w| !w.is_empty())
        {
            if word.iter().any(u8::is_ascii_uppercase) {
                lower.clear();
                lower.extend(word.iter().map(u8::to_ascii_lowercase));
                each(&lower);
            } else {
                each(word);
            }
        }
        return;
    }
    // Most text is composed already; only the rest pays for normalisation.
    match unicode_normalization::is_nfkc_quick(text.chars()) {
        unicode_normalization::IsNormalized::Yes => words_of_chars(text.chars(), each),
        _ => words_of_chars(text.nfkc(), each),
    }
}

fn words_of_chars(chars: impl Iterator<Item = char>, mut each: impl FnMut(&[u8])) {
    let mut word = String::new();
    for c in chars {
        if c.is_ascii_alphanumeric() {
            word.push(c.to_ascii_lowercase());
        } else if c.is_alphanumeric() {
            word.extend(c.to_lowercase());
        } else if !word.is_empty() {
            each(word.as_bytes());
            word.clear();
        }
    }
    if !word.is_empty() {
        each(word.as_bytes());
    }
}

/// How a new item came from one of its parents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum How {
    /// The parent was served under the same trace, within the window.
    Trace,
    /// The new text contains a run of the parent's words.
    Quote,
    /// The parent is a model's answer the new text quotes.
    Provider,
}

impl How {
    pub const ALL: [How; 3] = [How::Trace, How::Quote, How::Provider];

    pub fn as_str(self) -> &'static str {
        match self {
            How::Trace => "trace",
            How::Quote => "quote",
            How::Provider => "provider",
        }
    }

    pub fn parse(s: &str) -> Option<How> {
        How::ALL.into_iter().find(|h| h.as_str() == s)
    }
}

/// An item where it is kept: the store (a route's name), the collection, the id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ItemRef<'a> {
    pub store: &'a str,
    pub collection: &'a str,
    pub id: &'a str,
}

/// One parent of something new: the item, whose it is (its stamp's subject), and how the new
/// thing came from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent<'a> {
    pub item: ItemRef<'a>,
    pub owner: &'a str,
    pub how: How,
}

/// May something derived from `parents` (a write, or a prompt whose answer would derive from
/// them) be made in `tenant`? Not when a parent is a suppressed or erased subject's, or is itself
/// hidden as part of an erasure's closure: it would bring back what the erasure takes away.
pub fn decide_derivation<'p>(
    view: &impl PolicyView,
    tenant: &str,
    parents: impl IntoIterator<Item = &'p Parent<'p>>,
) -> Result<(), Refusal> {
    for parent in parents {
        let erased = view
            .subject(tenant, parent.owner)
            .is_some_and(|p| !p.state.is_active());
        if erased || view.derivative_suppressed(tenant, &parent.item) {
            return Err(Refusal::DerivedFromErased);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
