//! Background services, all run one way: each a loop on a thread of its own that calls its tick, then waits
//! (its period, or until rung) before the next, as meilisearch's scheduler runs one `tick()` loop. The
//! catalog's sync and the replica's pulls, the cluster's heartbeat, the writer's election, the batch workers,
//! the collection tasks' worker and the query log's writer are such services. A tick does blocking work and
//! reaches the runtime through `Handle::block_on`, so at shutdown the services are told to stop and waited for
//! while the runtime still runs (a tick cut by the runtime's end panicked: "A Tokio 1.x context was found, but
//! it is being shutdown"). A tick that panics is logged with the service's name, and the service goes on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

#[derive(Clone, Default)]
pub struct Services {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    stopping: AtomicBool,
    threads: Mutex<Vec<JoinHandle<()>>>,
    bells: Mutex<Vec<Bell>>,
}

/// What a worker's tick found: work (the next tick follows at once), or none for now (the next one after
/// this long, or when the worker is rung).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    Now,
    After(Duration),
}

/// Wakes a waiting service before its wait is over (a job or a task queued here).
#[derive(Clone, Default)]
pub struct Bell(Arc<(Mutex<bool>, Condvar)>);

impl Bell {
    pub fn ring(&self) {
        *self.0 .0.lock() = true;
        self.0 .1.notify_all();
    }

    /// Waits `wait`, or until rung or `stopping`; whether the service is to stop.
    fn wait(&self, wait: Duration, stopping: &AtomicBool) -> bool {
        let until = Instant::now() + wait;
        let mut rung = self.0 .0.lock();
        loop {
            if stopping.load(Ordering::Acquire) {
                return true;
            }
            if std::mem::take(&mut *rung) || self.0 .1.wait_until(&mut rung, until).timed_out() {
                return stopping.load(Ordering::Acquire);
            }
        }
    }
}

impl Services {
    /// Runs `tick` (given the tick's number, from 1) every `period` on a thread named `name`, until `stop`.
    pub fn spawn(&self, name: &str, period: Duration, mut tick: impl FnMut(u64) + Send + 'static) {
        let mut n = 0;
        self.spawn_worker(name, period, move || {
            n += 1;
            tick(n);
            Next::After(period)
        });
    }

    /// Runs `tick` on a thread named `name` after `first`, then as each tick says, until `stop`; the bell
    /// that wakes it early.
    pub fn spawn_worker(&self, name: &str, first: Duration, mut tick: impl FnMut() -> Next + Send + 'static) -> Bell {
        let bell = Bell::default();
        self.inner.bells.lock().push(bell.clone());
        let (inner, own, service) = (self.inner.clone(), bell.clone(), name.to_string());
        let run = move || {
            let mut wait = first;
            while !own.wait(wait, &inner.stopping) {
                wait = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(&mut tick)) {
                    Ok(Next::Now) => Duration::ZERO,
                    Ok(Next::After(wait)) => wait,
                    // Its state is what it was when it panicked: one tick lost, the service goes on.
                    Err(_) => {
                        tracing::error!("{service}: a tick panicked (tried again in a second)");
                        Duration::from_secs(1)
                    }
                };
            }
        };
        match std::thread::Builder::new().name(name.into()).spawn(run) {
            Ok(thread) => self.inner.threads.lock().push(thread),
            Err(e) => tracing::error!("starting {name}: {e}"),
        }
        bell
    }

    /// Tells every service to stop and waits until each has finished its tick (call it from a blocking thread,
    /// while the runtime runs).
    pub fn stop(&self) {
        self.inner.stopping.store(true, Ordering::Release);
        for bell in self.inner.bells.lock().iter() {
            bell.ring();
        }
        for thread in std::mem::take(&mut *self.inner.threads.lock()) {
            let name = thread.thread().name().unwrap_or_default().to_string();
            if thread.join().is_err() {
                tracing::error!("{name} panicked");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn services_tick_until_stopped_and_stop_waits_for_the_tick_in_hand() {
        let services = Services::default();
        let (ticks, finished) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let (t, f) = (ticks.clone(), finished.clone());
        services.spawn("test-service", Duration::from_millis(1), move |_| {
            t.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(50));
            f.store(true, Ordering::SeqCst);
        });
        while ticks.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        services.stop();
        assert!(finished.load(Ordering::SeqCst), "stop returned before the tick in hand ended");
        let after = ticks.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(ticks.load(Ordering::SeqCst), after, "a tick after stop");
    }

    #[test]
    fn a_worker_ticks_again_at_once_after_work_when_rung_and_after_a_panicked_tick() {
        let services = Services::default();
        let ticks = Arc::new(AtomicU64::new(0));
        let t = ticks.clone();
        // Work for three ticks, then a panic, then idle for an hour unless rung.
        let bell =
            services.spawn_worker("test-worker", Duration::ZERO, move || match t.fetch_add(1, Ordering::SeqCst) {
                0..=2 => Next::Now,
                3 => panic!("a tick that panics"),
                _ => Next::After(Duration::from_secs(3600)),
            });
        let until = |n: u64| {
            let started = Instant::now();
            while ticks.load(Ordering::SeqCst) < n {
                assert!(started.elapsed() < Duration::from_secs(10), "waiting for tick {n}");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        // The panicked tick's service goes on a second later; then it idles until rung.
        until(5);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(ticks.load(Ordering::SeqCst), 5, "idle for its wait");
        bell.ring();
        until(6);
        let started = Instant::now();
        services.stop();
        assert!(started.elapsed() < Duration::from_secs(5), "stop waits for no idle wait");
    }
}
