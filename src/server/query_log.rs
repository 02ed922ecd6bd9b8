//! The query log's one writer. A search hands its entry to a bounded queue and goes on; one background service
//! (`service`) takes what is
//! queued, a batch at a time, and writes each batch in one transaction on a database connection of its own, so
//! that logging neither grows without bound under load nor takes the pool that jobs and tasks share. Entries
//! past the bound, and batches the database refused, are dropped and counted (`/metrics`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::service::{Next, Services};
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
    /// Starts the writer (a background service reaching the current runtime) keeping the newest `keep`
    /// entries, with at most `bound` entries waiting for it.
    pub fn start(store: &Store, keep: usize, bound: usize, services: &Services) -> QueryLog {
        let counts = Arc::new(Counts::default());
        if keep == 0 {
            return QueryLog { sender: None, counts };
        }
        let (sender, receiver) = mpsc::channel(bound.max(1));
        let shared = store.clone();
        let mut writer = Writer { shared, own: None, keep, receiver, batch: vec![], counts: counts.clone() };
        let runtime = tokio::runtime::Handle::current();
        services.spawn_worker("query-log", Duration::ZERO, move || writer.write(&runtime));
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

struct Writer {
    shared: Store,
    /// The writer's own connection: connected when first needed, and again after a failure (the database may
    /// have been away).
    own: Option<Store>,
    keep: usize,
    receiver: mpsc::Receiver<Entry>,
    batch: Vec<Entry>,
    counts: Arc<Counts>,
}

impl Writer {
    /// The service's tick: the entries queued (waiting a second at most for one, so that a stop is seen),
    /// written in one transaction.
    fn write(&mut self, runtime: &tokio::runtime::Handle) -> Next {
        let (receiver, batch) = (&mut self.receiver, &mut self.batch);
        // The timer made inside the runtime: this thread is not one of its own.
        match runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(1), receiver.recv_many(batch, BATCH)).await })
        {
            // Every sender gone: the server is ending.
            Ok(0) => return Next::After(Duration::from_secs(3600)),
            Err(_) => return Next::Now,
            Ok(_) => {}
        }
        crate::hooks::point("query_log.write");
        if self.own.is_none() {
            self.own = runtime.block_on(self.shared.alone()).map_err(|e| tracing::warn!("query log: {e}")).ok();
        }
        let entries: Vec<QueryLogEntry> = self
            .batch
            .iter()
            .map(|e| QueryLogEntry {
                query: &e.query,
                collection: Some(&e.collection),
                pipeline: e.pipeline,
                latency_ms: e.latency_ms,
                results: e.results,
            })
            .collect();
        let written = match &self.own {
            Some(store) => runtime
                .block_on(store.log_queries(&entries, self.keep))
                .map_err(|e| tracing::warn!("query log: {e}"))
                .is_ok(),
            None => false,
        };
        let n = self.batch.len() as u64;
        if written {
            self.counts.written.fetch_add(n, Ordering::Relaxed);
        } else {
            self.counts.dropped_failed.fetch_add(n, Ordering::Relaxed);
            self.own = None;
        }
        self.batch.clear();
        Next::Now
    }
}
