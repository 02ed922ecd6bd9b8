//! Open connections, at most `server.max_connections`. New connections are always accepted, so the listen
//! backlog never fills and drops clients; when every slot is taken, one with no request in flight is closed to
//! make room, as nginx drains its reusable connections when it runs out: first the oldest of those that have
//! not yet sent a whole request (a slow client's), then the one idle longest after answering (a keep-alive
//! one, which its client would find closed when it next uses it); none before its grace (`GRACE`), the time a
//! well-behaved client needs to send its request. A client that sends its request at once is
//! served whatever number of slow clients hold connections or reopen them as soon as they are closed: those
//! push each other out. Only when every connection has a request in flight does a new one wait.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use parking_lot::Mutex;
use tokio::sync::Notify;

pub struct Connections {
    shared: Arc<Shared>,
}

/// How long a new connection, or one that has just answered, is kept whatever the pressure: time for its
/// client to send a request (a well-behaved client sends one at once; a slow client can be closed after).
const GRACE: Duration = Duration::from_millis(50);

struct Shared {
    max: usize,
    grace: Duration,
    open: Mutex<Open>,
    /// A connection ended (a slot may be free).
    ended: Notify,
    epoch: Instant,
}

#[derive(Default)]
struct Open {
    next_id: u64,
    connections: HashMap<u64, Arc<Connection>>,
}

/// One open connection's state.
struct Connection {
    in_flight: AtomicUsize,
    /// Whether it has received a whole request.
    served: AtomicBool,
    /// Since when it has had no request in flight (ms since `Shared::epoch`).
    idle_since_ms: AtomicU64,
    /// Told to close to make room.
    close: Notify,
}

impl Connections {
    pub fn new(max: usize) -> Connections {
        Connections::with_grace(max, GRACE)
    }

    fn with_grace(max: usize, grace: Duration) -> Connections {
        let open = Mutex::default();
        let shared = Shared { max: max.max(1), grace, open, ended: Notify::new(), epoch: Instant::now() };
        Connections { shared: Arc::new(shared) }
    }

    /// Room for one more connection: at once below the limit, else by closing one with no request in flight
    /// (once it has had its grace), else once a connection ends.
    pub async fn slot(&self) -> Slot {
        let shared = &self.shared;
        loop {
            let ended = shared.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            let graced = {
                let mut open = shared.open.lock();
                let now = shared.now_ms();
                let grace = shared.grace.as_millis() as u64;
                // Connections with no request in flight, and since when (its grace ends `grace` after).
                let idle = |c: &Connection| {
                    let since = c.idle_since_ms.load(Ordering::Acquire);
                    (c.in_flight.load(Ordering::Acquire) == 0).then_some(since)
                };
                if open.connections.len() >= shared.max {
                    let first = open
                        .connections
                        .iter()
                        .filter_map(|(id, c)| Some((c.served.load(Ordering::Acquire), idle(c)?, *id)))
                        .filter(|&(_, since, _)| since + grace <= now)
                        .min()
                        .map(|(_, _, id)| id);
                    if let Some(connection) = first.and_then(|id| open.connections.remove(&id)) {
                        connection.close.notify_one();
                    }
                }
                if open.connections.len() < shared.max {
                    let id = open.next_id;
                    open.next_id += 1;
                    let connection = Arc::new(Connection {
                        in_flight: AtomicUsize::new(0),
                        served: AtomicBool::new(false),
                        idle_since_ms: AtomicU64::new(now),
                        close: Notify::new(),
                    });
                    open.connections.insert(id, connection.clone());
                    return Slot { shared: shared.clone(), id, connection };
                }
                open.connections.values().filter_map(|c| idle(c)).min().map(|since| since + grace - now)
            };
            match graced {
                Some(ms) => {
                    let _ = tokio::time::timeout(Duration::from_millis(ms), ended).await;
                }
                None => ended.await,
            }
        }
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.shared.open.lock().connections.len()
    }
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
}

/// A connection's slot, given back when dropped.
pub struct Slot {
    shared: Arc<Shared>,
    id: u64,
    connection: Arc<Connection>,
}

