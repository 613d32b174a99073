//! The trace connector's rules over a trace store kept in memory (the real one, Phoenix, is
//! driven by the end-to-end tests): who owns a span, when a trace goes whole, what the probe
//! counts, what the sweeper takes.

use std::sync::{Arc, Mutex};

use super::*;
use crate::otlp::route::trace_item;
use lethe_policy::audit::{forgotten, subject_ref};

const KEY: &[u8] = b"audit-key";

/// A span held in memory, with the subject attributes the probe reads.
#[derive(Clone)]
struct Stored {
    span: HeldSpan,
    user_id: Option<String>,
}

#[derive(Default)]
struct Memory {
    spans: Mutex<Vec<Stored>>,
    /// Every delete asked: `trace <id>` or `span <id>`.
    deletes: Mutex<Vec<String>>,
    /// Spans the store took and has not ingested yet: they land when `landed` is awaited.
    queued: Mutex<Vec<Stored>>,
}

#[async_trait]
impl TraceApi for Arc<Memory> {
    fn name(&self) -> &str {
        "memory"
    }

    async fn spans_with(&self, key: &str, value: &str) -> Result<Vec<HeldSpan>, ConnectorError> {
        let spans = self.spans.lock().unwrap();
        Ok(spans
            .iter()
            .filter(|s| key == SUBJECT_REF && s.span.subject_ref.as_deref() == Some(value))
            .map(|s| s.span.clone())
            .collect())
    }

    async fn spans_naming(
        &self,
        attributes: &[String],
        names: &BTreeSet<String>,
    ) -> Result<Vec<HeldSpan>, ConnectorError> {
        assert_eq!(attributes, ["user.id"]);
        let spans = self.spans.lock().unwrap();
        Ok(spans
            .iter()
            .filter(|s| s.user_id.as_ref().is_some_and(|id| names.contains(id)))
            .map(|s| s.span.clone())
            .collect())
    }

    async fn trace(&self, trace_id: &str) -> Result<Vec<HeldSpan>, ConnectorError> {
        let spans = self.spans.lock().unwrap();
        Ok(spans
            .iter()
            .filter(|s| s.span.trace_id == trace_id)
            .map(|s| s.span.clone())
            .collect())
    }

    async fn delete_trace(&self, trace_id: &str) -> Result<(), ConnectorError> {
        self.deletes
            .lock()
            .unwrap()
            .push(format!("trace {trace_id}"));
        self.spans
            .lock()
            .unwrap()
            .retain(|s| s.span.trace_id != trace_id);
        Ok(())
    }

    async fn delete_span(&self, span: &HeldSpan) -> Result<(), ConnectorError> {
        self.deletes
            .lock()
            .unwrap()
            .push(format!("span {}", span.span_id));
        self.spans
            .lock()
            .unwrap()
            .retain(|s| s.span.span_id != span.span_id);
        Ok(())
    }

    async fn landed(&self) -> Result<(), ConnectorError> {
        let queued = std::mem::take(&mut *self.queued.lock().unwrap());
        self.spans.lock().unwrap().extend(queued);
        Ok(())
    }

    fn physical(&self) -> Physical {
        Physical::default()
    }
}

/// A span of `trace` stamped for `subject` of `tenant` (none: unattributed), kept with its
/// content when `content`.
fn span(
    id: &str,
    trace: &str,
    tenant: Option<&str>,
    subject: Option<&str>,
    content: bool,
) -> Stored {
    Stored {
        span: HeldSpan {
            trace_id: trace.into(),
            span_id: id.into(),
            tenant: tenant.map(str::to_owned),
            subject_ref: subject.map(|s| subject_ref(KEY, tenant.unwrap_or("acme"), s)),
            content,
        },
        user_id: subject.map(|s| subject_ref(KEY, tenant.unwrap_or("acme"), s)),
    }
}

fn store(spans: Vec<Stored>) -> (Arc<Memory>, TraceConnector<Arc<Memory>>) {
    let memory = Arc::new(Memory {
        spans: Mutex::new(spans),
        ..Memory::default()
    });
    let connector =
        TraceConnector::new(Arc::clone(&memory), vec!["user.id".into()], Arc::from(KEY));
    (memory, connector)
}

fn subjects(names: &[&str]) -> Subjects {
    Subjects::new(
        "acme",
        names.iter().map(|n| (*n).to_owned()).collect(),
        Arc::from(KEY),
    )
}

fn left(memory: &Memory) -> Vec<String> {
    let mut ids: Vec<String> = memory
        .spans
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.span.span_id.clone())
        .collect();
    ids.sort();
    ids
}

fn deletes(memory: &Memory) -> Vec<String> {
    memory.deletes.lock().unwrap().clone()
}

