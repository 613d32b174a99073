//! Deleting a subject's traces from a trace store, whatever its API: the rules live here, each
//! trace store's calls in a file of its own (`phoenix.rs`, `langsmith.rs`) behind [`TraceApi`].
//!
//! The stamp each span holds decides whose it is (lineage is only an index of trace ids): a
//! span is the subject's when it carries Lethe's stamp of the subject's tenant and reference. A
//! trace holding nothing but the subject's spans and content-free spans of the tenant is deleted
//! whole; from any other (another subject's, another tenant's, spans Lethe never stamped), only
//! the subject's spans are deleted. Spans naming the subject's key or reference in a subject
//! attribute that are not Lethe's (written around it) are never deleted on a guess: the probe
//! counts them, and the erasure goes to review.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lethe_policy::audit::subject_ref;

use super::adapter::{EXPIRES_AT, SUBJECT_REF, TENANT};
use super::route::{TRACES, trace_of};
use crate::purge::{Connector, ConnectorError, Physical, PurgeReport, Subjects};
use crate::state::ExpiredItem;

/// A span as the trace store holds it: where it is, and the stamp it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeldSpan {
    /// Lowercase hex.
    pub trace_id: String,
    /// The trace store's own id of the span (what deletes it).
    pub span_id: String,
    pub tenant: Option<String>,
    pub subject_ref: Option<String>,
    /// Whether it was kept with its content (it carries a deadline).
    pub content: bool,
}

impl HeldSpan {
    /// A span of the trace store's, from its attributes (`attribute` reads one as text).
    pub fn new(
        trace_id: String,
        span_id: String,
        attribute: impl Fn(&str) -> Option<String>,
    ) -> HeldSpan {
        HeldSpan {
            trace_id,
            span_id,
            tenant: attribute(TENANT),
            subject_ref: attribute(SUBJECT_REF),
            content: attribute(EXPIRES_AT).is_some(),
        }
    }

    fn of_tenant(&self, tenant: &str) -> bool {
        self.tenant.as_deref() == Some(tenant)
    }

    /// Whether it is stamped as one of `references`' in `tenant`.
    fn owned_by(&self, tenant: &str, references: &[String]) -> bool {
        self.of_tenant(tenant)
            && self
                .subject_ref
                .as_ref()
                .is_some_and(|r| references.contains(r))
    }

    /// A span of the tenant's with neither a subject nor content.
    fn nobodys(&self, tenant: &str) -> bool {
        self.of_tenant(tenant) && self.subject_ref.is_none() && !self.content
    }
}

/// What a trace store's API does for the erasure.
#[async_trait]
pub(crate) trait TraceApi: Send + Sync {
    /// The store's name, for messages.
    fn name(&self) -> &str;

    /// Every span whose attribute `key` is `value` (Lethe's own stamp and ids: never a subject
    /// key, which [`TraceApi::spans_naming`] looks for).
    async fn spans_with(&self, key: &str, value: &str) -> Result<Vec<HeldSpan>, ConnectorError>;

    /// Every span naming one of `names` (subject keys and references) in one of `attributes`.
    /// A subject key never leaves Lethe in a URL, which the store's access log keeps: a store
    /// that can only filter in its URL is read whole and matched here.
    async fn spans_naming(
        &self,
        attributes: &[String],
        names: &BTreeSet<String>,
    ) -> Result<Vec<HeldSpan>, ConnectorError>;

    /// Every span of a trace.
    async fn trace(&self, trace_id: &str) -> Result<Vec<HeldSpan>, ConnectorError>;

    /// Deletes a whole trace (gone already: fine).
    async fn delete_trace(&self, trace_id: &str) -> Result<(), ConnectorError>;

    /// Deletes one span of a trace (gone already: fine).
    async fn delete_span(&self, span: &HeldSpan) -> Result<(), ConnectorError>;

    /// Waits until every span the store answered for before the call can be read: a store that
    /// ingests in the background after answering would otherwise show a purge or a sweep
    /// nothing of spans that land after it. At once for one that stores before it answers.
    async fn landed(&self) -> Result<(), ConnectorError> {
        Ok(())
    }

    /// How long deleted spans may still be read after the store took the delete (a store that
    /// queues its deletes); zero for one that deletes before it answers.
    fn deletes_within(&self) -> Duration {
        Duration::ZERO
    }

    /// What the store keeps of deleted traces.
    fn physical(&self) -> Physical;
}

pub(crate) struct TraceConnector<A> {
    api: A,
    /// The route's subject attributes, which the probe reads.
    subject_attributes: Vec<String>,
    /// The key of subject references: the owner lineage names is found by its reference.
    audit_key: Arc<[u8]>,
}

impl<A: TraceApi> TraceConnector<A> {
    pub fn new(api: A, subject_attributes: Vec<String>, audit_key: Arc<[u8]>) -> Self {
        TraceConnector {
            api,
            subject_attributes,
            audit_key,
        }
    }

    /// The spans of `item`'s trace, split into its owner's (by their stamp) and the rest.
    async fn owners(
        &self,
        item: &ExpiredItem,
    ) -> Result<(Vec<HeldSpan>, Vec<HeldSpan>), ConnectorError> {
        let reference = [subject_ref(&self.audit_key, &item.tenant, &item.subject)];
        let spans = self.api.trace(trace_of(&item.item_id)).await?;
        Ok(spans
            .into_iter()
            .partition(|s| s.owned_by(&item.tenant, &reference)))
    }

    fn traces_only(&self, collection: &str) -> Result<(), ConnectorError> {
        match collection == TRACES {
            true => Ok(()),
            false => Err(ConnectorError::Misconfigured(format!(
                "{}: {collection}: traces are the only items of a trace store",
                self.api.name()
            ))),
        }
    }

