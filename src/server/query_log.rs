//! The query log's one writer. A search hands its entry to a bounded queue and goes on; one task takes what is
//! queued, a batch at a time, and writes each batch in one transaction on a database connection of its own, so
//! that logging neither grows without bound under load nor takes the pool that jobs and tasks share. Entries
//! past the bound, and batches the database refused, are dropped and counted (`/metrics`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::store::{QueryLogEntry, Store};

/// Entries written in one transaction at most.
const BATCH: usize = 512;

/// One search, as the log keeps it.
pub struct Entry {
    pub query: String,
    pub collection: String,
    pub pipeline: &'static str,
    pub latency_ms: f64,
    pub results: i64,
}

/// What became of the entries handed to the log.
#[derive(Default)]
pub struct Counts {
    pub written: AtomicU64,
    /// Dropped because the queue was full.
    pub dropped_full: AtomicU64,
    /// Dropped because the database refused their batch.
    pub dropped_failed: AtomicU64,
}

pub struct QueryLog {
    /// None when the log keeps nothing (`query_log_entries = 0`).
    sender: Option<mpsc::Sender<Entry>>,
    counts: Arc<Counts>,
}

impl QueryLog {
    /// Starts the writer (on the current runtime) keeping the newest `keep` entries, with at most `bound`
    /// entries waiting for it.
    pub fn start(store: &Store, keep: usize, bound: usize) -> QueryLog {
        let counts = Arc::new(Counts::default());
        if keep == 0 {
            return QueryLog { sender: None, counts };
        }
        let (sender, receiver) = mpsc::channel(bound.max(1));
        tokio::spawn(write(store.clone(), keep, receiver, counts.clone()));
        QueryLog { sender: Some(sender), counts }
    }

    /// Queues an entry, or counts it dropped when the queue is full.
    pub fn log(&self, entry: Entry) {
        let Some(sender) = &self.sender else { return };
        if sender.try_send(entry).is_err() {
            self.counts.dropped_full.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn counts(&self) -> &Counts {
        &self.counts
    }

    /// Entries waiting for the writer.
    pub fn queued(&self) -> usize {
        self.sender.as_ref().map_or(0, |s| s.max_capacity() - s.capacity())
    }
}

async fn write(shared: Store, keep: usize, mut receiver: mpsc::Receiver<Entry>, counts: Arc<Counts>) {
    let mut own: Option<Store> = None;
    let mut batch = Vec::with_capacity(BATCH);
    while receiver.recv_many(&mut batch, BATCH).await > 0 {
        crate::hooks::reached("query_log.write").await;
        // Connected when first needed, and again after a failure (the database may have been away).
        if own.is_none() {
            own = shared.alone().await.map_err(|e| tracing::warn!("query log: {e}")).ok();
        }
        let entries: Vec<QueryLogEntry> = batch
            .iter()
            .map(|e| QueryLogEntry {
                query: &e.query,
                collection: Some(&e.collection),
                pipeline: e.pipeline,
                latency_ms: e.latency_ms,
                results: e.results,
            })
            .collect();
        let written = match &own {
            Some(store) => {
                store.log_queries(&entries, keep).await.map_err(|e| tracing::warn!("query log: {e}")).is_ok()
            }
            None => false,
        };
        let n = batch.len() as u64;
        if written {
            counts.written.fetch_add(n, Ordering::Relaxed);
        } else {
            counts.dropped_failed.fetch_add(n, Ordering::Relaxed);
            own = None;
        }
        batch.clear();
    }
}
