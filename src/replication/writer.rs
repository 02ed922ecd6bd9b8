//! Which replica writes a cluster's collections, when they travel through an object store: the one holding
//! PostgreSQL's advisory lock on the writer key, on a connection of its own. It applies every collection task
//! (any replica queues them in the shared store; an upload is forwarded to it, streamed, since the file must be
//! where it is applied) and publishes each result. When it dies its connection closes, the lock is free, and
//! another replica takes it within a second; one that loses its connection to the database stops writing.
//! A home-made election in a few lines, on PostgreSQL's locks (as the batch leases are): no consensus of ours.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::service::Services;
use crate::store::{Store, StoreError, WriterLease};

/// How often a replica tries the lock, and the writer checks it still holds it.
const ELECTION: Duration = Duration::from_secs(1);

/// Where a write goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// This replica is the writer.
    Here,
    /// Another replica is, at this URL.
    Writer(String),
    /// None holds the lock now (the writer died a moment ago): try again in a second.
    NoWriter,
}

pub struct Writer {
    store: Store,
    writing: AtomicBool,
}

impl Writer {
    pub fn new(store: Store) -> Arc<Writer> {
        Arc::new(Writer { store, writing: AtomicBool::new(false) })
    }

    /// Whether this replica holds the lock (as of its last check, at most a second ago).
    pub fn is_writer(&self) -> bool {
        self.writing.load(Ordering::Acquire)
    }

    /// Where a write that must be applied by the writer goes from this replica.
    pub async fn route(&self) -> Result<Route, StoreError> {
        if self.is_writer() {
            return Ok(Route::Here);
        }
        // The CLI's lock has no URL: documents wait for it to finish.
        Ok(match self.store.writer().await? {
            Some((_, url)) if !url.is_empty() => Route::Writer(url),
            _ => Route::NoWriter,
        })
    }

    /// Takes part in the election as `replica`, reached at `url`: tries the lock now and then each second, as
    /// a background service, and once holding it checks each second that it still does.
    pub async fn start(self: &Arc<Self>, replica: String, url: String, services: &Services) {
        let mut lease = self.elect(None, &replica, &url).await;
        let (writer, runtime) = (self.clone(), tokio::runtime::Handle::current());
        services.spawn("writer-election", ELECTION, move |_| {
            lease = runtime.block_on(writer.elect(lease.take(), &replica, &url));
        });
    }

    /// One round of the election: the lease still held, or newly taken; none if lost or taken by another.
    async fn elect(&self, lease: Option<WriterLease>, replica: &str, url: &str) -> Option<WriterLease> {
        match lease {
            Some(mut held) => match held.check().await {
                Ok(()) => Some(held),
                Err(e) => {
                    tracing::error!("lost the writer lock ({e}): no longer writing the collections");
                    self.writing.store(false, Ordering::Release);
                    None
                }
            },
            None => match self.store.try_writer_lease(replica, url).await {
                Ok(Some(held)) => {
                    tracing::info!("this replica ({replica}, {url}) now writes the collections");
                    self.writing.store(true, Ordering::Release);
                    Some(held)
                }
                Ok(None) => None,
                Err(e) => {
                    tracing::warn!("trying the writer lock: {e}");
                    None
                }
            },
        }
    }
}
