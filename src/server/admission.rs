//! Admission to engine work, the one door of every request that runs on the engine (`/search`, `/rerank` and
//! its compatible forms, document reads): `server.max_concurrent_work` requests run at once on blocking
//! threads, the others wait in one line (cheaply, as futures), first come first served, at most
//! `server.max_waiting_requests` of them. A request is let into the line only when its turn and its run can
//! end before its deadline (set when it arrived), by the line's pace: how long requests have been running, which
//! is the model's rate as requests see it, `/batch` topics sharing the model included (they wait in the
//! model's queue, never here, and are never refused). One that cannot is refused at once with 429 and its
//! estimated wait as Retry-After (at most the timeout); one already waiting is refused as soon as the pace
//! says its turn comes too late, and at the latest when its turn has not come by then: a request is refused
//! before it starts rather than started and then timed out. The model's own queue refuses again when the work
//! queued ahead of a request's inputs could not drain in time for them, and holds them back (the request keeping
//! its slot) while they would end too late only by its margin.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::ApiError;

pub struct Admission {
    shared: Arc<Shared>,
}

struct Shared {
    line: Mutex<Line>,
    concurrent: usize,
    max_waiting: usize,
    timeout: Duration,
}

#[derive(Default)]
struct Line {
    running: usize,
    waiters: VecDeque<Waiter>,
    next_id: u64,
    pace: Pace,
}

struct Waiter {
    id: u64,
    deadline: Instant,
    /// `Ok` hands it a running slot (counted in `running` already); `Err` refuses it.
    turn: oneshot::Sender<Result<(), Refused>>,
}

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Refused {
    ahead: usize,
    /// The estimated wait (whole seconds, at least 1, at most the timeout).
    retry_after_s: u64,
    /// The line was full, rather than too slow for the deadline.
    full: bool,
}

/// How long requests run, from those that finished their work: an average that follows recent load (requests
/// that ran while the model was busy take longer, and the next ones are judged by them). It is forgotten once
/// no request has finished for a timeout's length: the next burst may bring other work, and is judged by its own
/// runs (until then its requests wait in line, refused as soon as those runs say their turn comes too late).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Pace {
    run_s: Option<f64>,
    seen: Option<Instant>,
}

impl Pace {
    /// The weight of the newest run in the average.
    const RECENT: f64 = 0.3;

    fn observe(&mut self, ran: Duration, now: Instant, timeout: Duration) {
        *self = self.current(now, timeout);
        let ran = ran.as_secs_f64();
        self.run_s = Some(self.run_s.map_or(ran, |avg| avg + Self::RECENT * (ran - avg)));
        self.seen = Some(now);
    }

    /// The pace, unless it is too old to say anything of the requests arriving now.
    fn current(self, now: Instant, timeout: Duration) -> Pace {
        match self.seen {
            Some(seen) if now.duration_since(seen) <= timeout => self,
            _ => Pace::default(),
        }
    }

    /// When a request with `ahead` others before it in line would start: slots free at `concurrent` per run
    /// time. None before any run was seen.
    fn start(&self, now: Instant, ahead: usize, concurrent: usize) -> Option<Instant> {
        let run = self.run_s?;
        Some(now + Duration::from_secs_f64(run * (ahead + 1) as f64 / concurrent as f64))
    }

    /// Whether a request that starts at `start` ends before `deadline`, leaving a tenth of the timeout for its
    /// answer to be written.
    fn ends_in_time(&self, start: Instant, deadline: Instant, timeout: Duration) -> bool {
        let run = Duration::from_secs_f64(self.run_s.unwrap_or(0.0));
        start + run + timeout / 10 <= deadline
    }
}

/// Whole seconds to wait, between 1 and the timeout's.
fn retry_after(wait: Duration, timeout: Duration) -> u64 {
    wait.min(timeout).as_secs_f64().ceil().max(1.0) as u64
}

/// A running slot, handed back when dropped. `finished` says the work was done, so that its time counts in
/// the pace (work that failed, was refused by the model's queue or cancelled says nothing of it).
pub struct Permit {
    shared: Arc<Shared>,
    started: Instant,
    finished: bool,
}

