//! Erasure certificates: what was erased, where, when, what is left, and when the last backup
//! holding it expires; signed with Ed25519 so that a third party can check it with the public key
//! alone.
//!
//! The document is canonical JSON (sorted keys, no spaces): `{"certificate": {...}, "signature":
//! {...}}`, the signature covering the canonical bytes of `certificate`. Verification also
//! requires the file to be exactly canonical, so that no byte of it can change unnoticed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use aws_lc_rs::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use chrono::{DateTime, Utc};
use lethe_policy::MaxAge;
use lethe_policy::audit::{ChainHead, subject_ref};
use serde_json::{Value, json};

use crate::config::Config;
use crate::data::forward::Route;
use crate::purge::Physical;
use crate::state::{
    Decision, Derivative, ErasureRecord, GovernedFlip, HeadSignature, PurgeJob, SignedHead, Store,
    StoreError,
};

pub struct Signer {
    key: Ed25519KeyPair,
}

impl Signer {
    /// From a 32-byte Ed25519 seed.
    pub fn from_seed(seed: &[u8]) -> Result<Signer, String> {
        let key = Ed25519KeyPair::from_seed_unchecked(seed)
            .map_err(|e| format!("not an Ed25519 seed: {e}"))?;
        Ok(Signer { key })
    }

    pub fn public_key_hex(&self) -> String {
        hex::encode(self.key.public_key().as_ref())
    }

    fn sign(&self, message: &[u8]) -> String {
        hex::encode(self.key.sign(message).as_ref())
    }

    /// `head`, of the whole chain (`tenant` unset) or of a tenant's, signed at `at` (to the
    /// microsecond, as the state store keeps it).
    pub fn sign_head(
        &self,
        tenant: Option<&str>,
        head: &ChainHead,
        at: DateTime<Utc>,
    ) -> SignedHead {
        use chrono::SubsecRound as _;
        let signed_at = at.trunc_subsecs(6);
        let value = self.sign(&head_message(tenant, head, signed_at));
        SignedHead {
            tenant: tenant.map(str::to_owned),
            seq: head.seq,
            hash: head.hash.clone(),
            signed_at,
            signature: HeadSignature::ed25519(self.public_key_hex(), value),
        }
    }
}

/// What a head's signature covers: its canonical JSON, typed, so that no signed head passes for
/// a certificate signed with the same key.
fn head_message(tenant: Option<&str>, head: &ChainHead, signed_at: DateTime<Utc>) -> Vec<u8> {
    canonical(&json!({
        "type": "lethe.audit_head",
        "tenant": tenant,
        "seq": head.seq,
        "hash": head.hash,
        "signed_at": signed_at,
    }))
}

/// Checks a signed head against the issuer's public key (hex).
pub fn verify_head(head: &SignedHead, public_key_hex: &str) -> Result<(), Invalid> {
    if head.signature.algorithm != "Ed25519" {
        return Err(Invalid::Malformed);
    }
    if !head
        .signature
        .public_key
        .eq_ignore_ascii_case(public_key_hex.trim())
    {
        return Err(Invalid::OtherKey);
    }
    let key = hex::decode(public_key_hex.trim()).map_err(|_| Invalid::Malformed)?;
    let value = hex::decode(&head.signature.value).map_err(|_| Invalid::Malformed)?;
    UnparsedPublicKey::new(&ED25519, key)
        .verify(
            &head_message(head.tenant.as_deref(), &head.anchor(), head.signed_at),
            &value,
        )
        .map_err(|_| Invalid::BadSignature)
}

/// Issues each completed erasure's certificate once and keeps it: every later download is the
/// same signed bytes, whatever has happened since (restarts, new audit events, a new key).
pub struct Certifier {
    signer: Signer,
    /// How long each target's backups are kept.
    backups: BTreeMap<String, MaxAge>,
    audit_key: Arc<[u8]>,
}

impl Certifier {
    pub fn new(signer: Signer, backups: BTreeMap<String, MaxAge>, audit_key: Arc<[u8]>) -> Self {
        Certifier {
            signer,
            backups,
            audit_key,
        }
    }

