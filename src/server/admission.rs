//! Admission to engine work: `server.max_concurrent_work` requests run at once on blocking threads, up to
//! `server.max_waiting_requests` wait (cheaply, as futures), and the rest are refused at once with 429. CPU
//! work and the memory it holds stay bounded whatever the number of clients.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::ApiError;

pub struct Admission {
    permits: Arc<Semaphore>,
    waiting: AtomicUsize,
    max_waiting: usize,
}

impl Admission {
    pub fn new(concurrent: usize, max_waiting: usize) -> Admission {
        Admission { permits: Arc::new(Semaphore::new(concurrent.max(1))), waiting: AtomicUsize::new(0), max_waiting }
    }

    /// A permit to run, at once when one is free, else after waiting in line; 429 `overloaded` when the line
    /// is full.
    pub async fn admit(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        if let Ok(permit) = self.permits.clone().try_acquire_owned() {
            return Ok(permit);
        }
        struct InLine<'a>(&'a AtomicUsize);
        impl Drop for InLine<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let ahead = self.waiting.fetch_add(1, Ordering::AcqRel);
        let _in_line = InLine(&self.waiting);
        if ahead >= self.max_waiting {
            return Err(ApiError::overloaded(format!("{ahead} requests are waiting for the server; retry later"), 1));
        }
        // The semaphore is never closed.
        Ok(self.permits.clone().acquire_owned().await.expect("admission semaphore closed"))
    }

    /// Requests waiting for a permit now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    fn poll_once<F: Future>(future: std::pin::Pin<&mut F>) -> Poll<F::Output> {
        future.poll(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn runs_waits_then_refuses_and_a_freed_permit_goes_to_the_waiter() {
        let admission = Admission::new(1, 1);
        let Poll::Ready(Ok(running)) = poll_once(pin!(admission.admit())) else {
            panic!("a free permit is taken at once")
        };
        let mut waiter = pin!(admission.admit());
        assert!(poll_once(waiter.as_mut()).is_pending(), "the second waits");
        assert_eq!(admission.waiting(), 1);
        let Poll::Ready(Err(refused)) = poll_once(pin!(admission.admit())) else { panic!("the line is full") };
        assert_eq!(refused.code.status().as_u16(), 429);
        assert_eq!(admission.waiting(), 1, "a refused request leaves the line as it was");
        drop(running);
        assert!(matches!(poll_once(waiter.as_mut()), Poll::Ready(Ok(_))), "the waiter runs next");
        assert_eq!(admission.waiting(), 0);
    }

    #[test]
    fn no_line_means_refused_only_when_busy() {
        let admission = Admission::new(2, 0);
        let Poll::Ready(Ok(_a)) = poll_once(pin!(admission.admit())) else { panic!() };
        let Poll::Ready(Ok(_b)) = poll_once(pin!(admission.admit())) else { panic!() };
        assert!(matches!(poll_once(pin!(admission.admit())), Poll::Ready(Err(_))));
    }
}