impl Permit {
    pub fn finished(mut self) {
        self.finished = true;
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let ran = self.finished.then(|| self.started.elapsed());
        self.shared.release(ran);
    }
}

impl Admission {
    pub fn new(concurrent: usize, max_waiting: usize, timeout: Duration) -> Admission {
        let shared = Shared { line: Mutex::default(), concurrent: concurrent.max(1), max_waiting, timeout };
        Admission { shared: Arc::new(shared) }
    }

    /// A slot to run work that must end by `deadline`: at once when one is free and nobody waits, else after
    /// waiting in line; 429 `overloaded` when the line is full or the turn would come too late.
    pub async fn admit(&self, deadline: Instant) -> Result<Permit, ApiError> {
        let shared = &self.shared;
        let permit = || Permit { shared: shared.clone(), started: Instant::now(), finished: false };
        let (id, turn) = {
            let mut line = shared.line.lock();
            let now = Instant::now();
            if line.running < shared.concurrent && line.waiters.is_empty() {
                line.running += 1;
                return Ok(permit());
            }
            let ahead = line.waiters.len();
            let pace = line.pace.current(now, shared.timeout);
            let start = pace.start(now, ahead, shared.concurrent);
            let wait = start.map_or(Duration::ZERO, |s| s - now);
            let retry_after_s = retry_after(wait, shared.timeout);
            if ahead >= shared.max_waiting {
                return Err(Refused { ahead, retry_after_s, full: true }.into());
            }
            if start.is_some_and(|start| !pace.ends_in_time(start, deadline, shared.timeout)) {
                return Err(Refused { ahead, retry_after_s, full: false }.into());
            }
            let (tx, rx) = oneshot::channel();
            let id = line.next_id;
            line.next_id += 1;
            line.waiters.push_back(Waiter { id, deadline, turn: tx });
            (id, rx)
        };
        // Leaves the line when the request goes away, and hands back a slot given to it meanwhile.
        struct InLine<'a> {
            shared: &'a Shared,
            id: u64,
            turn: oneshot::Receiver<Result<(), Refused>>,
            done: bool,
        }
        impl Drop for InLine<'_> {
            fn drop(&mut self) {
                if self.done {
                    return;
                }
                let mut line = self.shared.line.lock();
                if let Some(at) = line.waiters.iter().position(|w| w.id == self.id) {
                    line.waiters.remove(at);
                } else if let Ok(Ok(())) = self.turn.try_recv() {
                    drop(line);
                    self.shared.release(None);
                }
            }
        }
        let mut in_line = InLine { shared, id, turn, done: false };
        // At the latest when the request could no longer end in time, even if nothing finished meanwhile.
        let last_call = deadline.checked_sub(shared.timeout / 10).unwrap_or(deadline);
        match tokio::time::timeout_at(last_call.into(), &mut in_line.turn).await {
            Ok(Ok(answer)) => {
                in_line.done = true;
                answer.map(|()| permit()).map_err(ApiError::from)
            }
            // Not answered in time (or the server is going down).
            _ => {
                let ahead = shared.line.lock().waiters.iter().position(|w| w.id == id).unwrap_or(0);
                Err(Refused { ahead, retry_after_s: retry_after(shared.timeout, shared.timeout), full: false }.into())
            }
        }
    }

    /// Requests waiting for a slot now.
    pub fn waiting(&self) -> usize {
        self.shared.line.lock().waiters.len()
    }
}