#[tokio::test]
async fn a_trace_of_the_subject_alone_goes_whole_and_a_shared_one_loses_only_the_subjects_spans() {
    let acme = Some("acme");
    let (memory, connector) = store(vec![
        // t1: alice's, with a content-free span of the tenant's (no subject).
        span("a1", "t1", acme, Some("alice"), true),
        span("a2", "t1", acme, Some("alice"), false),
        span("n1", "t1", acme, None, false),
        // t2: alice's and bob's.
        span("a3", "t2", acme, Some("alice"), true),
        span("b1", "t2", acme, Some("bob"), true),
        // t3: alice's, and another tenant's span under the same trace id.
        span("a4", "t3", acme, Some("alice"), true),
        span("g1", "t3", Some("globex"), Some("alice"), true),
        // t4: a span Lethe never stamped, in alice's trace.
        span("a5", "t4", acme, Some("alice"), true),
        span("x1", "t4", None, None, false),
        // t5: bob's only.
        span("b2", "t5", acme, Some("bob"), true),
    ]);
    let alice = subjects(&["alice"]);
    // Lineage names t5 for alice: an index, not an owner; t5's stamps are bob's.
    let lineage = [
        (
            TRACES.to_owned(),
            trace_item("t5", &subject_ref(KEY, "acme", "alice")),
        ),
        (
            TRACES.to_owned(),
            trace_item("t1", &subject_ref(KEY, "acme", "alice")),
        ),
    ];
    assert_eq!(connector.count(&alice, &lineage).await.unwrap(), 5);
    let report = connector.purge(&alice, &lineage).await.unwrap();
    assert_eq!((report.before, report.deleted, report.remaining), (5, 5, 0));
    assert_eq!(left(&memory), ["b1", "b2", "g1", "x1"]);
    assert_eq!(
        deletes(&memory),
        ["trace t1", "span a3", "span a4", "span a5"],
        "only t1 holds nothing of anyone else's"
    );
    assert_eq!(report.probe_hits, Some(0));
    assert_eq!(connector.count(&alice, &lineage).await.unwrap(), 0);
}

#[tokio::test]
async fn a_subject_known_only_by_reference_is_found_by_its_stamp() {
    let (memory, connector) = store(vec![
        span("a1", "t1", Some("acme"), Some("alice"), true),
        span("b1", "t2", Some("acme"), Some("bob"), true),
    ]);
    let forgotten = forgotten(KEY, "acme", "alice");
    let report = connector
        .purge(&subjects(&[&forgotten]), &[])
        .await
        .unwrap();
    assert_eq!((report.before, report.remaining), (1, 0));
    assert_eq!(left(&memory), ["b1"]);
}

#[tokio::test]
async fn the_probe_counts_spans_naming_the_subject_that_lethe_did_not_stamp_and_deletes_none() {
    let mut around = span("r1", "t9", None, None, false);
    around.user_id = Some("alice".into());
    let mut pseudonymised = span("r2", "t8", None, None, false);
    pseudonymised.user_id = Some(subject_ref(KEY, "acme", "alice"));
    let mut globex = span("g1", "t7", Some("globex"), None, false);
    globex.user_id = Some("alice".into());
    let (memory, connector) = store(vec![around, pseudonymised, globex]);
    let report = connector.purge(&subjects(&["alice"]), &[]).await.unwrap();
    assert_eq!(report.before, 0);
    assert_eq!(
        report.probe_hits,
        Some(2),
        "raw and pseudonymised; not another tenant's alice"
    );
    assert_eq!(left(&memory), ["g1", "r1", "r2"]);
}

#[tokio::test]
async fn the_items_lineage_names_lose_their_owners_spans_and_no_one_elses() {
    let acme = Some("acme");
    let (memory, connector) = store(vec![
        span("a1", "t1", acme, Some("alice"), true),
        span("n1", "t1", acme, None, false),
        span("a2", "t2", acme, Some("alice"), true),
        span("b2", "t2", acme, Some("bob"), true),
        span("g2", "t2", Some("globex"), Some("alice"), true),
    ]);
    let item = |trace: &str| ExpiredItem {
        store: "traces-route".into(),
        collection: TRACES.into(),
        item_id: trace_item(trace, &subject_ref(KEY, "acme", "alice")),
        tenant: "acme".into(),
        subject: "alice".into(),
    };
    let items = [item("t1"), item("t2")];
    assert_eq!(connector.held_items(TRACES, &items).await.unwrap(), 2);
    assert_eq!(connector.delete_items(TRACES, &items).await.unwrap(), 2);
    assert_eq!(
        left(&memory),
        ["b2", "g2"],
        "bob's and globex's alice's stay"
    );
    assert_eq!(deletes(&memory), ["trace t1", "span a2"]);
    assert_eq!(connector.held_items(TRACES, &items).await.unwrap(), 0);
    assert!(connector.delete_items("other", &items).await.is_err());
}

#[tokio::test]
async fn spans_taken_but_not_yet_ingested_are_waited_for_by_the_sweep_the_count_and_the_purge() {
    let acme = Some("acme");
    let queued = |id: &str| vec![span(id, "t1", acme, Some("alice"), true)];
    let (memory, connector) = store(vec![]);
    let item = ExpiredItem {
        store: "traces-route".into(),
        collection: TRACES.into(),
        item_id: trace_item("t1", &subject_ref(KEY, "acme", "alice")),
        tenant: "acme".into(),
        subject: "alice".into(),
    };
    *memory.queued.lock().unwrap() = queued("a1");
    assert_eq!(connector.delete_items(TRACES, &[item]).await.unwrap(), 1);
    assert!(
        left(&memory).is_empty(),
        "the sweep read once it had landed"
    );

    let alice = subjects(&["alice"]);
    *memory.queued.lock().unwrap() = queued("a2");
    assert_eq!(connector.count(&alice, &[]).await.unwrap(), 1);
    *memory.queued.lock().unwrap() = queued("a3");
    let report = connector.purge(&alice, &[]).await.unwrap();
    assert_eq!((report.before, report.deleted, report.remaining), (2, 2, 0));
    assert!(left(&memory).is_empty());
}
