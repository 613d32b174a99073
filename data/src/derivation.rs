//! Derivative lineage in flight (`[lineage]`): what each request serves is remembered by its
//! trace and by the fingerprints of its text (in this replica's memory and, on a PostgreSQL state
//! store, where the other replicas find it before the request is answered); every write and
//! prompt is checked against what it derives from, refused when that is under erasure, and its
//! edges recorded before it is kept.

pub mod memory;

use std::collections::{BTreeMap, BTreeSet};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Instant;

use lethe_policy::audit::forgotten;
use lethe_policy::derivation::{Fingerprints, QuoteKey};
use lethe_policy::{
    How, Layer, Parent, PolicyView, Refusal, Stamp, SubjectStatus, decide_derivation,
};

use super::RequestContext;
use super::error::DataError;
use crate::config::LineageConfig;
use crate::records::RecordFacts;
use crate::records::{AdapterError, RecordRefusal};
use crate::state::{Derived, Edge, FeedEvent, ItemKey, PolicyChange, Shared, Sharing, Store};
use memory::{Limits, Memory, Remembered};

/// The data plane's derivative lineage; `None` settings: it is off.
pub struct Derivation {
    settings: Option<Settings>,
    memory: Arc<Memory>,
    store: Arc<dyn Store>,
    audit_key: Arc<[u8]>,
    keys: moka::sync::Cache<String, Arc<QuoteKey>>,
    /// Keys the text seen test; random per process, so nobody can aim at a collision.
    texts: std::hash::RandomState,
}

#[derive(Debug, Clone, Copy)]
struct Settings {
    quote_words: usize,
    window: chrono::TimeDelta,
}

/// Something a read served: an item, whose it is, and the text it carried (if any).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    pub collection: String,
    pub id: String,
    pub owner: String,
    pub text: String,
    /// A model's answer (a write that quotes it derives from it `provider`-wise).
    pub answer: bool,
}

/// One record a write (or a prompt) carries: the item it writes, whose it is, and its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Writing<'a> {
    pub collection: &'a str,
    pub id: &'a str,
    pub owner: &'a str,
    pub text: &'a str,
}

/// One parent of a record: the item, whose it is, and how the record came from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParentLink {
    pub item: ItemKey,
    pub owner: String,
    pub how: How,
}

/// What one record derives from, and the fingerprints of its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordDerivation {
    pub item: ItemKey,
    pub owner: String,
    pub parents: Vec<ParentLink>,
    fingerprints: Fingerprints,
}

/// What a write's records derive from, in their order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Derivations {
    pub records: Vec<RecordDerivation>,
}

impl Derivations {
    /// The layer a record is stamped with: derived when it has parents.
    pub fn layer(&self, index: usize) -> Layer {
        match self.records.get(index) {
            Some(r) if !r.parents.is_empty() => Layer::Derived,
            _ => Layer::Raw,
        }
    }

    /// The owners of every parent: their policy decides whether the write may derive from them.
    pub fn owners(&self) -> impl Iterator<Item = &str> {
        self.records
            .iter()
            .flat_map(|r| r.parents.iter().map(|p| p.owner.as_str()))
    }

    /// Refused when a parent of any record is under erasure (`derived_from_erased`), with
    /// each such record's position.
    pub fn check(&self, view: &impl PolicyView, tenant: &str) -> Result<(), AdapterError> {
        let refused: Vec<RecordRefusal> = self
            .records
            .iter()
            .enumerate()
            .filter_map(|(index, r)| {
                let refusal = r.check(view, tenant).err()?;
                Some(RecordRefusal { index, refusal })
            })
            .collect();
        if refused.is_empty() {
            Ok(())
        } else {
            Err(AdapterError::Refused(refused))
        }
    }

    /// These records, then `more`'s.
    pub fn and(mut self, more: Derivations) -> Derivations {
        self.records.extend(more.records);
        self
    }

