//! Lineage rows are written off the hot path: requests hand them to a writer task that stores
//! them in batches. The stamp in the store stays the source of truth; lineage is the index.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::store::{ItemRecord, Store};

const BATCH: usize = 500;

#[derive(Clone)]
pub struct LineageWriter {
    tx: mpsc::Sender<ItemRecord>,
}

impl LineageWriter {
    /// Starts the writer; it runs until every `LineageWriter` clone is dropped, then flushes.
    pub fn spawn(store: Arc<dyn Store>) -> (LineageWriter, JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(10_000);
        (LineageWriter { tx }, tokio::spawn(write(store, rx)))
    }

    /// Queues rows; waits only when the writer is 10 000 rows behind.
    pub async fn record(&self, items: Vec<ItemRecord>) {
        for item in items {
            if self.tx.send(item).await.is_err() {
                tracing::error!("lineage writer stopped; a lineage row was not recorded");
                return;
            }
        }
    }
}

async fn write(store: Arc<dyn Store>, mut rx: mpsc::Receiver<ItemRecord>) {
    let mut batch = Vec::with_capacity(BATCH);
    while rx.recv_many(&mut batch, BATCH).await > 0 {
        let mut delay = Duration::from_millis(50);
        for attempt in 1..=5 {
            match store.record_items(&batch).await {
                Ok(()) => break,
                Err(e) if attempt < 5 => {
                    tracing::warn!(error = %e, attempt, rows = batch.len(), "lineage batch failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                Err(e) => tracing::error!(error = %e, rows = batch.len(), "lineage batch dropped"),
            }
        }
        batch.clear();
    }
}
