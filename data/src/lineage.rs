//! Lineage rows (and which providers received a subject's data) are written off the hot path:
//! requests hand them to a writer task that stores them in batches. The stamp in the store stays
//! the source of truth; lineage is the index.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::state::{ItemRecord, ProcessorUse, Store, StoreError};

const BATCH: usize = 500;
/// How long the first row of a batch waits for others, unless someone waits for it.
const GATHER: Duration = Duration::from_millis(25);

enum Row {
    Item(ItemRecord),
    Processor(ProcessorUse),
    /// Answered once every row queued before it is stored (`false`: it could not be).
    Flush(oneshot::Sender<bool>),
}

#[derive(Clone)]
pub struct LineageWriter {
    tx: mpsc::Sender<Row>,
    /// Provider uses recorded in the last minute: the last use moves on at most once a minute,
    /// rather than one write per request.
    recent_uses: moka::sync::Cache<(String, String, String), ()>,
    /// Batches of rows the writer could not store, after its retries.
    dropped: Arc<AtomicU64>,
    /// Item rows stored.
    written: Arc<AtomicU64>,
}

impl LineageWriter {
    /// Starts the writer; it runs until every `LineageWriter` clone is dropped, then flushes.
    pub fn spawn(store: Arc<dyn Store>) -> (LineageWriter, JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(10_000);
        let recent_uses = moka::sync::Cache::builder()
            .max_capacity(100_000)
            .time_to_live(Duration::from_secs(60))
            .build();
        let (dropped, written) = (Arc::default(), Arc::default());
        let writer = LineageWriter {
            tx,
            recent_uses,
            dropped: Arc::clone(&dropped),
            written: Arc::clone(&written),
        };
        (writer, tokio::spawn(write(store, rx, dropped, written)))
    }

    /// Queues rows; waits only when the writer is 10 000 rows behind.
    pub async fn record(&self, items: Vec<ItemRecord>) {
        for item in items {
            self.queue(Row::Item(item)).await;
        }
    }

    /// Records rows in the writer's next batch, which is written at once, and waits for it:
    /// `false` when they could not be stored. Rows queued before are stored first, so an older
    /// row of the same item never lands after these.
    pub async fn record_now(&self, items: Vec<ItemRecord>) -> bool {
        let (done, stored) = oneshot::channel();
        self.record(items).await;
        self.queue(Row::Flush(done)).await;
        stored.await.unwrap_or(false)
    }

    /// Queues the use of a provider (a processor) for a subject's data, unless it was recorded
    /// less than a minute ago.
    pub async fn processor_used(&self, used: ProcessorUse) {
        let key = (
            used.tenant.clone(),
            used.subject.clone(),
            used.processor.clone(),
        );
        if self.recent_uses.contains_key(&key) {
            return;
        }
        self.recent_uses.insert(key, ());
        self.queue(Row::Processor(used)).await;
    }

    /// How many batches of rows the writer could not store (after its retries) since it
    /// started: whoever remembers what it recorded forgets it when this moves.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Acquire)
    }

    /// Rows written and batches dropped, and the rows waiting, in Prometheus' text format.
    pub fn render(&self, out: &mut String) {
        let queued = self.tx.max_capacity() - self.tx.capacity();
        out.push_str(&format!(
            "# HELP lethe_lineage_rows_written_total Lineage rows stored in the state store.\n# TYPE lethe_lineage_rows_written_total counter\nlethe_lineage_rows_written_total {}\n\
             # HELP lethe_lineage_batches_dropped_total Batches of lineage rows not stored after their retries.\n# TYPE lethe_lineage_batches_dropped_total counter\nlethe_lineage_batches_dropped_total {}\n\
             # HELP lethe_lineage_queued_rows Lineage rows waiting for the writer.\n# TYPE lethe_lineage_queued_rows gauge\nlethe_lineage_queued_rows {queued}\n",
            self.written.load(Ordering::Acquire),
            self.dropped(),
        ));
    }

    async fn queue(&self, row: Row) {
        if self.tx.send(row).await.is_err() {
            tracing::error!("lineage writer stopped; a lineage row was not recorded");
        }
    }
}

