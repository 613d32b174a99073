//! Lineage rows (and which providers received a subject's data) are written off the hot path:
//! requests hand them to a writer task that stores them in batches. The stamp in the store stays
//! the source of truth; lineage is the index.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::store::{ItemRecord, ProcessorUse, Store, StoreError};

const BATCH: usize = 500;

enum Row {
    Item(ItemRecord),
    Processor(ProcessorUse),
}

#[derive(Clone)]
pub struct LineageWriter {
    tx: mpsc::Sender<Row>,
    /// Provider uses recorded in the last minute: the last use moves on at most once a minute,
    /// rather than one write per request.
    recent_uses: moka::sync::Cache<(String, String, String), ()>,
}

impl LineageWriter {
    /// Starts the writer; it runs until every `LineageWriter` clone is dropped, then flushes.
    pub fn spawn(store: Arc<dyn Store>) -> (LineageWriter, JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(10_000);
        let recent_uses = moka::sync::Cache::builder()
            .max_capacity(100_000)
            .time_to_live(Duration::from_secs(60))
            .build();
        let writer = LineageWriter { tx, recent_uses };
        (writer, tokio::spawn(write(store, rx)))
    }

    /// Queues rows; waits only when the writer is 10 000 rows behind.
    pub async fn record(&self, items: Vec<ItemRecord>) {
        for item in items {
            self.queue(Row::Item(item)).await;
        }
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

    async fn queue(&self, row: Row) {
        if self.tx.send(row).await.is_err() {
            tracing::error!("lineage writer stopped; a lineage row was not recorded");
        }
    }
}

async fn write(store: Arc<dyn Store>, mut rx: mpsc::Receiver<Row>) {
    let mut batch = Vec::with_capacity(BATCH);
    while rx.recv_many(&mut batch, BATCH).await > 0 {
        let mut items = Vec::new();
        let mut uses = Vec::new();
        for row in batch.drain(..) {
            match row {
                Row::Item(item) => items.push(item),
                Row::Processor(used) => uses.push(used),
            }
        }
        if !items.is_empty() {
            retried("lineage batch", || store.record_items(&items)).await;
        }
        if !uses.is_empty() {
            retried("processor batch", || store.record_processors(&uses)).await;
        }
    }
}

async fn retried<F, Fut>(what: &str, mut attempt_once: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), StoreError>>,
{
    let mut delay = Duration::from_millis(50);
    for attempt in 1..=5 {
        match attempt_once().await {
            Ok(()) => return,
            Err(e) if attempt < 5 => {
                tracing::warn!(error = %e, attempt, "{what} failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            Err(e) => tracing::error!(error = %e, "{what} dropped"),
        }
    }
}
