//! Audit primitives: pseudonymous subject references, the canonical encoding of an event, the
//! keyed hash chain, and its verification.
//!
//! `hash = HMAC-SHA256(audit key, prev_hash || canonical(event))`: without the key no row can be
//! altered and the chain sealed again after it. Cutting rows off the end needs no key, so heads
//! signed apart from the chain anchor it: a verifier given them refuses a chain that no longer
//! holds them. The canonical encoding is length-prefixed, so no choice of field values can make
//! two different events encode alike.

use std::fmt::Write as _;

use chrono::{DateTime, SecondsFormat, Utc};
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The `prev_hash` of the first event.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// How the state store names a subject once its erasure has completed: `ref/` and its
/// reference. Subjects never contain `/`, so a forgotten name is never taken for a key.
pub const FORGOTTEN: &str = "ref/";

/// The name the state store keeps for `subject` once it is erased: its reference, marked.
/// A name already forgotten stays as it is.
pub fn forgotten(key: &[u8], tenant: &str, subject: &str) -> String {
    if subject.starts_with(FORGOTTEN) {
        subject.to_owned()
    } else {
        format!("{FORGOTTEN}{}", subject_ref(key, tenant, subject))
    }
}

/// `HMAC-SHA256(key, tenant "/" subject)`, hex. Lets the audit log name a subject without
/// holding its key; whoever has the HMAC key can recompute it to answer "what happened to X".
/// Of a forgotten name (see [`forgotten`]) it is the reference the name holds.
pub fn subject_ref(key: &[u8], tenant: &str, subject: &str) -> String {
    if let Some(reference) = subject.strip_prefix(FORGOTTEN) {
        return reference.to_owned();
    }
    // HMAC accepts keys of any length, so this never takes the error branch.
    match Hmac::<Sha256>::new_from_slice(key) {
        Ok(mut mac) => {
            mac.update(tenant.as_bytes());
            mac.update(b"/");
            mac.update(subject.as_bytes());
            hex::encode(mac.finalize().into_bytes())
        }
        Err(_) => String::new(),
    }
}

/// What happened, before it is sealed into the chain. Content-free by construction: every field
/// is an identifier, a name or an outcome, never a payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub at: DateTime<Utc>,
    /// The tenant the event belongs to (`None`: the deployment's as a whole, seen by admins
    /// only). Hashed with the event, so it cannot be moved to another tenant afterwards.
    pub tenant: Option<String>,
    pub actor: String,
    pub action: String,
    pub request_id: String,
    pub subject_ref: Option<String>,
    pub target: String,
    pub target_ref: Option<String>,
    pub result: String,
    pub attempt: i64,
}

/// One sealed row of the chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    pub seq: i64,
    #[serde(flatten)]
    pub entry: AuditEntry,
    pub prev_hash: String,
    pub hash: String,
    /// Its place in its tenant's own chain, for events that belong to a tenant.
    pub tenant_chain: Option<TenantLink>,
    /// Its link as written before the chain was keyed, if it was: heads saved or certified then
    /// name it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub legacy_hash: Option<String>,
}

/// An event's link in its tenant's chain: `hash = SHA-256(prev_hash || the event's hash)`. The
/// event's hash covers its content, so a tenant's rows verify on their own, without any other
/// tenant's, and no row can be taken out of or slipped into a tenant's chain unnoticed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantLink {
    pub seq: i64,
    pub prev_hash: String,
    pub hash: String,
}