impl Shared {
    /// A slot handed back: the next in line takes it, and those whose turn now comes too late are refused.
    fn release(&self, ran: Option<Duration>) {
        let mut line = self.line.lock();
        line.running -= 1;
        let (now, concurrent, timeout) = (Instant::now(), self.concurrent, self.timeout);
        if let Some(ran) = ran {
            line.pace.observe(ran, now, timeout);
        }
        let pace = line.pace.current(now, timeout);
        let run = Duration::from_secs_f64(pace.run_s.unwrap_or(0.0));
        while line.running < concurrent {
            let Some(waiter) = line.waiters.pop_front() else { break };
            if !pace.ends_in_time(now, waiter.deadline, timeout) {
                let _ =
                    waiter.turn.send(Err(Refused { ahead: 0, retry_after_s: retry_after(run, timeout), full: false }));
            } else if waiter.turn.send(Ok(())).is_ok() {
                line.running += 1;
            }
        }
        let mut ahead = 0;
        for waiter in std::mem::take(&mut line.waiters) {
            match pace.start(now, ahead, concurrent) {
                Some(start) if !pace.ends_in_time(start, waiter.deadline, timeout) => {
                    let retry_after_s = retry_after(start - now, timeout);
                    // The waiter may be gone already; it leaves the line either way.
                    let _ = waiter.turn.send(Err(Refused { ahead, retry_after_s, full: false }));
                }
                _ => {
                    ahead += 1;
                    line.waiters.push_back(waiter);
                }
            }
        }
    }
}

impl From<Refused> for ApiError {
    fn from(r: Refused) -> ApiError {
        let message = match r.full {
            true => format!("{} requests are waiting for the server; retry later", r.ahead),
            false => format!(
                "{} requests are ahead and this one would not end within server.request_timeout_ms; retry in {} s",
                r.ahead, r.retry_after_s
            ),
        };
        ApiError::overloaded(message, r.retry_after_s)
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

    const TIMEOUT: Duration = Duration::from_secs(30);

    /// A runtime for the line's timers (never driven: the tests' deadlines are not reached).
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap()
    }

    fn later() -> Instant {
        Instant::now() + TIMEOUT
    }

    #[test]
    fn runs_waits_then_refuses_and_a_freed_permit_goes_to_the_waiter() {
        let runtime = runtime();
        let _in = runtime.enter();
        let admission = Admission::new(1, 1, TIMEOUT);
        let Poll::Ready(Ok(running)) = poll_once(pin!(admission.admit(later()))) else {
            panic!("a free permit is taken at once")
        };
        let mut waiter = pin!(admission.admit(later()));
        assert!(poll_once(waiter.as_mut()).is_pending(), "the second waits");
        assert_eq!(admission.waiting(), 1);
        let Poll::Ready(Err(refused)) = poll_once(pin!(admission.admit(later()))) else { panic!("the line is full") };
        assert_eq!(refused.code.status().as_u16(), 429);
        assert_eq!(admission.waiting(), 1, "a refused request leaves the line as it was");
        drop(running);
        assert!(matches!(poll_once(waiter.as_mut()), Poll::Ready(Ok(_))), "the waiter runs next");
        assert_eq!(admission.waiting(), 0);
    }

    #[test]
    fn no_line_means_refused_only_when_busy() {
        let runtime = runtime();
        let _in = runtime.enter();
        let admission = Admission::new(2, 0, TIMEOUT);
        let Poll::Ready(Ok(_a)) = poll_once(pin!(admission.admit(later()))) else { panic!() };
        let Poll::Ready(Ok(_b)) = poll_once(pin!(admission.admit(later()))) else { panic!() };
        assert!(matches!(poll_once(pin!(admission.admit(later()))), Poll::Ready(Err(_))));
    }

    #[test]
    fn a_waiter_that_goes_away_leaves_the_line_and_its_slot_goes_back() {
        let runtime = runtime();
        let _in = runtime.enter();
        let admission = Admission::new(1, 5, TIMEOUT);
        let Poll::Ready(Ok(running)) = poll_once(pin!(admission.admit(later()))) else { panic!() };
        {
            let mut gone = pin!(admission.admit(later()));
            assert!(poll_once(gone.as_mut()).is_pending());
            assert_eq!(admission.waiting(), 1);
        }
        assert_eq!(admission.waiting(), 0, "a dropped waiter leaves the line");
        // A slot handed to a waiter that goes away before taking it comes back.
        {
            let mut handed = pin!(admission.admit(later()));
            assert!(poll_once(handed.as_mut()).is_pending());
            drop(running);
        }
        assert!(matches!(poll_once(pin!(admission.admit(later()))), Poll::Ready(Ok(_))), "the slot is free again");
    }