    /// The backup retention of every target of a configuration: the configured ones, and for a
    /// provider route its retention window (the provider's copies last that long).
    pub fn backups_of(config: &Config, routes: &[Route]) -> BTreeMap<String, MaxAge> {
        let mut backups: BTreeMap<_, _> = config
            .erasure
            .backups
            .iter()
            .map(|b| (b.target.clone(), b.retention))
            .collect();
        for route in routes {
            if let Some(window) = route.store.copies_kept_for() {
                let target = crate::config::route_target(route.store.kind(), &route.name);
                backups.entry(target).or_insert(window);
            }
        }
        backups
    }

    pub fn public_key_hex(&self) -> String {
        self.signer.public_key_hex()
    }

    /// Whether a head was signed with this deployment's key.
    pub fn genuine(&self, head: &SignedHead) -> bool {
        verify_head(head, &self.signer.public_key_hex()).is_ok()
    }

    /// Signs and keeps the head of the chain and of every tenant's that moved since its last
    /// signed head.
    pub async fn sign_heads_now(&self, store: &dyn Store) -> Result<(), StoreError> {
        let now = crate::now();
        let last = store.last_signed_heads().await?;
        let heads = std::iter::once((None, store.audit_head(None).await?)).chain(
            store
                .tenant_heads()
                .await?
                .into_iter()
                .map(|(tenant, head)| (Some(tenant), head)),
        );
        for (tenant, head) in heads {
            let moved = last
                .get(tenant.as_deref().unwrap_or_default())
                .is_none_or(|&seq| seq < head.seq);
            if moved {
                store
                    .keep_signed_head(&self.signer.sign_head(tenant.as_deref(), &head, now))
                    .await?;
            }
        }
        Ok(())
    }

    /// The certificate of a completed request: the one kept, or, the first time, one issued now
    /// from the request's jobs and the audit chain's head, and kept. Two replicas issuing at once
    /// both answer the one that was kept first.
    pub async fn certificate(
        &self,
        store: &dyn Store,
        record: &ErasureRecord,
    ) -> Result<String, StoreError> {
        if let Some(kept) = store.certificate(&record.id).await? {
            return Ok(kept);
        }
        let jobs = store.purge_jobs(&record.id).await?;
        let derivatives = store.derivatives(&record.id).await?;
        // The heads at issue are signed and kept: the chain must hold them from now on.
        let now = crate::now();
        let chain_head = store.audit_head(None).await?;
        let tenant_head = store.audit_head(Some(&record.tenant)).await?;
        store
            .keep_signed_head(&self.signer.sign_head(None, &chain_head, now))
            .await?;
        store
            .keep_signed_head(
                &self
                    .signer
                    .sign_head(Some(&record.tenant), &tenant_head, now),
            )
            .await?;
        let flips = store.governed_flips(&record.id).await?;
        let evidence = Evidence {
            record,
            jobs: &jobs,
            derivatives: &derivatives,
            flips: &flips,
            chain_head: &chain_head,
            tenant_head: &tenant_head,
            backups: &self.backups,
            audit_key: &self.audit_key,
            issued_at: now,
        };
        let document = String::from_utf8_lossy(&issue(&evidence, &self.signer)).into_owned();
        store.keep_certificate(&record.id, &document).await
    }
}

/// What the certificate needs besides the request.
pub struct Evidence<'a> {
    pub record: &'a ErasureRecord,
    pub jobs: &'a [PurgeJob],
    /// What the closure of the subject reached, and what became of it.
    pub derivatives: &'a [Derivative],
    /// When the flip held in each governed database.
    pub flips: &'a [GovernedFlip],
    pub chain_head: &'a ChainHead,
    /// The head of the request's tenant's chain.
    pub tenant_head: &'a ChainHead,
    /// How long each target's backups are kept.
    pub backups: &'a BTreeMap<String, MaxAge>,
    pub audit_key: &'a [u8],
    pub issued_at: DateTime<Utc>,
}