/// Timestamps are hashed at microsecond precision, the finest both state stores keep.
pub fn canonical_time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// The bytes that are hashed for an event at position `seq`.
pub fn canonical(seq: i64, entry: &AuditEntry) -> Vec<u8> {
    let mut out = String::with_capacity(256);
    let mut field = |name: &str, value: Option<&str>| {
        // Writing to a String cannot fail.
        let _ = match value {
            Some(v) => writeln!(out, "{name}:{}:{v}", v.len()),
            None => writeln!(out, "{name}!"),
        };
    };
    // Version 1 (events without a tenant) is unchanged, so chains written before tenants were
    // recorded still verify; version 2 adds the tenant.
    field("v", Some(if entry.tenant.is_some() { "2" } else { "1" }));
    field("seq", Some(&seq.to_string()));
    if let Some(tenant) = &entry.tenant {
        field("tenant", Some(tenant));
    }
    field("at", Some(&canonical_time(entry.at)));
    field("actor", Some(&entry.actor));
    field("action", Some(&entry.action));
    field("request_id", Some(&entry.request_id));
    field("subject_ref", entry.subject_ref.as_deref());
    field("target", Some(&entry.target));
    field("target_ref", entry.target_ref.as_deref());
    field("result", Some(&entry.result));
    field("attempt", Some(&entry.attempt.to_string()));
    out.into_bytes()
}

/// How the chain's links are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links<'k> {
    /// HMAC-SHA256 with the audit key.
    Keyed(&'k [u8]),
    /// Plain SHA-256: chains written before links were keyed, read only to verify them before
    /// they are sealed again with the key.
    Unkeyed,
}

impl Links<'_> {
    fn digest(self, parts: &[&[u8]]) -> String {
        match self {
            // HMAC accepts keys of any length, so this never takes the error branch.
            Links::Keyed(key) => match Hmac::<Sha256>::new_from_slice(key) {
                Ok(mut mac) => {
                    parts.iter().for_each(|p| mac.update(p));
                    hex::encode(mac.finalize().into_bytes())
                }
                Err(_) => String::new(),
            },
            Links::Unkeyed => {
                let mut hasher = Sha256::new();
                parts.iter().for_each(|p| hasher.update(p));
                hex::encode(hasher.finalize())
            }
        }
    }

    /// The link of the event at `seq` after `prev_hash`: over `prev_hash` as the hex text it is
    /// stored as and the event's canonical bytes, so a verifier needs the rows and the key.
    pub fn chain_hash(self, prev_hash: &str, seq: i64, entry: &AuditEntry) -> String {
        self.digest(&[prev_hash.as_bytes(), &canonical(seq, entry)])
    }

    /// The link of a tenant chain to an event whose hash is `event_hash`.
    pub fn tenant_link_hash(self, prev_hash: &str, event_hash: &str) -> String {
        self.digest(&[prev_hash.as_bytes(), event_hash.as_bytes()])
    }
}

/// What a chain keeps to tell the key its links are made with, without the key: an HMAC of a
/// fixed text.
pub fn key_check(key: &[u8]) -> String {
    Links::Keyed(key).digest(&[b"lethe audit key check"])
}

/// Seals `entry` as the row after `head`, and when it belongs to a tenant, as the link after
/// `tenant_head` in that tenant's chain.
pub fn seal(
    links: Links<'_>,
    head: &ChainHead,
    tenant_head: &ChainHead,
    entry: AuditEntry,
) -> AuditRecord {
    let seq = head.seq.saturating_add(1);
    let hash = links.chain_hash(&head.hash, seq, &entry);
    let tenant_chain = entry.tenant.is_some().then(|| TenantLink {
        seq: tenant_head.seq.saturating_add(1),
        prev_hash: tenant_head.hash.clone(),
        hash: links.tenant_link_hash(&tenant_head.hash, &hash),
    });
    AuditRecord {
        seq,
        entry,
        prev_hash: head.hash.clone(),
        hash,
        tenant_chain,
        legacy_hash: None,
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "snake_case", tag = "problem")]
pub enum ChainBreak {
    #[error("row {expected} is missing (the next row found is {found})")]
    Missing { expected: i64, found: i64 },
    #[error("row {seq} does not point at the hash of the row before it")]
    Unlinked { seq: i64 },
    #[error("row {seq} was altered: its content does not match its hash")]
    Altered { seq: i64 },
    #[error("the log ends at row {last} but its head says {head}: rows after {last} are missing")]
    Truncated { last: i64, head: i64 },
    #[error("row {seq} is not the row a signed head names there: the log was rewritten")]
    Rewritten { seq: i64 },
    #[error(
        "the log ends at row {last} but a signed head names row {signed}: rows after {last} were cut off"
    )]
    CutBeforeSignedHead { last: i64, signed: i64 },
    #[error(
        "a signed head kept for row {seq} does not verify with the certificates' key: it was forged"
    )]
    ForgedHead { seq: i64 },
    #[error(
        "the chain's links are not keyed (written before they were, or marked so since): nothing of it can be trusted until `lethe audit key-chain` verifies it as written and seals it with the key"
    )]
    Unkeyed,
    #[error("the chain's links were made with another key than this one")]
    WrongKey,
}

