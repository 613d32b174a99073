//! The state store's the audit chain: appending, reading, keying, signed heads.

use super::*;

/// The version of a chain whose links are keyed (`audit_chain.chain_version`; 1: plain SHA-256).
pub(crate) const KEYED_CHAIN: i32 = 2;

/// A head of the audit chain (or of a tenant's), signed with the certificates' key when it was
/// the head, and kept apart from the chain (and, printed by `lethe audit head`, anywhere else):
/// a chain that no longer holds it was cut or rewritten.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct SignedHead {
    /// The tenant whose chain it is; `None`: the whole chain.
    pub tenant: Option<String>,
    pub seq: i64,
    pub hash: String,
    pub signed_at: DateTime<Utc>,
    pub signature: HeadSignature,
}

impl SignedHead {
    /// The position it names, as a verifier's anchor.
    pub fn anchor(&self) -> ChainHead {
        ChainHead {
            seq: self.seq,
            hash: self.hash.clone(),
        }
    }
}

/// An Ed25519 signature over a head's canonical JSON (`tenant`, `seq`, `hash`, `signed_at`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct HeadSignature {
    pub algorithm: String,
    pub public_key: String,
    pub value: String,
}

impl HeadSignature {
    pub fn ed25519(public_key: String, value: String) -> HeadSignature {
        HeadSignature {
            algorithm: "Ed25519".into(),
            public_key,
            value,
        }
    }
}

/// Whether the audit chain is intact, reading it page by page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum ChainReport {
    Intact {
        ok: bool,
        head: ChainHead,
    },
    Broken {
        ok: bool,
        first_bad_seq: i64,
        problem: ChainBreak,
        message: String,
    },
}

/// Verifies the whole chain (`tenant` unset) or one tenant's chain, up to its recorded head,
/// with `key` (the audit key): it must be keyed with that key, and still hold every head signed
/// and kept for it (each of them `genuine`, when that can be told: signed with the certificates'
/// key) and `saved` (a head saved elsewhere, or carried by a certificate) if one is given.
pub async fn verify_audit(
    store: &dyn Store,
    key: &[u8],
    genuine: Option<&(dyn Fn(&SignedHead) -> bool + Sync)>,
    tenant: Option<&str>,
    saved: Option<&ChainHead>,
) -> Result<ChainReport, StoreError> {
    const PAGE: i64 = 1000;
    let broken = |problem: ChainBreak| ChainReport::Broken {
        ok: false,
        first_bad_seq: problem.seq(),
        message: problem.to_string(),
        problem,
    };
    let (keyed, check) = store.audit_keying().await?;
    if !keyed {
        return Ok(broken(ChainBreak::Unkeyed));
    }
    if check.is_some_and(|c| c != lethe_policy::audit::key_check(key)) {
        return Ok(broken(ChainBreak::WrongKey));
    }
    // Read before the head: a head signed meanwhile is never past the head read after it.
    let kept = store.signed_heads(tenant).await?;
    if let Some(genuine) = genuine
        && let Some(forged) = kept.iter().find(|h| !genuine(h))
    {
        return Ok(broken(ChainBreak::ForgedHead { seq: forged.seq }));
    }
    let anchors: Vec<ChainHead> = kept
        .iter()
        .map(SignedHead::anchor)
        .chain(saved.cloned())
        .collect();
    let recorded = store.audit_head(tenant).await?;
    let links = Links::Keyed(key);
    let mut whole = ChainVerifier::new(links).anchored(anchors.clone());
    let mut own = tenant.map(|t| TenantChainVerifier::new(links, t).anchored(anchors));
    // Events appended while it reads lie past the recorded head: not this verification's.
    let recorded_at = |r: &AuditRecord| match (tenant, &r.tenant_chain) {
        (Some(_), Some(link)) => link.seq <= recorded.seq,
        (Some(_), None) => false,
        (None, _) => r.seq <= recorded.seq,
    };
    let mut after = 0;
    let outcome = loop {
        let page = store.audit_page(after, PAGE, tenant).await?;
        let Some(last) = page.last() else {
            break match own {
                Some(own) => own.finish(&recorded),
                None => whole.finish(&recorded),
            };
        };
        after = last.seq;
        let within: Vec<&AuditRecord> = page.iter().filter(|r| recorded_at(r)).collect();
        let checked = within.iter().try_for_each(|r| match own.as_mut() {
            Some(own) => own.push(r),
            None => whole.push(r),
        });
        if let Err(e) = checked {
            break Err(e);
        }
        if within.len() < page.len() {
            break match own {
                Some(own) => own.finish(&recorded),
                None => whole.finish(&recorded),
            };
        }
    };
    Ok(match outcome {
        Ok(head) => ChainReport::Intact { ok: true, head },
        Err(problem) => broken(problem),
    })
}

#[async_trait]
pub trait AuditLog: Send + Sync {
    /// Appends one event to the chain (for events that change nothing else).
    async fn append_audit(&self, entry: AuditEntry) -> Result<AuditRecord, StoreError>;

    /// Rows with `seq > after`, in order, at most `limit`; only one tenant's when `tenant` is set.
    async fn audit_page(
        &self,
        after: i64,
        limit: i64,
        tenant: Option<&str>,
    ) -> Result<Vec<AuditRecord>, StoreError>;

    /// A tenant's events naming any of `refs` (a request and its purge jobs), in order, at most
    /// `limit`.
    async fn audit_of(
        &self,
        tenant: &str,
        refs: &[String],
        limit: i64,
    ) -> Result<Vec<AuditRecord>, StoreError>;

    /// The head the store recorded with the last append: of the whole chain, or of one tenant's.
    async fn audit_head(&self, tenant: Option<&str>) -> Result<ChainHead, StoreError>;

    /// Seals a chain written before links were keyed again with the audit key, once: it is
    /// verified as it was written first (a broken one is left as it is: `Corrupt`), then every
    /// link and head is rewritten and an event naming the old head (`audit.chain_keyed`) is
    /// appended. Answers the old head when it keyed the chain.
    async fn key_audit_chain(&self, at: DateTime<Utc>) -> Result<Option<ChainHead>, StoreError>;

    /// Whether the chain's links are keyed, and the check of the key they are made with (see
    /// `lethe_policy::audit::key_check`), once the first keyed link was.
    async fn audit_keying(&self) -> Result<(bool, Option<String>), StoreError>;

    /// The head of every tenant's chain.
    async fn tenant_heads(&self) -> Result<Vec<(String, ChainHead)>, StoreError>;

    /// The position of the last head signed and kept, per chain (`""`: the whole chain).
    async fn last_signed_heads(&self) -> Result<BTreeMap<String, i64>, StoreError>;

    /// Keeps a signed head (once per chain and position).
    async fn keep_signed_head(&self, head: &SignedHead) -> Result<(), StoreError>;

    /// The signed heads of the whole chain (`None`) or of one tenant's, in order.
    async fn signed_heads(&self, tenant: Option<&str>) -> Result<Vec<SignedHead>, StoreError>;
}
