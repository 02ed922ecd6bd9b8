//! The heap after a load: mimalloc's purge delay, and memory the server's threads freed going back to the
//! kernel once a load is over (BENCHMARKS.md, "Memory under load").

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// mimalloc's `mi_option_purge_delay` (mimalloc.h, v2; the -sys crate names no constant for it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
const PURGE_DELAY_MS: u64 = 2_000;

/// Freed memory is kept for reuse two seconds before it goes back to the kernel: a forward pass frees and
/// re-allocates tensors of tens of MB, and returning them at once (mimalloc's 10 ms) made the kernel zero
/// fresh pages for every pass (17 % of the time in `clear_page_erms`, 20 % fewer pairs/s); never returning
/// them kept a load peak's memory for good (2.75 GB after a 256-client burst). Busy, the memory is reused;
/// idle, it goes back. Before any other thread starts.
pub fn set_purge_delay() {
    // SAFETY: sets an option before any other thread runs; mimalloc reads options atomically.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS as std::ffi::c_long) };
}

/// Training keeps what it freed until it ends: a step frees and allocates again the same gigabytes of
/// activations and gradients every few seconds, later than the purge delay, and handing them back made the kernel
/// zero fresh pages for a quarter of a step's time (BENCHMARKS.md, "Training every family again"). Its
/// memory stays at a step's peak, which it reaches every step anyway.
pub fn keep_freed_memory() {
    // SAFETY: mimalloc reads options atomically; -1 means never purge.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}

/// Returns the calling thread's freed memory to the kernel now (a thread that ends: its pages would otherwise
/// stay in the allocator's abandoned segments).
pub fn release_thread_memory() {
    // SAFETY: mi_collect only touches the calling thread's heap (and abandoned segments when forced).
    unsafe { libmimalloc_sys::mi_collect(true) };
}

/// The runtime's workers' wake-ups since the watcher last looked.
static WAKEUPS: AtomicU64 = AtomicU64::new(0);
/// Raised once per quiet spell after a busy one: each worker collects its heap when it next parks.
static ROUND: AtomicU64 = AtomicU64::new(0);
thread_local! {
    static COLLECTED: Cell<u64> = const { Cell::new(0) };
}

/// A quiet spell: longer than the purge delay, so that the pages a load freed are due.
const QUIET: Duration = Duration::from_millis(PURGE_DELAY_MS + 1_000);
/// Wake-ups a spell may hold and still be quiet (the watcher's own, a background task's, a stray request).
const QUIET_WAKEUPS: u64 = 50;

/// `on_thread_unpark` of the server's runtime.
pub fn on_worker_unpark() {
    WAKEUPS.fetch_add(1, Ordering::Relaxed);
}

/// `on_thread_park` of the server's runtime: collects this worker's heap once per round.
pub fn on_worker_park() {
    let round = ROUND.load(Ordering::Relaxed);
    COLLECTED.with(|collected| {
        if collected.get() != round {
            collected.set(round);
            release_thread_memory();
        }
    });
}

/// mimalloc hands a thread's due pages back only when that thread next calls it, and a worker parked after a
/// load may not run again for hours; collecting at every park cost 12-21 % of queries/s. So this task, on the
/// server's runtime, waits for a busy spell followed by a quiet one, starts a round and wakes the workers so
/// that each collects as it parks again.
pub async fn return_memory_after_load() {
    let workers = tokio::runtime::Handle::current().metrics().num_workers();
    let mut busy = false;
    loop {
        tokio::time::sleep(QUIET).await;
        if WAKEUPS.swap(0, Ordering::Relaxed) > QUIET_WAKEUPS {
            busy = true;
        } else if busy {
            busy = false;
            ROUND.fetch_add(1, Ordering::Relaxed);
            // Tasks spawned from a worker wake the parked ones to look for work.
            for _ in 0..workers {
                tokio::spawn(async {});
            }
        }
    }
}
