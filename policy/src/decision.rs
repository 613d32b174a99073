//! The two decisions every request goes through: may this item be written, may this item be read.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::consent::{Action, ConsentGrant, coverage_end};
use crate::derivation::ItemRef;
use crate::retention::{Layer, RetentionBounds, RetentionPolicy, retain_until};
use crate::subject::SubjectState;

/// What Lethe knows about one subject: state, epoch and grants.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SubjectPolicy {
    pub state: SubjectState,
    pub grants: Vec<ConsentGrant>,
}

/// Read access to the policy a decision needs. The data plane answers it from its cache; tests
/// from a [`PolicySnapshot`].
pub trait PolicyView {
    /// `None` for a subject Lethe has never heard of: it is active, in epoch 0, with no consent.
    fn subject(&self, tenant: &str, subject: &str) -> Option<&SubjectPolicy>;
    /// `None` when the tenant has no retention rules (then nothing may be written).
    fn retention(&self, tenant: &str) -> Option<&RetentionPolicy>;
    /// Whether `item` of `tenant` is hidden as part of an erasure's closure (derived from a
    /// subject under erasure, and not released).
    fn derivative_suppressed(&self, tenant: &str, item: &ItemRef<'_>) -> bool {
        let _ = (tenant, item);
        false
    }
}

/// A plain, owned policy: tenant -> subject -> policy, tenant -> retention rules, and the items
/// hidden by erasures' closures.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicySnapshot {
    pub subjects: BTreeMap<String, BTreeMap<String, SubjectPolicy>>,
    pub retention: BTreeMap<String, RetentionPolicy>,
    /// (tenant, store, collection, id).
    pub hidden: BTreeSet<(String, String, String, String)>,
}

impl PolicyView for PolicySnapshot {
    fn subject(&self, tenant: &str, subject: &str) -> Option<&SubjectPolicy> {
        self.subjects.get(tenant)?.get(subject)
    }
    fn retention(&self, tenant: &str) -> Option<&RetentionPolicy> {
        self.retention.get(tenant)
    }
    fn derivative_suppressed(&self, tenant: &str, item: &ItemRef<'_>) -> bool {
        let key = (
            tenant.to_owned(),
            item.store.to_owned(),
            item.collection.to_owned(),
            item.id.to_owned(),
        );
        self.hidden.contains(&key)
    }
}

/// The metadata Lethe writes into every stored item. The stamp in the store is the source of
/// truth for reads and for purges.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    pub tenant: String,
    pub subject: String,
    pub purpose: String,
    pub category: String,
    pub layer: Layer,
    pub expires_at: DateTime<Utc>,
    pub epoch: i64,
}

/// The facts of one item a client wants to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteFacts<'a> {
    pub tenant: &'a str,
    pub subject: &'a str,
    pub purpose: &'a str,
    pub category: &'a str,
    pub layer: Layer,
    /// `store` for records, `embed` for vectors computed from them, and so on.
    pub action: Action,
    /// The epoch the write was authorised under, when it was authorised earlier than now.
    pub authorised_epoch: Option<i64>,
    /// A client may ask for an earlier expiry than policy gives, never a later one.
    pub requested_expires_at: Option<DateTime<Utc>>,
}

/// Who is reading, from which store, and for what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadContext<'a> {
    pub tenant: &'a str,
    /// The store read from (a route's name): where the items it decides are kept.
    pub store: &'a str,
    /// Set when the caller's token is bound to one subject.
    pub bound_subject: Option<&'a str>,
    /// Set when the caller declared a purpose; items kept for another purpose are not served.
    pub purpose: Option<&'a str>,
}

/// Why a decision refused. Each has a stable code that reaches the client; none carries content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Refusal {
    #[error("the item is outside the caller's tenant, subject or purpose")]
    ScopeViolation,
    #[error("the subject is under erasure")]
    SubjectSuppressed,
    #[error("the write was authorised under an earlier deletion epoch")]
    StaleEpoch,
    #[error("no active consent covers this use")]
    ConsentRequired,
    #[error("no retention rule covers this purpose and category")]
    NoRetentionRule,
    #[error("the item's retention period has passed")]
    Expired,
    #[error("the item carries no Lethe stamp")]
    UnstampedItem,
    #[error("the id is taken: an add never overwrites a stored item")]
    AlreadyExists,
    #[error("the request derives from data under erasure")]
    DerivedFromErased,
}

impl Refusal {
    pub const ALL: [Refusal; 9] = [
        Refusal::ScopeViolation,
        Refusal::SubjectSuppressed,
        Refusal::StaleEpoch,
        Refusal::ConsentRequired,
        Refusal::NoRetentionRule,
        Refusal::Expired,
        Refusal::UnstampedItem,
        Refusal::AlreadyExists,
        Refusal::DerivedFromErased,
    ];