/// The signed certificate of a completed erasure, as canonical bytes.
pub fn issue(evidence: &Evidence<'_>, signer: &Signer) -> Vec<u8> {
    let r = evidence.record;
    let completed = r.completed_at.unwrap_or(evidence.issued_at);
    let mut copies = Copies::after(completed);
    let stores: Vec<Value> = evidence
        .jobs
        .iter()
        .map(|job| copies.store(job, evidence.backups.get(&job.target)))
        .collect();
    let Copies {
        final_backup_expiry,
        final_copy_expiry,
        mut exceptions,
        ..
    } = copies;
    let purged: BTreeSet<&str> = evidence
        .jobs
        .iter()
        .map(|j| {
            j.target
                .split_once(':')
                .map_or(j.target.as_str(), |(_, s)| s)
        })
        .collect();
    let derivatives = derivatives_by_store(evidence.derivatives, &purged, &mut exceptions);
    let ms =
        |from: DateTime<Utc>, to: Option<DateTime<Utc>>| to.map(|t| (t - from).num_milliseconds());
    let certificate = json!({
        "version": 1,
        "request_id": r.id,
        "tenant": r.tenant,
        "ticket": r.ticket,
        "subject_ref": subject_ref(evidence.audit_key, &r.tenant, &r.subject),
        "alias_refs": r.aliases.iter().map(|a| subject_ref(evidence.audit_key, &r.tenant, a)).collect::<Vec<_>>(),
        "state": r.state,
        "requested_by": r.requested_by,
        "approved_by": r.approvals,
        "requested_at": r.requested_at,
        "suppressed_at": r.suppressed_at,
        "completed_at": r.completed_at,
        // To the last database the flip held in: the subject was readable somewhere until then.
        "online_latency_ms": ms(r.requested_at, r.suppressed_at),
        "governed": evidence.flips.iter().map(|f| json!({
            "database": f.database,
            "flip_held_at": f.applied_at,
            "online_latency_ms": ms(r.requested_at, f.applied_at),
        })).collect::<Vec<_>>(),
        "completion_latency_ms": ms(r.requested_at, r.completed_at),
        "stores": stores,
        "derivatives": derivatives,
        "exceptions": exceptions,
        "final_backup_expiry": final_backup_expiry,
        "final_copy_expiry": final_copy_expiry.zip(final_backup_expiry).map(|(c, b)| c.max(b)),
        "audit_chain_head": evidence.chain_head,
        "audit_tenant_head": evidence.tenant_head,
        "issued_at": evidence.issued_at,
    });
    let signed = canonical(&certificate);
    let document = json!({
        "certificate": certificate,
        "signature": { "algorithm": "Ed25519", "public_key": signer.public_key_hex(), "value": signer.sign(&signed) },
    });
    canonical(&document)
}

/// What the certificate says of the copies the stores keep, gathered job by job.
struct Copies {
    completed: DateTime<Utc>,
    /// The latest date any backup is gone by; `None` once one has no date.
    final_backup_expiry: Option<DateTime<Utc>>,
    /// The latest date any copy a store names is gone by; `None` once one has no date.
    final_copy_expiry: Option<DateTime<Utc>>,
    exceptions: Vec<String>,
}

impl Copies {
    fn after(completed: DateTime<Utc>) -> Self {
        Self {
            completed,
            final_backup_expiry: Some(completed),
            final_copy_expiry: Some(completed),
            exceptions: Vec::new(),
        }
    }