impl Slot {
    /// Runs `serving` (the connection) until it ends, or until the connection is closed to make room.
    pub async fn serve<F: std::future::Future>(&self, serving: F) -> Option<F::Output> {
        tokio::select! {
            output = serving => Some(output),
            () = self.connection.close.notified() => None,
        }
    }

    /// Marks a request in flight on this connection until the returned guard drops (with its response's body,
    /// once written).
    pub fn busy(&self) -> Busy {
        self.connection.in_flight.fetch_add(1, Ordering::AcqRel);
        self.connection.served.store(true, Ordering::Release);
        Busy { shared: self.shared.clone(), connection: self.connection.clone() }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.shared.open.lock().connections.remove(&self.id);
        self.shared.ended.notify_waiters();
    }
}

pub struct Busy {
    shared: Arc<Shared>,
    connection: Arc<Connection>,
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.connection.idle_since_ms.store(self.shared.now_ms(), Ordering::Release);
        self.connection.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its connection busy until it has been written (or dropped).
pub struct Tracked {
    pub body: Body,
    /// Held, not read: dropped with the body.
    pub _busy: Busy,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::pin;
    use std::task::Waker;

    fn poll_once<F: Future>(future: Pin<&mut F>) -> Poll<F::Output> {
        future.poll(&mut Context::from_waker(Waker::noop()))
    }

    fn slot(connections: &Connections) -> Poll<Slot> {
        poll_once(pin!(connections.slot()))
    }

    #[test]
    fn when_full_the_connection_idle_longest_makes_room_and_busy_ones_are_kept() {
        let connections = Connections::with_grace(2, Duration::ZERO);
        let Poll::Ready(first) = slot(&connections) else { panic!("room") };
        let Poll::Ready(second) = slot(&connections) else { panic!("room") };
        let busy = first.busy();
        // Full: the second (idle, as a slow client's is) is closed for the third; the first is serving.
        let Poll::Ready(third) = slot(&connections) else { panic!("room made") };
        assert_eq!(connections.open(), 2);
        assert!(poll_once(pin!(second.serve(std::future::pending::<()>()))).is_ready(), "the second was closed");
        assert!(poll_once(pin!(first.serve(std::future::pending::<()>()))).is_pending(), "the busy one stays");
        // Both now busy: a new connection waits until one ends.
        let _also_busy = third.busy();
        let mut fourth = pin!(connections.slot());
        assert!(poll_once(fourth.as_mut()).is_pending(), "every connection is serving");
        drop(busy);
        drop(second);
        let Poll::Ready(_fourth) = poll_once(fourth.as_mut()) else { panic!("the first, idle again, made room") };
        assert_eq!(connections.open(), 2);
    }

    #[test]
    fn a_connection_that_never_sent_a_request_goes_before_an_idle_keep_alive_one() {
        let connections = Connections::with_grace(2, Duration::ZERO);
        let Poll::Ready(keep_alive) = slot(&connections) else { panic!() };
        drop(keep_alive.busy()); // one request answered
        let Poll::Ready(slow) = slot(&connections) else { panic!() };
        let Poll::Ready(_new) = slot(&connections) else { panic!() };
        assert!(poll_once(pin!(slow.serve(std::future::pending::<()>()))).is_ready(), "the slow one was closed");
        assert!(poll_once(pin!(keep_alive.serve(std::future::pending::<()>()))).is_pending(), "though newer");
    }

    #[test]
    fn a_connection_in_its_grace_is_kept_and_a_new_one_waits() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let _in = runtime.enter();
        let connections = Connections::with_grace(1, Duration::from_secs(3600));
        let Poll::Ready(young) = slot(&connections) else { panic!() };
        assert!(slot(&connections).is_pending(), "no room yet");
        assert!(poll_once(pin!(young.serve(std::future::pending::<()>()))).is_pending(), "the young one is kept");
    }

    #[test]
    fn an_ended_connection_frees_its_slot() {
        let connections = Connections::with_grace(1, Duration::ZERO);
        let Poll::Ready(only) = slot(&connections) else { panic!() };
        let _busy = only.busy();
        let mut next = pin!(connections.slot());
        assert!(poll_once(next.as_mut()).is_pending());
        drop(only);
        assert!(poll_once(next.as_mut()).is_ready());
    }
}