    /// The traces that may hold the subjects' spans: those lineage names, and those of every
    /// span stamped with their references.
    async fn candidates(
        &self,
        references: &[String],
        lineage: &[(String, String)],
    ) -> Result<BTreeSet<String>, ConnectorError> {
        let mut traces: BTreeSet<String> = lineage
            .iter()
            .filter(|(collection, _)| collection == TRACES)
            .map(|(_, item)| trace_of(item).to_owned())
            .collect();
        for reference in references {
            let stamped = self.api.spans_with(SUBJECT_REF, reference).await?;
            traces.extend(stamped.into_iter().map(|s| s.trace_id));
        }
        Ok(traces)
    }

    /// The subjects' spans in the candidate traces, with each trace's spans.
    async fn held(
        &self,
        subjects: &Subjects,
        lineage: &[(String, String)],
    ) -> Result<Vec<(Vec<HeldSpan>, Vec<HeldSpan>)>, ConnectorError> {
        let tenant = subjects.tenant();
        let references = subjects.references();
        let mut held = Vec::new();
        for trace in self.candidates(&references, lineage).await? {
            let spans = self.api.trace(&trace).await?;
            let (mine, rest): (Vec<_>, Vec<_>) = spans
                .into_iter()
                .partition(|s| s.owned_by(tenant, &references));
            if !mine.is_empty() {
                held.push((mine, rest));
            }
        }
        Ok(held)
    }

    /// Deletes `doomed` spans of a trace whose other spans are `rest`: the whole trace when the
    /// rest is nobody's.
    async fn delete(
        &self,
        tenant: &str,
        doomed: &[HeldSpan],
        rest: &[HeldSpan],
    ) -> Result<(), ConnectorError> {
        match (doomed.first(), rest.iter().all(|s| s.nobodys(tenant))) {
            (None, _) => Ok(()),
            (Some(span), true) => self.api.delete_trace(&span.trace_id).await,
            (Some(_), false) => {
                for span in doomed {
                    self.api.delete_span(span).await?;
                }
                Ok(())
            }
        }
    }

    /// The subjects' spans still held, read again until none is or the store's
    /// [`TraceApi::deletes_within`] has passed.
    async fn left_after_deletes(
        &self,
        subjects: &Subjects,
        lineage: &[(String, String)],
    ) -> Result<u64, ConnectorError> {
        let until = tokio::time::Instant::now() + self.api.deletes_within();
        loop {
            let held = self.held(subjects, lineage).await?;
            let left = held.iter().map(|(mine, _)| mine.len() as u64).sum();
            if left == 0 || tokio::time::Instant::now() >= until {
                return Ok(left);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Spans naming the subjects in a subject attribute (by key or by reference) that Lethe did
    /// not stamp as another tenant's: copies the purge did not take.
    async fn probe(&self, subjects: &Subjects) -> Result<u64, ConnectorError> {
        let tenant = subjects.tenant();
        let names: BTreeSet<String> = subjects
            .keys()
            .into_iter()
            .chain(subjects.references())
            .collect();
        let named = self
            .api
            .spans_naming(&self.subject_attributes, &names)
            .await?;
        let hits: BTreeSet<_> = named
            .into_iter()
            .filter(|span| span.tenant.as_deref().is_none_or(|t| t == tenant))
            .map(|span| (span.trace_id, span.span_id))
            .collect();
        Ok(hits.len() as u64)
    }
}

#[async_trait]
impl<A: TraceApi> Connector for TraceConnector<A> {
    async fn purge(
        &self,
        subjects: &Subjects,
        lineage: &[(String, String)],
    ) -> Result<PurgeReport, ConnectorError> {
        let tenant = subjects.tenant();
        self.api.landed().await?;
        let held = self.held(subjects, lineage).await?;
        let before = held.iter().map(|(mine, _)| mine.len() as u64).sum();
        for (mine, rest) in &held {
            self.delete(tenant, mine, rest).await?;
        }
        let remaining = self.left_after_deletes(subjects, lineage).await?;
        Ok(PurgeReport {
            before,
            deleted: before.saturating_sub(remaining),
            remaining,
            physical: self.api.physical(),
            probe_hits: Some(self.probe(subjects).await?),
        })
    }

    async fn count(
        &self,
        subjects: &Subjects,
        lineage: &[(String, String)],
    ) -> Result<u64, ConnectorError> {
        self.api.landed().await?;
        let held = self.held(subjects, lineage).await?;
        Ok(held.iter().map(|(mine, _)| mine.len() as u64).sum())
    }

    /// Deletes the spans each item's owner holds in its trace (by their stamp: another
    /// owner's stay), the whole trace when nothing else of anyone's is in it. The sweeper gives
    /// the traces whose deadline has passed (a trace's row carries that of the last spans
    /// recorded: a trace lasts seconds to minutes); an erasure, the derivatives decided for it.
    async fn delete_items(
        &self,
        collection: &str,
        items: &[ExpiredItem],
    ) -> Result<u64, ConnectorError> {
        self.traces_only(collection)?;
        self.api.landed().await?;
        let mut deleted = 0;
        for item in items {
            let (doomed, rest) = self.owners(item).await?;
            self.delete(&item.tenant, &doomed, &rest).await?;
            deleted += doomed.len() as u64;
        }
        Ok(deleted)
    }

    /// The spans each item's owner still holds in its trace.
    async fn held_items(
        &self,
        collection: &str,
        items: &[ExpiredItem],
    ) -> Result<u64, ConnectorError> {
        self.traces_only(collection)?;
        self.api.landed().await?;
        let mut held = 0;
        for item in items {
            held += self.owners(item).await?.0.len() as u64;
        }
        Ok(held)
    }
}

#[cfg(test)]
mod tests;