    /// The certificate's entry for one purge job, its backups kept for `retention`.
    fn store(&mut self, job: &PurgeJob, retention: Option<&MaxAge>) -> Value {
        let expires = retention.and_then(|age| self.completed.checked_add_signed(age.as_delta()));
        match expires {
            Some(at) => self.final_backup_expiry = self.final_backup_expiry.map(|f| f.max(at)),
            None => {
                self.final_backup_expiry = None;
                self.exceptions.push(format!(
                    "{}: no backup retention is configured; backups may hold the subject indefinitely",
                    job.target
                ));
            }
        }
        if job.state != "done" {
            self.exceptions
                .push(format!("{}: purge {}", job.target, job.state));
        }
        let result = job.result.clone().unwrap_or(Value::Null);
        if let Some(n) = result.get("uncounted_attempts").and_then(Value::as_u64) {
            self.exceptions.push(format!(
                "{}: {n} purge attempts ended before they could count; what they deleted is in neither before nor deleted",
                job.target
            ));
        }
        let physical: Physical = result
            .get("physical")
            .and_then(|p| serde_json::from_value(p.clone()).ok())
            .unwrap_or_default();
        for copy in &physical.remaining {
            match (copy.until, &copy.unknown) {
                (Some(at), _) => self.final_copy_expiry = self.final_copy_expiry.map(|f| f.max(at)),
                (None, reason) => {
                    self.final_copy_expiry = None;
                    self.exceptions.push(format!(
                        "{}: {} still holds {}, with no date: {}",
                        job.target,
                        copy.place,
                        copy.holds,
                        reason.as_deref().unwrap_or("unknown")
                    ));
                }
            }
        }
        json!({
            "target": job.target,
            "state": job.state,
            "attempts": job.attempts,
            "before": result.get("before"),
            "deleted": result.get("deleted"),
            "remaining": result.get("remaining"),
            "derivatives": result.get("derivatives"),
            "physical": result.get("physical"),
            "backup_retention": retention.map(ToString::to_string),
            "backup_expires_at": expires,
        })
    }
}

/// What the closure reached in each store: found, the subject's own (purged with it), another
/// subject's erased (verified gone) or released, what only guards (nothing was held), and what
/// remains in a store no purge of the request (`purged`) reaches: an exception each.
fn derivatives_by_store(
    derivatives: &[Derivative],
    purged: &BTreeSet<&str>,
    exceptions: &mut Vec<String>,
) -> Value {
    let mut stores: BTreeMap<&str, [u64; 6]> = BTreeMap::new();
    for d in derivatives {
        let store = d.item.store.as_str();
        let counts = stores.entry(store).or_default();
        counts[0] += 1;
        // Another subject's only guards when lineage keeps no live item of it; the subject's
        // own may be live (hidden by its stamp) where no purge reaches.
        let held_nothing = d.decision == Decision::Guard && !d.own;
        let left = match d.decision {
            _ if !purged.contains(store) && !held_nothing => {
                counts[5] += 1;
                Some("may remain: no purge of this request reaches its store")
            }
            Decision::Erase if d.erased_at.is_some() && d.own => {
                counts[1] += 1;
                None
            }
            Decision::Erase if d.erased_at.is_some() => {
                counts[2] += 1;
                None
            }
            Decision::Release => {
                counts[3] += 1;
                None
            }
            Decision::Guard => {
                counts[4] += 1;
                None
            }
            Decision::Erase => Some("is not verified gone"),
            Decision::Undecided => Some("is undecided"),
        };
        if let Some(left) = left {
            exceptions.push(format!("{store}: derivative {} {left}", d.reference));
        }
    }
    Value::Array(
        stores
            .into_iter()
            .map(
                |(store, [found, own, erased, released, guarded, unreached])| {
                    json!({"store": store, "found": found, "own_erased": own, "erased": erased,
                       "released": released, "guarded": guarded, "unreached": unreached})
                },
            )
            .collect(),
    )
}

fn canonical(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("not a certificate document")]
    Malformed,
    #[error("the document is not in canonical form: it was edited")]
    NotCanonical,
    #[error("the certificate was signed with another key")]
    OtherKey,
    #[error("the signature does not match the certificate: it was edited")]
    BadSignature,
}

