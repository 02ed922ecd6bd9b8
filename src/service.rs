//! Background services: loops on threads of their own (the catalog's sync and the replica's pulls, the cluster's
//! heartbeat), each one's tick every period. They call into the runtime (`Handle::block_on`), so at shutdown
//! they are told to stop and waited for while the runtime still runs: a tick cut by the runtime's end panicked
//! ("A Tokio 1.x context was found, but it is being shutdown").

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

#[derive(Clone, Default)]
pub struct Services {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    stopping: AtomicBool,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// How often a waiting service looks whether it is told to stop.
const WAKE: Duration = Duration::from_millis(20);

impl Services {
    /// Runs `tick` (given the tick's number, from 1) every `period` on a thread named `name`, until `stop`.
    pub fn spawn(&self, name: &str, period: Duration, mut tick: impl FnMut(u64) + Send + 'static) {
        let services = self.clone();
        let run = move || {
            for n in 1u64.. {
                if services.wait(period) {
                    return;
                }
                tick(n);
            }
        };
        match std::thread::Builder::new().name(name.into()).spawn(run) {
            Ok(thread) => self.inner.threads.lock().push(thread),
            Err(e) => tracing::error!("starting {name}: {e}"),
        }
    }

    /// Waits `period`; whether the services are told to stop meanwhile.
    fn wait(&self, period: Duration) -> bool {
        let until = Instant::now() + period;
        while !self.inner.stopping.load(Ordering::Acquire) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            std::thread::sleep(left.min(WAKE));
        }
        true
    }

    /// Tells every service to stop and waits until each has finished its tick (call it from a blocking thread,
    /// while the runtime runs).
    pub fn stop(&self) {
        self.inner.stopping.store(true, Ordering::Release);
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
}
