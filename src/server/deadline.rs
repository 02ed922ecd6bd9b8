//! The deadline of the request being handled: set by the middleware around its handler, read where its work
//! is admitted (`AppState`), so that neither imports the other.

use std::future::Future;
use std::time::Instant;

tokio::task_local! {
    /// When the request being handled times out: its engine work is admitted, and its model inputs queued, only
    /// if they can end by then.
    static DEADLINE: Instant;
}

/// The deadline of the request being handled (none for uploads, which have no timeout).
pub(super) fn deadline() -> Option<Instant> {
    DEADLINE.try_with(|d| *d).ok()
}

/// `handled` with `deadline` as its request's deadline.
pub(super) fn within<F: Future>(deadline: Instant, handled: F) -> impl Future<Output = F::Output> {
    DEADLINE.scope(deadline, handled)
}
