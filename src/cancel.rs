//! Cancelling work a request or a batch job started: a flag set when its requester is gone (client disconnected,
//! request timed out, job cancelled), and the deadline it was given. Long work checks it where it loops: BM25 per
//! term and segment, RM3 per feedback document, the model's queue (which also refuses work whose wait would pass
//! the deadline).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug, Clone, Default)]
pub struct Cancel {
    flag: Arc<AtomicBool>,
    deadline: Option<Instant>,
}

impl Cancel {
    /// Work that is also over at `deadline`.
    pub fn until(deadline: Instant) -> Cancel {
        Cancel { deadline: Some(deadline), ..Cancel::default() }
    }

    pub fn cancel(&self) {
        self.flag.store(true, Ordering::Release);
    }

    /// Cancelled, or past the deadline.
    pub fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::Acquire) || self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_clone_sees_the_cancel_and_a_deadline_ends_the_work() {
        let cancel = Cancel::default();
        let seen = cancel.clone();
        assert!(!seen.is_cancelled());
        cancel.cancel();
        assert!(seen.is_cancelled());
        let past = Cancel::until(Instant::now() - Duration::from_millis(1));
        assert!(past.is_cancelled() && !past.flag.load(Ordering::Relaxed));
        assert!(!Cancel::until(Instant::now() + Duration::from_secs(60)).is_cancelled());
    }
}