    /// The running request is said to have run `secs`, and finishes.
    fn ran(mut running: Permit, secs: u64) {
        running.started -= Duration::from_secs(secs);
        running.finished();
    }

    /// One slot, and a pace of runs of `secs` (two of them seen).
    fn paced(secs: u64) -> Admission {
        let admission = Admission::new(1, 100, TIMEOUT);
        for _ in 0..2 {
            let Poll::Ready(Ok(running)) = poll_once(pin!(admission.admit(later()))) else { panic!() };
            ran(running, secs);
        }
        admission
    }

    #[test]
    fn once_runs_are_timed_a_turn_that_would_come_too_late_is_refused_at_once_with_the_wait() {
        let runtime = runtime();
        let _in = runtime.enter();
        let admission = paced(10);
        assert_eq!(admission.shared.line.lock().pace.run_s.map(f64::round), Some(10.0));
        // Runs of 10 s: a second request's turn comes in 10 s and it ends in 20, within 30 s less a tenth; a
        // third's would end in 30 s: too late.
        let Poll::Ready(Ok(_running)) = poll_once(pin!(admission.admit(later()))) else { panic!() };
        let mut second = pin!(admission.admit(later()));
        assert!(poll_once(second.as_mut()).is_pending(), "its turn comes in time");
        let Poll::Ready(Err(third)) = poll_once(pin!(admission.admit(later()))) else {
            panic!("refused at once, not left to time out")
        };
        assert_eq!(third.code.status().as_u16(), 429);
        assert!((20..=21).contains(&third.retry_after_s), "the wait for its turn, 20 s: {third:?}");
        assert_eq!(admission.waiting(), 1);
    }

    #[test]
    fn a_waiter_whose_turn_now_comes_too_late_is_refused_when_the_pace_slows() {
        let runtime = runtime();
        let _in = runtime.enter();
        let admission = paced(1);
        let Poll::Ready(Ok(running)) = poll_once(pin!(admission.admit(later()))) else { panic!() };
        let (mut second, mut third) = (pin!(admission.admit(later())), pin!(admission.admit(later())));
        assert!(poll_once(second.as_mut()).is_pending() && poll_once(third.as_mut()).is_pending());
        // A run of 60 s brings the pace to 18.7 s: the second still ends in time, the third's turn would come
        // in 19 s and it would end past its deadline.
        ran(running, 60);
        assert!(matches!(poll_once(second.as_mut()), Poll::Ready(Ok(_))), "the second runs");
        let Poll::Ready(Err(refused)) = poll_once(third.as_mut()) else { panic!("the third is refused") };
        assert_eq!(refused.retry_after_s, 19, "{refused:?}");
        assert_eq!(admission.waiting(), 0);
    }

    #[test]
    fn a_pace_no_request_confirmed_for_a_timeout_is_forgotten() {
        let (mut pace, now) = (Pace::default(), Instant::now());
        pace.observe(Duration::from_secs(10), now, TIMEOUT);
        assert_eq!(pace.current(now + TIMEOUT, TIMEOUT).run_s, Some(10.0));
        let later = now + TIMEOUT + Duration::from_millis(1);
        assert_eq!(pace.current(later, TIMEOUT), Pace::default());
        pace.observe(Duration::from_secs(2), later, TIMEOUT);
        assert_eq!(pace.run_s, Some(2.0), "a new run starts the average afresh");
    }

    #[test]
    fn retry_after_is_whole_seconds_within_the_timeout() {
        assert_eq!(retry_after(Duration::from_millis(10), TIMEOUT), 1);
        assert_eq!(retry_after(Duration::from_millis(2_100), TIMEOUT), 3);
        assert_eq!(retry_after(Duration::from_secs(95), TIMEOUT), 30);
    }
}