    pub fn code(self) -> &'static str {
        match self {
            Refusal::ScopeViolation => "scope_violation",
            Refusal::SubjectSuppressed => "subject_suppressed",
            Refusal::StaleEpoch => "stale_epoch",
            Refusal::ConsentRequired => "consent_required",
            Refusal::NoRetentionRule => "no_retention_rule",
            Refusal::Expired => "expired",
            Refusal::UnstampedItem => "unstamped_item",
            Refusal::AlreadyExists => "already_exists",
            Refusal::DerivedFromErased => "derived_from_erased",
        }
    }
}

static UNKNOWN_SUBJECT: SubjectPolicy = SubjectPolicy {
    state: SubjectState {
        status: crate::subject::SubjectStatus::Active,
        epoch: 0,
    },
    grants: Vec::new(),
};

fn subject_policy<'v>(view: &'v impl PolicyView, tenant: &str, subject: &str) -> &'v SubjectPolicy {
    view.subject(tenant, subject).unwrap_or(&UNKNOWN_SUBJECT)
}

/// What a request that sends a subject's data to a model provider may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProviderGrant {
    /// The subject's epoch when the request was decided.
    pub epoch: i64,
    /// Consent covers `provider_retention`: the provider may keep what it is sent.
    pub retention: bool,
    /// Consent covers `train`: the data may be used for fine-tuning.
    pub train: bool,
}

/// May this subject's data (for `purpose`, `category`) be sent to a model provider? Needs an
/// active subject and `send_to_provider` consent; says whether the provider may also keep it and
/// train on it.
pub fn decide_provider(
    view: &impl PolicyView,
    tenant: &str,
    subject: &str,
    purpose: &str,
    category: &str,
    now: DateTime<Utc>,
) -> Result<ProviderGrant, Refusal> {
    let policy = subject_policy(view, tenant, subject);
    if !policy.state.is_active() {
        return Err(Refusal::SubjectSuppressed);
    }
    let covered = |action| coverage_end(&policy.grants, purpose, category, action, now).is_some();
    if !covered(Action::SendToProvider) {
        return Err(Refusal::ConsentRequired);
    }
    Ok(ProviderGrant {
        epoch: policy.state.epoch,
        retention: covered(Action::ProviderRetention),
        train: covered(Action::Train),
    })
}

/// Is a write that was allowed with `stamp` still allowed now that the store has taken it? Not
/// when its subject was suppressed (or erased, or given a new epoch) in the meantime: the writer
/// undoes it, so that nothing lands behind an erasure's purge.
pub fn still_current(view: &impl PolicyView, stamp: &Stamp) -> Result<(), Refusal> {
    let state = subject_policy(view, &stamp.tenant, &stamp.subject).state;
    if !state.is_active() {
        Err(Refusal::SubjectSuppressed)
    } else if state.epoch != stamp.epoch {
        Err(Refusal::StaleEpoch)
    } else {
        Ok(())
    }
}

/// May this item be written? On yes, the stamp to write with it.
pub fn decide_write(
    view: &impl PolicyView,
    facts: &WriteFacts<'_>,
    now: DateTime<Utc>,
) -> Result<Stamp, Refusal> {
    let policy = subject_policy(view, facts.tenant, facts.subject);
    if !policy.state.is_active() {
        return Err(Refusal::SubjectSuppressed);
    }
    if facts
        .authorised_epoch
        .is_some_and(|e| e != policy.state.epoch)
    {
        return Err(Refusal::StaleEpoch);
    }
    let consent_end = coverage_end(
        &policy.grants,
        facts.purpose,
        facts.category,
        facts.action,
        now,
    )
    .ok_or(Refusal::ConsentRequired)?;
    let retention = view
        .retention(facts.tenant)
        .ok_or(Refusal::NoRetentionRule)?;
    let rule = retention
        .rule_for(facts.purpose, facts.category, facts.layer)
        .ok_or(Refusal::NoRetentionRule)?;
    let expires_at = retain_until(&RetentionBounds {
        created_at: now,
        max_age: rule.max_age,
        consent_end,
        purpose_end: retention.purpose_end(facts.purpose),
        legal_end: rule.legal_end,
        requested: facts.requested_expires_at,
    });
    if expires_at <= now {
        return Err(Refusal::Expired);
    }
    Ok(Stamp {
        tenant: facts.tenant.to_owned(),
        subject: facts.subject.to_owned(),
        purpose: facts.purpose.to_owned(),
        category: facts.category.to_owned(),
        layer: facts.layer,
        expires_at,
        epoch: policy.state.epoch,
    })
}

