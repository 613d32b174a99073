//! `[lineage]`: what derivative lineage remembers, and for how long.

use std::time::Duration;

use serde::Deserialize;

use super::values::ConfigDuration;

/// Derivative lineage: what traffic derives from what, learnt as it passes (`[lineage]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LineageConfig {
    /// Whether writes and prompts are checked for what they derive from (a trace that read
    /// items, quotes of served or written text, a model's answer). Off: every item is raw, and an
    /// erasure reaches only the subject's own items.
    pub derivatives: bool,
    /// How long what Lethe served or accepted is remembered: a write derives from what its trace
    /// read, or what it quotes, within this window; after a flip, writes that would re-derive
    /// the subject's data are refused for as long.
    pub window: ConfigDuration,
    /// How many consecutive normalised words make a quote (4 to 64); shorter overlaps never
    /// count.
    pub quote_words: usize,
    /// What an erasure does with derivatives stamped to other subjects.
    pub cross_subject: CrossSubject,
    /// The most distinct traces remembered (then the oldest are forgotten first).
    pub max_traces: usize,
    /// The most fingerprints (runs of words) remembered.
    pub max_fingerprints: usize,
    /// The most memory (bytes) both memories together may take.
    pub max_bytes: u64,
}

/// What happens to another subject's item derived from an erased subject's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CrossSubject {
    /// Hidden at the flip, then erased or released by a person; the request completes once all
    /// are decided.
    #[default]
    Review,
    /// Hidden at the flip and erased with the subject's own items.
    Erase,
}

impl Default for LineageConfig {
    fn default() -> Self {
        LineageConfig {
            derivatives: true,
            window: ConfigDuration(Duration::from_secs(15 * 60)),
            quote_words: 12,
            cross_subject: CrossSubject::Review,
            max_traces: 100_000,
            max_fingerprints: 1_000_000,
            max_bytes: 16 * 1024 * 1024,
        }
    }
}

impl LineageConfig {
    pub(super) fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let window = self.window.0;
        if window < Duration::from_secs(60) || window > Duration::from_secs(24 * 3600) {
            problems.push("lineage.window: 1m to 24h".to_owned());
        }
        if !(4..=lethe_policy::derivation::MAX_QUOTE_WORDS).contains(&self.quote_words) {
            problems.push(format!(
                "lineage.quote_words: 4 to {} (fewer would make common phrases quotes)",
                lethe_policy::derivation::MAX_QUOTE_WORDS
            ));
        }
        if self.max_traces == 0 || self.max_fingerprints == 0 {
            problems.push(
                "lineage.max_traces and lineage.max_fingerprints: must be greater than zero"
                    .to_owned(),
            );
        }
        if self.max_bytes < 1024 * 1024 {
            problems.push("lineage.max_bytes: at least 1048576 (1 MiB)".to_owned());
        }
        problems
    }
}