impl ChainBreak {
    /// The sequence number of the first row that is wrong.
    pub fn seq(&self) -> i64 {
        match *self {
            ChainBreak::Missing { expected, .. } => expected,
            ChainBreak::Unlinked { seq }
            | ChainBreak::Altered { seq }
            | ChainBreak::Rewritten { seq }
            | ChainBreak::ForgedHead { seq } => seq,
            ChainBreak::Unkeyed | ChainBreak::WrongKey => 1,
            ChainBreak::Truncated { last, .. } | ChainBreak::CutBeforeSignedHead { last, .. } => {
                last.saturating_add(1)
            }
        }
    }
}

/// The end of a verified chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainHead {
    pub seq: i64,
    pub hash: String,
}

impl Default for ChainHead {
    fn default() -> Self {
        ChainHead {
            seq: 0,
            hash: GENESIS_HASH.to_owned(),
        }
    }
}

/// Checks rows one at a time, in `seq` order, so a long log can be verified page by page; every
/// anchor (a head signed earlier) must still be in the chain, and the chain must reach the last.
#[derive(Debug, Clone)]
pub struct ChainVerifier<'k> {
    links: Links<'k>,
    head: ChainHead,
    anchors: std::collections::BTreeMap<i64, String>,
}

impl<'k> ChainVerifier<'k> {
    pub fn new(links: Links<'k>) -> Self {
        ChainVerifier {
            links,
            head: ChainHead::default(),
            anchors: Default::default(),
        }
    }

    /// Heads signed earlier, each of which the chain must still hold.
    pub fn anchored(mut self, anchors: impl IntoIterator<Item = ChainHead>) -> Self {
        self.anchors
            .extend(anchors.into_iter().map(|a| (a.seq, a.hash)));
        self
    }

    pub fn push(&mut self, record: &AuditRecord) -> Result<(), ChainBreak> {
        let intact = self
            .links
            .chain_hash(&record.prev_hash, record.seq, &record.entry)
            == record.hash;
        self.step(
            record.seq,
            &record.prev_hash,
            &record.hash,
            intact,
            record.legacy_hash.as_deref(),
        )
    }

    /// One link: at the next position, pointing at the head, `intact`, and the one an anchor
    /// names there (as it is, or as it was written before the chain was keyed: `legacy`).
    fn step(
        &mut self,
        seq: i64,
        prev_hash: &str,
        hash: &str,
        intact: bool,
        legacy: Option<&str>,
    ) -> Result<(), ChainBreak> {
        let expected = self.head.seq.saturating_add(1);
        if seq != expected {
            return Err(ChainBreak::Missing {
                expected,
                found: seq,
            });
        }
        if prev_hash != self.head.hash {
            return Err(ChainBreak::Unlinked { seq });
        }
        if !intact {
            return Err(ChainBreak::Altered { seq });
        }
        if self
            .anchors
            .get(&seq)
            .is_some_and(|signed| signed != hash && Some(signed.as_str()) != legacy)
        {
            return Err(ChainBreak::Rewritten { seq });
        }
        self.head = ChainHead {
            seq,
            hash: hash.to_owned(),
        };
        Ok(())
    }