/// What the store holds under an id a write names, read just before the write. The stamp in
/// the store, not lineage, decides who owns an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held<'a> {
    /// Nothing: the id is free.
    Nothing,
    /// An item without a whole stamp, written around Lethe: nobody can show it is theirs.
    Unstamped,
    Stamped(&'a Stamp),
}

impl<'a> Held<'a> {
    /// From a read of the store: nothing found, or an item with its stamp if it has a whole one.
    pub fn of(found: Option<Option<&'a Stamp>>) -> Held<'a> {
        match found {
            None => Held::Nothing,
            Some(None) => Held::Unstamped,
            Some(Some(stamp)) => Held::Stamped(stamp),
        }
    }
}

/// How a write treats an id the store already holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overwrite {
    /// Only a free id may be written (Chroma `add`, a new thread).
    Never,
    /// A free id is created, a held one replaced (`upsert`, a store item `PUT`).
    Allowed,
    /// Only a held id is written; a free one is left alone (`update`).
    Only,
}

/// May this item be written over what the store holds under its id? On yes, the stamp to write,
/// or `None` when there is nothing to write (an update of a free id claims nothing).
///
/// Another tenant's or subject's item is out of scope, and so is moving an item to another
/// purpose or category; an unstamped item is never claimed; an expired item is gone, not revived;
/// an item from an earlier epoch stays dead. Retention counts from the first write: the new stamp
/// never expires later than the one it replaces.
pub fn decide_write_over(
    view: &impl PolicyView,
    facts: &WriteFacts<'_>,
    held: Held<'_>,
    overwrite: Overwrite,
    now: DateTime<Utc>,
) -> Result<Option<Stamp>, Refusal> {
    let previous = match (held, overwrite) {
        (Held::Nothing, _) => None,
        (_, Overwrite::Never) => return Err(Refusal::AlreadyExists),
        (Held::Unstamped, _) => return Err(Refusal::UnstampedItem),
        (Held::Stamped(previous), _) => Some(previous),
    };
    if let Some(previous) = previous {
        let same_owner = previous.tenant == facts.tenant && previous.subject == facts.subject;
        let same_use = previous.purpose == facts.purpose && previous.category == facts.category;
        if !(same_owner && same_use) {
            return Err(Refusal::ScopeViolation);
        }
        if previous.expires_at <= now {
            return Err(Refusal::Expired);
        }
    }
    let facts = WriteFacts {
        authorised_epoch: previous.map(|p| p.epoch).or(facts.authorised_epoch),
        ..*facts
    };
    let mut stamp = decide_write(view, &facts, now)?;
    match previous {
        Some(previous) => stamp.expires_at = stamp.expires_at.min(previous.expires_at),
        None if overwrite == Overwrite::Only => return Ok(None),
        None => {}
    }
    Ok(Some(stamp))
}

/// May this stored item be served? `stamp` is what the store holds for it, if anything.
pub fn decide_read(
    view: &impl PolicyView,
    ctx: &ReadContext<'_>,
    stamp: Option<&Stamp>,
    now: DateTime<Utc>,
) -> Result<(), Refusal> {
    let stamp = stamp.ok_or(Refusal::UnstampedItem)?;
    let in_scope = stamp.tenant == ctx.tenant
        && ctx.bound_subject.is_none_or(|s| s == stamp.subject)
        && ctx.purpose.is_none_or(|p| p == stamp.purpose);
    if !in_scope {
        return Err(Refusal::ScopeViolation);
    }
    let policy = subject_policy(view, &stamp.tenant, &stamp.subject);
    if !policy.state.is_active() {
        return Err(Refusal::SubjectSuppressed);
    }
    // Items from before a suppression stay unreadable even if the subject comes back.
    if stamp.epoch != policy.state.epoch {
        return Err(Refusal::StaleEpoch);
    }
    if stamp.expires_at <= now {
        return Err(Refusal::Expired);
    }
    if coverage_end(
        &policy.grants,
        &stamp.purpose,
        &stamp.category,
        Action::Retrieve,
        now,
    )
    .is_none()
    {
        return Err(Refusal::ConsentRequired);
    }
    Ok(())
}

/// May the stored item `id` of `collection` (in the store the caller reads) be served? As
/// [`decide_read`] on its stamp, and not while an erasure's closure hides it.
pub fn decide_read_item(
    view: &impl PolicyView,
    ctx: &ReadContext<'_>,
    collection: &str,
    id: &str,
    stamp: Option<&Stamp>,
    now: DateTime<Utc>,
) -> Result<(), Refusal> {
    decide_read(view, ctx, stamp, now)?;
    let item = ItemRef {
        store: ctx.store,
        collection,
        id,
    };
    if view.derivative_suppressed(ctx.tenant, &item) {
        return Err(Refusal::SubjectSuppressed);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