    pub fn of(&self, item: &str) -> Option<&RecordDerivation> {
        self.records.iter().find(|r| r.item.item == item)
    }

    /// The first record's derivation, as that of `item` (a model's answer: the provider gives
    /// its id once the prompt was decided).
    pub fn for_item(&self, item: &ItemKey) -> Derivations {
        let records = self
            .records
            .first()
            .map(|r| RecordDerivation {
                item: item.clone(),
                ..r.clone()
            })
            .into_iter()
            .collect();
        Derivations { records }
    }
}

impl RecordDerivation {
    pub fn check(&self, view: &impl PolicyView, tenant: &str) -> Result<(), Refusal> {
        let parents: Vec<Parent<'_>> = self
            .parents
            .iter()
            .map(|p| Parent {
                item: p.item.as_ref(),
                owner: &p.owner,
                how: p.how,
            })
            .collect();
        decide_derivation(view, tenant, &parents)
    }
}

/// The lineage collection of a model's answer that its provider does not keep.
pub const ANSWERS: &str = "answers";

impl Derivation {
    pub fn new(config: &LineageConfig, store: Arc<dyn Store>, audit_key: Arc<[u8]>) -> Derivation {
        let settings = config.derivatives.then(|| Settings {
            quote_words: config.quote_words,
            window: chrono::TimeDelta::from_std(config.window.0).unwrap_or(chrono::TimeDelta::MAX),
        });
        let memory = Arc::new(Memory::new(
            Limits {
                window: config.window.0,
                max_traces: config.max_traces,
                max_fingerprints: config.max_fingerprints,
                max_bytes: config.max_bytes,
            },
            Instant::now(),
        ));
        if settings.is_some() {
            forget_when_erased(&store, &memory, &audit_key);
        }
        Derivation {
            settings,
            memory,
            store,
            audit_key,
            keys: moka::sync::Cache::builder().max_capacity(10_000).build(),
            texts: std::hash::RandomState::new(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.settings.is_some()
    }

    /// The memory of the window, for its metrics.
    pub fn memory(&self) -> Arc<Memory> {
        Arc::clone(&self.memory)
    }

    fn key(&self, tenant: &str) -> Arc<QuoteKey> {
        self.keys.get_with(tenant.to_owned(), || {
            Arc::new(QuoteKey::of_tenant(&self.audit_key, tenant))
        })
    }

    fn remembered(
        ctx: &RequestContext,
        collection: &str,
        id: &str,
        owner: &str,
        answer: bool,
    ) -> Remembered {
        Remembered {
            tenant: ctx.tenant().to_owned(),
            store: ctx.store.clone(),
            collection: collection.to_owned(),
            id: id.to_owned(),
            owner: owner.to_owned(),
            answer,
        }
    }

    /// Remembers what a read served: each item under the request's trace, and its text as
    /// something a later write or prompt may quote.
    pub async fn served(&self, ctx: &RequestContext, served: Vec<Served>) -> Result<(), DataError> {
        let Some(settings) = self.settings else {
            return Ok(());
        };
        let now = Instant::now();
        let key = self.key(ctx.tenant());
        let mut shared = Vec::new();
        for s in served {
            // A text seen in this generation already is not fingerprinted again; without a
            // trace, nothing else is remembered of it.
            let seen =
                self.texts
                    .hash_one((ctx.tenant(), &ctx.store, &s.collection, &s.id, &s.text));
            let new_text = !s.text.is_empty() && self.memory.first_sight(seen, now);
            if ctx.trace.is_none() && !new_text {
                continue;
            }
            let item = Arc::new(Self::remembered(
                ctx,
                &s.collection,
                &s.id,
                &s.owner,
                s.answer,
            ));
            if let Some(trace) = ctx.trace {
                self.memory.traced_item(&item, trace, now);
                shared.push(self.shared(&item, Sharing::Trace(trace.to_hex())));
            }
            let fingerprints = new_text.then(|| key.fingerprints(&s.text, settings.quote_words));
            if let Some(fingerprints) = fingerprints.filter(|f| !f.runs.is_empty()) {
                self.memory.quotable(&item, &fingerprints.runs, now);
                shared.push(self.shared(
                    &item,
                    Sharing::Text {
                        digest: fingerprints.digest,
                        runs: fingerprints.runs,
                    },
                ));
            }
        }
        self.share(shared).await
    }

    fn shared(&self, item: &Remembered, what: Sharing) -> Shared {
        Shared {
            tenant: item.tenant.clone(),
            item: ItemKey::new(&item.store, &item.collection, &item.id),
            owner: item.owner.clone(),
            answer: item.answer,
            at: crate::now(),
            what,
        }
    }

    /// Hands what the replicas share to the state store, before the request is answered: a
    /// write on another replica under the same trace, or quoting the same text, finds it.
    async fn share(&self, rows: Vec<Shared>) -> Result<(), DataError> {
        let Some(shared) = self.store.shared_memory() else {
            return Ok(());
        };
        if rows.is_empty() {
            return Ok(());
        }
        shared.share(&rows).await?;
        Ok(())
    }

    /// What each of `writes` derives from: the items its trace read within the window, and
    /// the items and model answers its text quotes (a run of `quote_words` words of theirs);
    /// never the record itself.
    pub async fn parents(
        &self,
        ctx: &RequestContext,
        writes: &[Writing<'_>],
    ) -> Result<Derivations, DataError> {
        let Some(settings) = self.settings else {
            return Ok(Derivations::default());
        };
        let now = Instant::now();
        let key = self.key(ctx.tenant());
        let traced = match ctx.trace {
            Some(trace) => self.memory.traced(ctx.tenant(), trace, now),
            None => Vec::new(),
        };
        let fingerprints: Vec<Fingerprints> = writes
            .iter()
            .map(|w| key.fingerprints(w.text, settings.quote_words))
            .collect();
        let runs: Vec<u64> = fingerprints
            .iter()
            .flat_map(|f| f.runs.iter().copied())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        // A write with no trace and no run of words can derive from nothing the replicas share.
        let recalled = match self.store.shared_memory() {
            Some(shared) if ctx.trace.is_some() || !runs.is_empty() => {
                let trace = ctx.trace.map(|t| t.to_hex());
                let since = crate::now() - settings.window;
                shared
                    .recall(ctx.tenant(), trace.as_deref(), &runs, since)
                    .await?
            }
            _ => Vec::new(),
        };
        let mut records = Vec::with_capacity(writes.len());
        for (write, fingerprints) in writes.iter().zip(fingerprints) {
            let me = ItemKey::new(&ctx.store, write.collection, write.id);
            let mut parents: Vec<ParentLink> = Vec::new();
            let mut add = |item: ItemKey, owner: &str, how: How| {
                if item != me && !parents.iter().any(|p| p.item == item && p.how == how) {
                    parents.push(ParentLink {
                        item,
                        owner: owner.to_owned(),
                        how,
                    });
                }
            };
            let quoted_how = |answer: bool| if answer { How::Provider } else { How::Quote };
            for item in &traced {
                add(key_of(item), &item.owner, How::Trace);
            }
            for item in self.memory.quoted(ctx.tenant(), &fingerprints.runs, now) {
                add(key_of(&item), &item.owner, quoted_how(item.answer));
            }
            for r in &recalled {
                if r.runs.is_empty() {
                    add(r.item.clone(), &r.owner, How::Trace);
                } else if r.runs.iter().any(|run| fingerprints.runs.contains(run)) {
                    add(r.item.clone(), &r.owner, quoted_how(r.answer));
                }
            }
            records.push(RecordDerivation {
                item: me,
                owner: write.owner.to_owned(),
                parents,
                fingerprints,
            });
        }
        Ok(Derivations { records })
    }

    /// What the records of a write of `collection` derive from (`texts` in their order); each
    /// record's layer is set from it.
    pub async fn derive<Id: Sync>(
        &self,
        ctx: &RequestContext,
        collection: &str,
        records: &mut [RecordFacts<Id>],
        id: impl Fn(&Id) -> String,
        texts: &[&str],
    ) -> Result<Derivations, DataError> {
        let ids: Vec<String> = records.iter().map(|r| id(&r.id)).collect();
        let writes: Vec<Writing<'_>> = records
            .iter()
            .zip(&ids)
            .zip(texts.iter().copied().chain(std::iter::repeat("")))
            .map(|((r, id), text)| Writing {
                collection,
                id,
                owner: &r.subject,
                text,
            })
            .collect();
        let derivations = self.parents(ctx, &writes).await?;
        for (i, record) in records.iter_mut().enumerate() {
            record.layer = derivations.layer(i);
        }
        Ok(derivations)
    }

    /// Records what the records about to be written (`written`, by id) derive from, before the
    /// store takes them, added to what they derived from: a flip from now on reaches them, and a
    /// write the store refuses leaves at worst an edge too many (of an item that holds nothing,
    /// or still derives from its old parents). What a rewrite no longer derives from is dropped
    /// once the store took it ([`Derivation::accepted`]).
    pub async fn record(
        &self,
        ctx: &RequestContext,
        derivations: &Derivations,
        written: &[String],
    ) -> Result<(), DataError> {
        self.record_edges(ctx, derivations, Some(written), false)
            .await
    }

    /// Records what all `derivations`' records derive from, beside what they derived from
    /// before (a thread a run writes into, an object the provider made).
    pub async fn record_added(
        &self,
        ctx: &RequestContext,
        derivations: &Derivations,
    ) -> Result<(), DataError> {
        self.record_edges(ctx, derivations, None, false).await
    }

    /// The edges of the records among `ids` (all with `None`): added to theirs, or with
    /// `replace` instead of theirs.
    async fn record_edges(
        &self,
        ctx: &RequestContext,
        derivations: &Derivations,
        ids: Option<&[String]>,
        replace: bool,
    ) -> Result<(), DataError> {
        if !self.enabled() {
            return Ok(());
        }
        let at = crate::now();
        let derived: Vec<Derived> = derivations
            .records
            .iter()
            .filter(|r| ids.is_none_or(|ids| ids.contains(&r.item.item)))
            .filter(|r| replace || !r.parents.is_empty())
            .map(|r| Derived {
                tenant: ctx.tenant().to_owned(),
                replace,
                child: r.item.clone(),
                edges: r
                    .parents
                    .iter()
                    .map(|p| Edge {
                        child: r.item.clone(),
                        child_owner: r.owner.clone(),
                        parent: p.item.clone(),
                        parent_owner: p.owner.clone(),
                        how: p.how,
                        at,
                    })
                    .collect(),
            })
            .collect();
        self.store.record_derived(&derived).await?;
        Ok(())
    }

    /// Once the store took a write: the records it rewrote (`rewritten`: held as derived, their
    /// content replaced) derive from what they derive from now only, and the texts of those it
    /// kept (`kept`, by id) are remembered as something later writes may quote.
    pub async fn accepted(
        &self,
        ctx: &RequestContext,
        derivations: Derivations,
        kept: &[String],
        rewritten: &[String],
    ) -> Result<(), DataError> {
        if !self.enabled() {
            return Ok(());
        }
        let replaced: Vec<String> = rewritten
            .iter()
            .filter(|id| kept.contains(id))
            .cloned()
            .collect();
        if !replaced.is_empty() {
            self.record_edges(ctx, &derivations, Some(&replaced), true)
                .await?;
        }
        let now = Instant::now();
        let mut shared = Vec::new();
        for r in derivations.records {
            if !kept.contains(&r.item.item) || r.fingerprints.runs.is_empty() {
                continue;
            }
            let item = Arc::new(Self::remembered(
                ctx,
                &r.item.collection,
                &r.item.item,
                &r.owner,
                false,
            ));
            self.memory.quotable(&item, &r.fingerprints.runs, now);
            shared.push(self.shared(
                &item,
                Sharing::Text {
                    digest: r.fingerprints.digest,
                    runs: r.fingerprints.runs,
                },
            ));
        }
        self.share(shared).await
    }
}

/// Once an erasure completes and the state store knows its subject only by reference, so does
/// the memory of the window (on every replica: the completion's change reaches each one's feed).
fn forget_when_erased(store: &Arc<dyn Store>, memory: &Arc<Memory>, audit_key: &Arc<[u8]>) {
    let (weak_store, weak_memory) = (Arc::downgrade(store), Arc::downgrade(memory));
    let audit_key = Arc::clone(audit_key);
    store.feed().on_event(move |event| {
        let FeedEvent::Changed(PolicyChange {
            tenant,
            subject: Some(key),
            derivatives: false,
            revoked_token: None,
        }) = event
        else {
            return;
        };
        let name = forgotten(&audit_key, tenant, key);
        let (Ok(runtime), false) = (tokio::runtime::Handle::try_current(), name == *key) else {
            return;
        };
        let (store, memory) = (weak_store.clone(), weak_memory.clone());
        let (tenant, key) = (tenant.clone(), key.clone());
        runtime.spawn(async move {
            let Some(store) = store.upgrade() else {
                return;
            };
            // A subject is stored under its reference only once an erasure of it completed.
            match store.subject(&tenant, &name).await {
                Ok(Some(state)) if state.status == SubjectStatus::Erased => {
                    if let Some(memory) = memory.upgrade() {
                        memory.forget(&tenant, &key, &name);
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "the memory of the window keeps an erased subject's key until it ages out"),
            }
        });
    });
}

impl Derivation {
    /// A model's answer (`id`, kept in `collection` of the provider route, `text`) derives from
    /// what its prompt did (`derivations`, decided before it was sent): its edges are recorded,
    /// and its text remembered (see [`Derivation::remember_answer`]).
    pub async fn answered(
        &self,
        ctx: &RequestContext,
        collection: &str,
        id: &str,
        text: String,
        derivations: &Derivations,
    ) -> Result<(), DataError> {
        if !self.enabled() {
            return Ok(());
        }
        let answer = derivations.for_item(&ItemKey::new(&ctx.store, collection, id));
        self.record(ctx, &answer, &[id.to_owned()]).await?;
        self.remember_answer(ctx, collection, id, text, derivations)
            .await
    }

    /// A model's answer's text is remembered as served, so that a write quoting it derives from
    /// it (and through it from its parents); its edges are recorded already (a stored object's,
    /// as it was kept).
    pub async fn remember_answer(
        &self,
        ctx: &RequestContext,
        collection: &str,
        id: &str,
        text: String,
        derivations: &Derivations,
    ) -> Result<(), DataError> {
        let served = Served {
            collection: collection.to_owned(),
            id: id.to_owned(),
            owner: derivations
                .records
                .first()
                .map(|r| r.owner.clone())
                .unwrap_or_default(),
            text,
            answer: true,
        };
        self.served(ctx, vec![served]).await
    }
}

/// The ids whose item the store held stamped as derived (a rewrite replaces what they derive
/// from), as lineage names them.
pub fn derived_before<K>(
    held: &BTreeMap<K, Option<Stamp>>,
    id: impl Fn(&K) -> String,
) -> Vec<String> {
    held.iter()
        .filter(|(_, stamp)| stamp.as_ref().is_some_and(|s| s.layer == Layer::Derived))
        .map(|(k, _)| id(k))
        .collect()
}

fn key_of(item: &Remembered) -> ItemKey {
    ItemKey::new(&item.store, &item.collection, &item.id)
}

#[cfg(test)]
mod tests;