/// Checks a certificate file against the issuer's public key (hex); on success, the certificate.
pub fn verify(document: &[u8], public_key_hex: &str) -> Result<Value, Invalid> {
    let parsed: Value = serde_json::from_slice(document).map_err(|_| Invalid::Malformed)?;
    if canonical(&parsed) != document {
        return Err(Invalid::NotCanonical);
    }
    let certificate = parsed.get("certificate").ok_or(Invalid::Malformed)?;
    let signature = parsed.get("signature").ok_or(Invalid::Malformed)?;
    let text = |k: &str| {
        signature
            .get(k)
            .and_then(Value::as_str)
            .ok_or(Invalid::Malformed)
    };
    if text("algorithm")? != "Ed25519" {
        return Err(Invalid::Malformed);
    }
    if !text("public_key")?.eq_ignore_ascii_case(public_key_hex.trim()) {
        return Err(Invalid::OtherKey);
    }
    let key = hex::decode(public_key_hex.trim()).map_err(|_| Invalid::Malformed)?;
    let value = hex::decode(text("value")?).map_err(|_| Invalid::Malformed)?;
    UnparsedPublicKey::new(&ED25519, key)
        .verify(&canonical(certificate), &value)
        .map_err(|_| Invalid::BadSignature)?;
    Ok(certificate.clone())
}

/// The certificate as a page for people (`erasure/templates/certificate.html`).
#[derive(askama::Template)]
#[template(path = "certificate.html")]
struct CertificatePage {
    id: String,
    facts: Vec<(String, String)>,
    stores: Vec<Vec<String>>,
    derivatives: Vec<Vec<String>>,
    copies: Vec<Vec<String>>,
    exceptions: Vec<String>,
    head_seq: String,
    head_hash: String,
    key: String,
}

/// A value of the document as the page shows it: a string as is, a missing one as a dash.
fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "—".to_owned(),
        other => other.to_string(),
    }
}

/// The items of a JSON array, none when it is not one.
fn listed(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or_default()
}

/// The certificate as a page for people; the JSON document stays the signed original.
pub fn render_html(document: &[u8]) -> String {
    use askama::Template;
    let parsed: Value = serde_json::from_slice(document).unwrap_or(Value::Null);
    let c = &parsed["certificate"];
    let facts = [
        "request_id",
        "tenant",
        "ticket",
        "subject_ref",
        "state",
        "requested_by",
        "approved_by",
        "requested_at",
        "suppressed_at",
        "completed_at",
        "online_latency_ms",
        "completion_latency_ms",
        "final_backup_expiry",
        "final_copy_expiry",
        "issued_at",
    ]
    .iter()
    .map(|key| (key.replace('_', " "), shown(&c[*key])))
    .collect();
    let (mut stores, mut copies) = (Vec::new(), Vec::new());
    for s in listed(&c["stores"]) {
        let joined = |key: &str| {
            listed(&s["physical"][key])
                .iter()
                .map(shown)
                .collect::<Vec<_>>()
                .join("; ")
        };
        stores.push(vec![
            shown(&s["target"]),
            shown(&s["before"]),
            shown(&s["deleted"]),
            shown(&s["remaining"]),
            joined("done"),
            joined("verified"),
            shown(&s["backup_retention"]),
            shown(&s["backup_expires_at"]),
        ]);
        for copy in listed(&s["physical"]["remaining"]) {
            let until = match &copy["until"] {
                Value::Null => format!("unknown: {}", shown(&copy["unknown"])),
                at => shown(at),
            };
            copies.push(vec![
                shown(&s["target"]),
                shown(&copy["place"]),
                shown(&copy["holds"]),
                shown(&copy["why"]),
                until,
            ]);
        }
    }
    let derivatives = listed(&c["derivatives"])
        .iter()
        .map(|d| {
            [
                "store",
                "found",
                "own_erased",
                "erased",
                "released",
                "guarded",
                "unreached",
            ]
            .iter()
            .map(|k| shown(&d[*k]))
            .collect()
        })
        .collect();
    CertificatePage {
        id: shown(&c["request_id"]),
        facts,
        stores,
        derivatives,
        copies,
        exceptions: listed(&c["exceptions"]).iter().map(shown).collect(),
        head_seq: shown(&c["audit_chain_head"]["seq"]),
        head_hash: shown(&c["audit_chain_head"]["hash"]),
        key: shown(&parsed["signature"]["public_key"]),
    }
    .render()
    .unwrap_or_default()
}

#[cfg(test)]
mod tests;