async fn write(
    store: Arc<dyn Store>,
    mut rx: mpsc::Receiver<Row>,
    dropped: Arc<AtomicU64>,
    written: Arc<AtomicU64>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    let awaited = |batch: &[Row]| batch.iter().any(|r| matches!(r, Row::Flush(_)));
    while rx.recv_many(&mut batch, BATCH).await > 0 {
        // Rows arriving a few at a time are gathered a moment: one transaction (and one sync to
        // disk) for many requests rather than one each. A row someone waits for ends the wait.
        let gathered = tokio::time::sleep(GATHER);
        tokio::pin!(gathered);
        while batch.len() < BATCH && !awaited(&batch) {
            let room = BATCH - batch.len();
            tokio::select! {
                () = &mut gathered => break,
                n = rx.recv_many(&mut batch, room) => if n == 0 { break },
            }
        }
        let (mut items, mut uses, mut waiting) = (Vec::new(), Vec::new(), Vec::new());
        for row in batch.drain(..) {
            match row {
                Row::Item(item) => items.push(item),
                Row::Processor(used) => uses.push(used),
                Row::Flush(done) => waiting.push(done),
            }
        }
        let mut stored = true;
        if !items.is_empty() {
            if retried("lineage batch", || store.record_items(&items)).await {
                written.fetch_add(items.len() as u64, Ordering::Release);
            } else {
                dropped.fetch_add(1, Ordering::Release);
                stored = false;
            }
        }
        if !uses.is_empty() {
            stored &= retried("processor batch", || store.record_processors(&uses)).await;
        }
        for done in waiting {
            let _ = done.send(stored);
        }
    }
}

/// Whether the attempt succeeded within five tries.
async fn retried<F, Fut>(what: &str, mut attempt_once: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), StoreError>>,
{
    let mut delay = Duration::from_millis(50);
    for attempt in 1..=5 {
        match attempt_once().await {
            Ok(()) => return true,
            Err(e) if attempt < 5 => {
                tracing::warn!(error = %e, attempt, "{what} failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            Err(e) => tracing::error!(error = %e, "{what} dropped"),
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;
    use lethe_policy::Layer;

    use super::*;
    use crate::testing::{fresh_sqlite_url, migrated};

    fn row(id: &str, layer: Layer) -> ItemRecord {
        ItemRecord {
            store: "chroma".into(),
            collection: "c".into(),
            item_id: id.into(),
            tenant: "acme".into(),
            subject: "alice".into(),
            purpose: "personalization".into(),
            category: "preference".into(),
            layer,
            created_at: crate::now(),
            expires_at: crate::now() + TimeDelta::days(1),
            epoch: 0,
            source_ref: None,
            parents: vec![],
        }
    }

    #[tokio::test]
    async fn a_batch_that_cannot_be_stored_is_counted_dropped() {
        let url = fresh_sqlite_url();
        let store = migrated(&url).await;
        let (writer, _task) = LineageWriter::spawn(Arc::clone(&store));
        assert!(writer.record_now(vec![row("a", Layer::Raw)]).await);
        assert_eq!(writer.dropped(), 0);
        crate::testing::execute_raw(&url, "DROP TABLE items")
            .await
            .expect("drop");
        assert!(!writer.record_now(vec![row("b", Layer::Raw)]).await);
        assert_eq!(writer.dropped(), 1);
        let mut metrics = String::new();
        writer.render(&mut metrics);
        for line in [
            "lethe_lineage_rows_written_total 1",
            "lethe_lineage_batches_dropped_total 1",
            "lethe_lineage_queued_rows 0",
        ] {
            assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
        }
    }

    #[tokio::test]
    async fn rows_waited_for_are_stored_at_the_answer_after_the_rows_queued_before_them() {
        let store = migrated(&fresh_sqlite_url()).await;
        let (writer, _task) = LineageWriter::spawn(Arc::clone(&store));
        writer
            .record(vec![row("a", Layer::Raw), row("b", Layer::Raw)])
            .await;
        assert!(writer.record_now(vec![row("b", Layer::Derived)]).await);
        let ids = ["a".to_owned(), "b".to_owned()];
        let stored = store.item_stamps("chroma", "c", &ids).await.expect("read");
        assert_eq!(stored.len(), 2, "the rows queued before are stored too");
        assert_eq!(
            stored["b"].layer,
            Layer::Derived,
            "the later row of b is the one kept"
        );
    }
}