    /// Ends verification against the head the store recorded, which catches rows cut off the
    /// end, and against the last anchor, which catches a head recorded again after a cut.
    pub fn finish(self, recorded: &ChainHead) -> Result<ChainHead, ChainBreak> {
        if let Some((&signed, _)) = self.anchors.last_key_value()
            && signed > self.head.seq
        {
            return Err(ChainBreak::CutBeforeSignedHead {
                last: self.head.seq,
                signed,
            });
        }
        if self.head == *recorded {
            Ok(self.head)
        } else if self.head.seq < recorded.seq {
            Err(ChainBreak::Truncated {
                last: self.head.seq,
                head: recorded.seq,
            })
        } else {
            Err(ChainBreak::Unlinked { seq: self.head.seq })
        }
    }
}

/// Checks one tenant's rows (in order, nothing else) against that tenant's chain; positions in
/// what it reports are positions in the tenant's chain.
#[derive(Debug, Clone)]
pub struct TenantChainVerifier<'k> {
    tenant: String,
    chain: ChainVerifier<'k>,
}

impl<'k> TenantChainVerifier<'k> {
    pub fn new(links: Links<'k>, tenant: &str) -> Self {
        TenantChainVerifier {
            tenant: tenant.to_owned(),
            chain: ChainVerifier::new(links),
        }
    }

    /// Heads of the tenant's chain signed earlier, each of which it must still hold.
    pub fn anchored(mut self, anchors: impl IntoIterator<Item = ChainHead>) -> Self {
        self.chain = self.chain.anchored(anchors);
        self
    }

    pub fn push(&mut self, record: &AuditRecord) -> Result<(), ChainBreak> {
        let next = self.chain.head.seq.saturating_add(1);
        let Some(link) = &record.tenant_chain else {
            return Err(ChainBreak::Unlinked { seq: next });
        };
        let links = self.chain.links;
        let intact = record.entry.tenant.as_deref() == Some(self.tenant.as_str())
            && links.chain_hash(&record.prev_hash, record.seq, &record.entry) == record.hash
            && links.tenant_link_hash(&link.prev_hash, &record.hash) == link.hash;
        self.chain
            .step(link.seq, &link.prev_hash, &link.hash, intact, None)
    }

    /// Ends verification against the tenant's head as the store recorded it.
    pub fn finish(self, recorded: &ChainHead) -> Result<ChainHead, ChainBreak> {
        self.chain.finish(recorded)
    }
}

