//! Test hooks: named points in long work where a test can hold the process, so that it kills or watches it at
//! a known place instead of racing a clock. `LONGRANK_TEST_HOLD=NAME:N` holds at the Nth pass through the point
//! NAME for good; `LONGRANK_TEST_HOLD=NAME:N:FILE` holds there until FILE exists. `LONGRANK_TEST_SLOW=NAME:MS`
//! sleeps MS milliseconds at every pass through NAME (a tiny model as slow as a large one, whatever the
//! machine); `LONGRANK_TEST_FAIL=NAME:N` fails the Nth pass through NAME (`batch.commit`: the store's error).
//! Unset (always, outside tests), a point costs one check of a value read once.
//!
//! Points: `index.commit` (after each commit of an index build), `train.checkpoint` (after each checkpoint of
//! a model in training), `model.batch` (before each forward pass of a model's inference thread), `batch.topic`
//! (after each topic a batch job stores), `batch.commit` (a batch topic run, before its commit: a test stops the
//! process there to let its lease run out), `task.start` (a task marked running, before it writes anything; not
//! a collection's deletion), `publish.object` (after each object a publish uploads, before its version is
//! recorded), `tasks.take_over` (a writer taking over the tasks, before it requeues them or removes uploads),
//! `query_log.write` (the query log's writer with a batch taken, before it writes it), `neighbours.checkpoint`
//! (a vector index's checkpoint written beside the index, before it is renamed into place).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

const VAR: &str = "LONGRANK_TEST_HOLD";

struct Hold {
    point: String,
    at: u64,
    until: Option<std::path::PathBuf>,
    passes: AtomicU64,
}

fn hold() -> Option<&'static Hold> {
    static HOLD: OnceLock<Option<Hold>> = OnceLock::new();
    HOLD.get_or_init(|| {
        let spec = std::env::var(VAR).ok()?;
        let mut parts = spec.splitn(3, ':');
        let point = parts.next()?.to_string();
        let at = parts.next()?.parse().ok()?;
        let until = parts.next().map(std::path::PathBuf::from);
        Some(Hold { point, at, until, passes: AtomicU64::new(0) })
    })
    .as_ref()
}

/// `point` in async code: a hold waits on a blocking thread, never on a runtime worker (a task the worker had
/// just queued, such as a database connection going back to its pool, would wait with it).
pub async fn reached(name: &'static str) {
    if hold().is_some_and(|h| h.point == name) {
        let _ = tokio::task::spawn_blocking(move || point(name)).await;
    }
}

/// `NAME:NUMBER` from an environment variable.
fn named_number(var: &str) -> Option<(String, u64)> {
    let spec = std::env::var(var).ok()?;
    let (point, number) = spec.split_once(':')?;
    Some((point.to_string(), number.parse().ok()?))
}

/// A named point of slow work: sleeps here when a test asks for it (`LONGRANK_TEST_SLOW`), inside the work's
/// own timing, as a slower machine would.
pub fn slow_point(name: &str) {
    static SLOW: OnceLock<Option<(String, u64)>> = OnceLock::new();
    if let Some((_, ms)) = SLOW.get_or_init(|| named_number("LONGRANK_TEST_SLOW")).as_ref().filter(|(p, _)| p == name) {
        std::thread::sleep(Duration::from_millis(*ms));
    }
}

/// Whether this pass through the named point fails (`LONGRANK_TEST_FAIL=NAME:N`: the Nth), as the store does
/// when a stalled process comes back past its pool's timeout.
pub fn fails(name: &str) -> bool {
    static FAIL: OnceLock<Option<(String, u64)>> = OnceLock::new();
    static PASSES: AtomicU64 = AtomicU64::new(0);
    match FAIL.get_or_init(|| named_number("LONGRANK_TEST_FAIL")) {
        Some((point, at)) if point == name => PASSES.fetch_add(1, Ordering::Relaxed) + 1 == *at,
        _ => false,
    }
}

/// A named point: holds here when a test asks for it (see the module).
pub fn point(name: &str) {
    let Some(hold) = hold().filter(|h| h.point == name) else { return };
    if hold.passes.fetch_add(1, Ordering::Relaxed) + 1 != hold.at {
        return;
    }
    tracing::warn!("{VAR}: holding at {name}");
    while hold.until.as_ref().is_none_or(|file| !file.exists()) {
        std::thread::sleep(Duration::from_millis(10));
    }
}