/// Verifies a whole chain from its first row; on success, its head.
pub fn verify_chain<'a>(
    links: Links<'_>,
    records: impl IntoIterator<Item = &'a AuditRecord>,
) -> Result<ChainHead, ChainBreak> {
    let mut verifier = ChainVerifier::new(links);
    for record in records {
        verifier.push(record)?;
    }
    Ok(verifier.head)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    const KEY: &[u8] = b"audit key";
    const LINKS: Links<'static> = Links::Keyed(KEY);

    fn entry(i: u32) -> AuditEntry {
        AuditEntry {
            at: Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, i % 60).unwrap(),
            tenant: None,
            actor: format!("dpo-{i}"),
            action: "consent.grant".into(),
            request_id: format!("req-{i}"),
            subject_ref: i
                .is_multiple_of(2)
                .then(|| subject_ref(b"key", "acme", "u1")),
            target: "consent".into(),
            target_ref: Some(format!("g{i}")),
            result: "ok".into(),
            attempt: 1,
        }
    }

    fn chain(n: u32) -> Vec<AuditRecord> {
        tenants_chain(n, |_| None)
    }

    /// `n` events, event `i` belonging to `tenant_of(i)`, sealed as the store seals them.
    fn tenants_chain(n: u32, tenant_of: impl Fn(u32) -> Option<&'static str>) -> Vec<AuditRecord> {
        let mut head = ChainHead::default();
        let mut tenant_heads: std::collections::BTreeMap<&str, ChainHead> = Default::default();
        (0..n)
            .map(|i| {
                let tenant = tenant_of(i);
                let tenant_head = tenant
                    .map(|t| tenant_heads.get(t).cloned().unwrap_or_default())
                    .unwrap_or_default();
                let e = AuditEntry {
                    tenant: tenant.map(str::to_owned),
                    ..entry(i)
                };
                let record = seal(LINKS, &head, &tenant_head, e);
                head = ChainHead {
                    seq: record.seq,
                    hash: record.hash.clone(),
                };
                if let (Some(t), Some(link)) = (tenant, &record.tenant_chain) {
                    tenant_heads.insert(
                        t,
                        ChainHead {
                            seq: link.seq,
                            hash: link.hash.clone(),
                        },
                    );
                }
                record
            })
            .collect()
    }

    fn verify_tenant(
        tenant: &str,
        rows: &[AuditRecord],
        recorded: &ChainHead,
    ) -> Result<ChainHead, ChainBreak> {
        let mut verifier = TenantChainVerifier::new(LINKS, tenant);
        rows.iter().try_for_each(|r| verifier.push(r))?;
        verifier.finish(recorded)
    }

    fn tenant_head(rows: &[AuditRecord], tenant: &str) -> ChainHead {
        rows.iter()
            .filter(|r| r.entry.tenant.as_deref() == Some(tenant))
            .filter_map(|r| r.tenant_chain.as_ref())
            .next_back()
            .map(|l| ChainHead {
                seq: l.seq,
                hash: l.hash.clone(),
            })
            .unwrap_or_default()
    }

    #[test]
    fn events_without_a_tenant_keep_the_first_encoding() {
        let e = AuditEntry {
            subject_ref: None,
            target_ref: None,
            ..entry(3)
        };
        let expected = "v:1:1\nseq:1:7\nat:27:2026-01-01T00:00:03.000000Z\nactor:5:dpo-3\naction:13:consent.grant\nrequest_id:5:req-3\nsubject_ref!\ntarget:7:consent\ntarget_ref!\nresult:2:ok\nattempt:1:1\n";
        assert_eq!(String::from_utf8(canonical(7, &e)).unwrap(), expected);
        let with_tenant = AuditEntry {
            tenant: Some("acme".into()),
            ..e
        };
        assert!(
            String::from_utf8(canonical(7, &with_tenant))
                .unwrap()
                .starts_with("v:1:2\nseq:1:7\ntenant:4:acme\n")
        );
    }

    #[test]
    fn a_tenants_rows_verify_on_their_own() {
        let tenant_of = |i: u32| match i % 3 {
            0 => Some("acme"),
            1 => Some("globex"),
            _ => None,
        };
        let rows = tenants_chain(12, tenant_of);
        assert!(
            verify_chain(LINKS, &rows).is_ok(),
            "the whole chain still verifies"
        );
        let acme: Vec<AuditRecord> = rows
            .iter()
            .filter(|r| r.entry.tenant.as_deref() == Some("acme"))
            .cloned()
            .collect();
        let head = tenant_head(&rows, "acme");
        assert_eq!(verify_tenant("acme", &acme, &head), Ok(head.clone()));
        assert_eq!(head.seq, 4);

        let mut dropped = acme.clone();
        dropped.remove(1);
        assert_eq!(
            verify_tenant("acme", &dropped, &head),
            Err(ChainBreak::Missing {
                expected: 2,
                found: 3
            })
        );
        assert_eq!(
            verify_tenant("acme", &acme[..3], &head),
            Err(ChainBreak::Truncated { last: 3, head: 4 })
        );
        let mut moved = acme.clone();
        moved[2].entry.tenant = Some("globex".into());
        assert_eq!(
            verify_tenant("acme", &moved, &head),
            Err(ChainBreak::Altered { seq: 3 })
        );
        let mut edited = acme.clone();
        edited[0].entry.actor = "mallory".into();
        assert_eq!(
            verify_tenant("acme", &edited, &head),
            Err(ChainBreak::Altered { seq: 1 })
        );
        // Another tenant's row, or one of nobody's, is not part of acme's chain.
        let globex_row = rows
            .iter()
            .find(|r| r.entry.tenant.as_deref() == Some("globex"))
            .unwrap()
            .clone();
        let mut slipped = acme.clone();
        slipped.insert(1, globex_row);
        assert!(verify_tenant("acme", &slipped, &head).is_err());
        let mut untenanted = acme.clone();
        untenanted.insert(1, rows[2].clone());
        assert_eq!(
            verify_tenant("acme", &untenanted, &head),
            Err(ChainBreak::Unlinked { seq: 2 })
        );
        // Taking the tenant off an event breaks the whole chain at that row.
        let mut stripped = rows.clone();
        stripped[3].entry.tenant = None;
        assert_eq!(
            verify_chain(LINKS, &stripped),
            Err(ChainBreak::Altered { seq: 4 })
        );
    }

    #[test]
    fn links_are_keyed_so_an_edit_cannot_be_sealed_again_without_the_key() {
        let rows = chain(4);
        // Whoever can write the store but has not the key reseals an edited row and every row
        // after it, unkeyed or with another key: the chain no longer verifies.
        for forger in [Links::Unkeyed, Links::Keyed(b"a guess")] {
            let mut forged = rows.clone();
            forged[1].entry.result = "denied".into();
            let mut head = ChainHead {
                seq: forged[0].seq,
                hash: forged[0].hash.clone(),
            };
            for row in forged.iter_mut().skip(1) {
                *row = seal(forger, &head, &ChainHead::default(), row.entry.clone());
                head = ChainHead {
                    seq: row.seq,
                    hash: row.hash.clone(),
                };
            }
            assert_eq!(
                verify_chain(LINKS, &forged),
                Err(ChainBreak::Altered { seq: 2 }),
                "{forger:?}"
            );
        }
        assert_ne!(
            Links::Unkeyed.chain_hash(GENESIS_HASH, 1, &rows[0].entry),
            rows[0].hash
        );
    }

    #[test]
    fn a_signed_head_catches_a_cut_and_a_rewrite_below_it() {
        let rows = chain(6);
        let head_at = |i: usize| ChainHead {
            seq: rows[i].seq,
            hash: rows[i].hash.clone(),
        };
        let signed = head_at(4);
        let verify = |rows: &[AuditRecord], recorded: &ChainHead| {
            let mut verifier = ChainVerifier::new(LINKS).anchored([signed.clone()]);
            rows.iter().try_for_each(|r| verifier.push(r))?;
            verifier.finish(recorded)
        };
        assert_eq!(verify(&rows, &head_at(5)), Ok(head_at(5)));
        // The last rows deleted and the recorded head moved back: every link is sound, but the
        // chain no longer reaches the head signed at row 5.
        assert_eq!(
            verify(&rows[..3], &head_at(2)),
            Err(ChainBreak::CutBeforeSignedHead { last: 3, signed: 5 })
        );
        // Cut at the signed head itself: still sound.
        assert_eq!(verify(&rows[..5], &head_at(4)), Ok(head_at(4)));
        // Cut, then new rows sealed after the cut (with the key): the row at 5 is not the one
        // signed.
        let mut regrown = rows[..3].to_vec();
        for i in 0..3 {
            let prev = regrown.last().unwrap();
            let head = ChainHead {
                seq: prev.seq,
                hash: prev.hash.clone(),
            };
            regrown.push(seal(LINKS, &head, &ChainHead::default(), entry(100 + i)));
        }
        let top = ChainHead {
            seq: 6,
            hash: regrown[5].hash.clone(),
        };
        assert_eq!(
            verify(&regrown, &top),
            Err(ChainBreak::Rewritten { seq: 5 })
        );
    }

    #[test]
    fn a_forgotten_name_holds_the_reference_and_is_forgotten_once() {
        let name = forgotten(b"key", "acme", "u1");
        assert_eq!(name, format!("ref/{}", subject_ref(b"key", "acme", "u1")));
        assert_eq!(forgotten(b"key", "acme", &name), name);
        assert_eq!(
            subject_ref(b"key", "acme", &name),
            subject_ref(b"key", "acme", "u1")
        );
        assert_ne!(forgotten(b"key", "acme", "u2"), name);
    }

    #[test]
    fn subject_refs_depend_on_key_tenant_and_subject() {
        let r = subject_ref(b"key", "acme", "u1");
        assert_eq!(r.len(), 64);
        assert_eq!(r, subject_ref(b"key", "acme", "u1"));
        assert_ne!(r, subject_ref(b"other", "acme", "u1"));
        assert_ne!(r, subject_ref(b"key", "acme", "u2"));
        // The separator keeps ("ac", "me/u1") apart from ("acme", "u1") only if it cannot occur in
        // a tenant; tenants are validated names, but pin the current behaviour.
        assert_ne!(subject_ref(b"key", "acm", "eu1"), r);
        assert!(!r.contains("u1"));
    }

    #[test]
    fn a_sound_chain_verifies_to_its_head() {
        let rows = chain(5);
        assert_eq!(
            verify_chain(LINKS, &rows),
            Ok(ChainHead {
                seq: 5,
                hash: rows[4].hash.clone()
            })
        );
        assert_eq!(rows[0].prev_hash, GENESIS_HASH);
        assert_eq!(verify_chain(LINKS, &[]), Ok(ChainHead::default()));
    }

    #[test]
    fn tampering_names_the_first_bad_row() {
        let rows = chain(6);

        let mut edited = rows.clone();
        edited[2].entry.actor = "mallory".into();
        assert_eq!(
            verify_chain(LINKS, &edited),
            Err(ChainBreak::Altered { seq: 3 })
        );

        let mut deleted = rows.clone();
        deleted.remove(3);
        assert_eq!(
            verify_chain(LINKS, &deleted),
            Err(ChainBreak::Missing {
                expected: 4,
                found: 5
            })
        );

        let mut swapped = rows.clone();
        swapped.swap(1, 2);
        (swapped[1].seq, swapped[2].seq) = (2, 3);
        assert_eq!(verify_chain(LINKS, &swapped).map_err(|e| e.seq()), Err(2));

        let mut rehashed = rows.clone();
        rehashed[3].entry.result = "denied".into();
        rehashed[3].hash = LINKS.chain_hash(&rehashed[3].prev_hash, 4, &rehashed[3].entry);
        assert_eq!(
            verify_chain(LINKS, &rehashed),
            Err(ChainBreak::Unlinked { seq: 5 })
        );

        let recorded = ChainHead {
            seq: 6,
            hash: rows[5].hash.clone(),
        };
        let mut verifier = ChainVerifier::new(LINKS);
        rows[..5].iter().try_for_each(|r| verifier.push(r)).unwrap();
        assert_eq!(
            verifier.finish(&recorded),
            Err(ChainBreak::Truncated { last: 5, head: 6 })
        );
    }

    #[test]
    fn canonical_encoding_separates_fields_and_absence() {
        let a = AuditEntry {
            target_ref: None,
            ..entry(1)
        };
        let b = AuditEntry {
            target_ref: Some(String::new()),
            ..entry(1)
        };
        assert_ne!(canonical(1, &a), canonical(1, &b));
        let c = AuditEntry {
            actor: "ab".into(),
            action: "c".into(),
            ..entry(1)
        };
        let d = AuditEntry {
            actor: "a".into(),
            action: "bc".into(),
            ..entry(1)
        };
        assert_ne!(canonical(1, &c), canonical(1, &d));
        assert_ne!(canonical(1, &a), canonical(2, &a));
    }

    proptest! {
        #[test]
        fn any_single_edit_is_caught_at_its_row(n in 1u32..20, pick in any::<prop::sample::Index>(), actor in "[a-z]{1,8}") {
            let mut rows = chain(n);
            let i = pick.index(rows.len());
            prop_assume!(rows[i].entry.actor != actor);
            rows[i].entry.actor = actor;
            prop_assert_eq!(verify_chain(LINKS, &rows).map_err(|e| e.seq()), Err(rows[i].seq));
        }
    }
}
