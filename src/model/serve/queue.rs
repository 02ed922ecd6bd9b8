//! One inference thread per loaded model, fed from a queue, as text-embeddings-inference serves: every
//! concurrent request's inputs wait in one queue, the thread takes them in arrival order into batches bounded
//! by a padded-token budget (`max_batch_tokens`), sorted by length so padding stays small, and hands each
//! output back to its request. Callers block on their own job, never the async runtime (they run on blocking
//! threads). A full queue refuses new work with a retry estimate; a cancelled job's queued inputs are dropped.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::cancel::Cancel;
use crate::histogram::{self, Histogram};
use crate::model::{Encoded, ModelError};

/// Where a job's time went.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct JobTiming {
    /// From submission until the first batch holding one of its inputs started.
    pub queue: Duration,
    /// Wall time of the batches that held its inputs.
    pub inference: Duration,
}

/// A job that did not finish (its request went away, or the model failed): the error, and the outputs of the
/// batches that finished before it (in input order), which the caller keeps so a retry gets further.
#[derive(Debug)]
pub struct Unfinished {
    pub error: ModelError,
    pub outputs: Vec<Option<Vec<f32>>>,
}

impl From<ModelError> for Unfinished {
    fn from(error: ModelError) -> Unfinished {
        Unfinished { error, outputs: Vec::new() }
    }
}

impl From<Unfinished> for ModelError {
    fn from(unfinished: Unfinished) -> ModelError {
        unfinished.error
    }
}

/// Runs a batch of inputs through the model: one output vector per input.
pub type Forward = dyn Fn(&[Encoded]) -> Result<Vec<Vec<f32>>, ModelError> + Send + Sync;

pub struct Queue {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    max_batch_tokens: usize,
    max_queued: usize,
}

#[derive(Default)]
struct State {
    pending: VecDeque<Item>,
    shutdown: bool,
    /// Inputs per second over recent batches (for Retry-After), and in the last one.
    rate: f64,
    last_rate: f64,
    stats: BatchStats,
}

impl State {
    /// Whether `n` inputs behind `ahead` others would end past `deadline`, at the model's recent rate or its
    /// last batch's, whichever is slower (the average lags a model that slows), taken a tenth slower still
    /// (batches differ in length). Behind nothing, work runs whatever its size (what it finishes is kept for a
    /// retry).
    fn ends_too_late(&self, ahead: usize, n: usize, deadline: Option<Instant>) -> bool {
        ahead > 0 && self.passes(deadline, 1.1 * (ahead + n) as f64)
    }

    /// Whether `n` inputs behind `ahead` others cannot end by `deadline` however it waits: the work ahead at the
    /// model's pace, drained at once, and its own with the margin, pass it.
    fn hopeless(&self, ahead: usize, n: usize, deadline: Option<Instant>) -> bool {
        self.passes(deadline, ahead as f64 + 1.1 * n as f64)
    }

    /// Whether `inputs` begun now, at the slower of the recent and the last batch's rate, end past `deadline`
    /// (never, with no deadline or no pace measured yet).
    fn passes(&self, deadline: Option<Instant>, inputs: f64) -> bool {
        let rate = self.rate.min(self.last_rate);
        match deadline {
            Some(deadline) if rate > 0.0 => Instant::now() + Duration::from_secs_f64(inputs / rate) > deadline,
            _ => false,
        }
    }

    /// The refusal of a request with `ahead` inputs before it: Retry-After their drain time.
    fn overloaded(&self, ahead: usize) -> ModelError {
        let wait = if self.rate > 0.0 { (ahead as f64 / self.rate).ceil() as u64 } else { 1 };
        ModelError::Overloaded { queued: ahead, retry_after_s: wait.max(1) }
    }
}

/// What a model's inference threads have run and its caches answered, for metrics (as
/// text-embeddings-inference exposes them).
#[derive(Debug, Clone, PartialEq)]
pub struct BatchStats {
    /// Forward passes.
    pub batches: u64,
    /// Inputs they carried: the pairs (or texts) the model computed.
    pub inputs: u64,
    /// Passes that carried the inputs of more than one request (concurrent requests batched together).
    pub shared: u64,
    /// Inputs per pass.
    pub batch_size: Histogram,
    /// Padded tokens per pass.
    pub batch_tokens: Histogram,
    /// Seconds per forward pass.
    pub inference_seconds: Histogram,
    /// Seconds a request's inputs waited before their first pass.
    pub queue_seconds: Histogram,
    /// Inputs the model's caches (memory, then the collection's stored outputs) answered, and those they did not.
    pub cache_hits: u64,
    pub cache_misses: u64,
}

impl Default for BatchStats {
    fn default() -> BatchStats {
        BatchStats {
            batches: 0,
            inputs: 0,
            shared: 0,
            batch_size: Histogram::new(histogram::COUNTS),
            batch_tokens: Histogram::new(histogram::TOKENS),
            inference_seconds: Histogram::new(histogram::SECONDS),
            queue_seconds: Histogram::new(histogram::SECONDS),
            cache_hits: 0,
            cache_misses: 0,
        }
    }
}

impl BatchStats {
    /// Adds another queue's (a Co-BERT model's second one).
    pub fn merge(&mut self, other: &BatchStats) {
        self.batches += other.batches;
        self.inputs += other.inputs;
        self.shared += other.shared;
        self.batch_size.merge(&other.batch_size);
        self.batch_tokens.merge(&other.batch_tokens);
        self.inference_seconds.merge(&other.inference_seconds);
        self.queue_seconds.merge(&other.queue_seconds);
        self.cache_hits += other.cache_hits;
        self.cache_misses += other.cache_misses;
    }
}

struct Item {
    job: Arc<Job>,
    index: usize,
    input: Encoded,
}

struct Job {
    cancel: Cancel,
    submitted: Instant,
    progress: Mutex<Progress>,
    done: Condvar,
}

#[derive(Default)]
struct Progress {
    outputs: Vec<Option<Vec<f32>>>,
    remaining: usize,
    started: Option<Instant>,
    inference: Duration,
    error: Option<String>,
}

impl Queue {
    /// Starts the inference thread.
    pub fn start(name: &str, forward: Box<Forward>, max_batch_tokens: usize, max_queued: usize) -> Queue {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            max_batch_tokens: max_batch_tokens.max(1),
            max_queued: max_queued.max(1),
        });
        let worker = shared.clone();
        std::thread::Builder::new()
            .name(format!("inference-{name}"))
            .spawn(move || worker.run(&*forward))
            .expect("spawn the inference thread");
        Queue { shared }
    }

    /// Runs the inputs through the model and waits for every output (in input order).
    pub fn run(&self, inputs: Vec<Encoded>, cancel: &Cancel) -> Result<(Vec<Vec<f32>>, JobTiming), Unfinished> {
        if inputs.is_empty() {
            return Ok((Vec::new(), JobTiming::default()));
        }
        let n = inputs.len();
        let job = Arc::new(Job {
            cancel: cancel.clone(),
            submitted: Instant::now(),
            progress: Mutex::new(Progress { outputs: vec![None; n], remaining: n, ..Default::default() }),
            done: Condvar::new(),
        });
        loop {
            let mut state = self.shared.state.lock();
            // Ahead of this job: the inputs of requests still waiting (a gone one's are dropped unrun), drained
            // at the model's recent rate.
            let ahead = state.pending.iter().filter(|item| !item.job.cancel.is_cancelled()).count();
            // A job larger than the whole queue still runs when it would wait behind nothing. Refused now rather
            // than timed out later: the work ahead could not drain in time for its own.
            if ahead > 0 && (ahead + n > self.shared.max_queued || state.hopeless(ahead, n, cancel.deadline())) {
                return Err(state.overloaded(ahead).into());
            }
            // Behind more than its deadline allows with the margin, it waits for the queue to drain (holding its
            // request's slot, so that later requests wait in admission's line) rather than being refused: a
            // burst's requests are served as the model gets to them, not refused while it is busiest.
            if state.ends_too_late(ahead, n, cancel.deadline()) {
                drop(state);
                if cancel.is_cancelled() {
                    return Err(Unfinished { error: ModelError::Cancelled, outputs: vec![None; n] });
                }
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            let mut order: Vec<(usize, Encoded)> = inputs.into_iter().enumerate().collect();
            order.sort_by_key(|(_, e)| e.ids.len());
            state.pending.extend(order.into_iter().map(|(index, input)| Item { job: job.clone(), index, input }));
            break;
        }
        self.shared.wake.notify_one();
        let mut progress = job.progress.lock();
        // The slots stay (a batch still running delivers into them); their outputs go to the caller.
        let unfinished = |progress: &mut Progress, error| Unfinished {
            error,
            outputs: progress.outputs.iter_mut().map(Option::take).collect(),
        };
        loop {
            if let Some(error) = progress.error.take() {
                return Err(unfinished(&mut progress, ModelError::Inference(error)));
            }
            if progress.remaining == 0 {
                let timing = JobTiming {
                    queue: progress.started.map(|s| s - job.submitted).unwrap_or_default(),
                    inference: progress.inference,
                };
                self.shared.state.lock().stats.queue_seconds.observe(timing.queue.as_secs_f64());
                let outputs = progress.outputs.drain(..).map(|o| o.expect("every output delivered")).collect();
                return Ok((outputs, timing));
            }
            if cancel.is_cancelled() {
                return Err(unfinished(&mut progress, ModelError::Cancelled));
            }
            // While none of its inputs has been taken, the request leaves (refused, as on arrival) once the
            // model's pace says they would end past its deadline: refused before it starts, not timed out.
            if progress.started.is_none() && cancel.deadline().is_some() {
                let mut state = self.shared.state.lock();
                let mine = |item: &Item| Arc::ptr_eq(&item.job, &job);
                if state.pending.iter().filter(|item| mine(item)).count() == n {
                    let before = state.pending.iter().take_while(|item| !mine(item));
                    let ahead = before.filter(|item| !item.job.cancel.is_cancelled()).count();
                    if state.ends_too_late(ahead, n, cancel.deadline()) {
                        state.pending.retain(|item| !mine(item));
                        return Err(state.overloaded(ahead).into());
                    }
                }
            }
            // Woken by the thread on completion; the timeout notices cancellation and a pace fallen behind.
            job.done.wait_for(&mut progress, Duration::from_millis(50));
        }
    }

    /// Inputs waiting for the model.
    pub fn queued(&self) -> usize {
        self.shared.state.lock().pending.len()
    }

    pub fn stats(&self) -> BatchStats {
        self.shared.state.lock().stats.clone()
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        self.shared.state.lock().shutdown = true;
        self.shared.wake.notify_all();
    }
}

impl Shared {
    fn run(&self, forward: &Forward) {
        loop {
            let batch = {
                let mut state = self.state.lock();
                loop {
                    if state.shutdown {
                        return;
                    }
                    state.pending.retain(|item| !item.job.cancel.is_cancelled());
                    if !state.pending.is_empty() {
                        break;
                    }
                    self.wake.wait(&mut state);
                }
                let batch = self.take_batch(&mut state);
                let stats = &mut state.stats;
                stats.batches += 1;
                stats.inputs += batch.len() as u64;
                stats.shared += batch.iter().any(|item| !Arc::ptr_eq(&item.job, &batch[0].job)) as u64;
                stats.batch_size.observe(batch.len() as f64);
                let longest = batch.iter().map(|item| item.input.ids.len()).max().unwrap_or(0);
                stats.batch_tokens.observe((longest * batch.len()) as f64);
                batch
            };
            crate::hooks::point("model.batch");
            let started = Instant::now();
            let mut batch = batch;
            batch.sort_by_key(|item| item.input.ids.len());
            let inputs: Vec<Encoded> = batch.iter().map(|item| item.input.clone()).collect();
            crate::hooks::slow_point("model.batch");
            let result = forward(&inputs);
            let elapsed = started.elapsed();
            self.state.lock().stats.inference_seconds.observe(elapsed.as_secs_f64());
            if let Ok(outputs) = &result {
                let mut state = self.state.lock();
                let rate = outputs.len() as f64 / elapsed.as_secs_f64().max(1e-6);
                state.rate = if state.rate == 0.0 { rate } else { 0.8 * state.rate + 0.2 * rate };
                state.last_rate = rate;
            }
            deliver(batch, result, started, elapsed);
        }
    }

    /// The oldest inputs, as many as fit the padded-token budget (at least one).
    fn take_batch(&self, state: &mut State) -> Vec<Item> {
        let mut batch: Vec<Item> = Vec::new();
        let mut longest = 0;
        while let Some(next) = state.pending.front() {
            let len = longest.max(next.input.ids.len());
            if !batch.is_empty() && (batch.len() + 1) * len > self.max_batch_tokens {
                break;
            }
            longest = len;
            batch.extend(state.pending.pop_front());
        }
        batch
    }
}

fn deliver(batch: Vec<Item>, result: Result<Vec<Vec<f32>>, ModelError>, started: Instant, elapsed: Duration) {
    let mut seen: Vec<*const Job> = Vec::new();
    let outputs: Vec<Option<Vec<f32>>> = match &result {
        Ok(outputs) => outputs.iter().cloned().map(Some).collect(),
        Err(_) => vec![None; batch.len()],
    };
    for (item, output) in batch.into_iter().zip(outputs) {
        let mut progress = item.job.progress.lock();
        progress.started.get_or_insert(started);
        if !seen.contains(&Arc::as_ptr(&item.job)) {
            seen.push(Arc::as_ptr(&item.job));
            progress.inference += elapsed;
        }
        match (&result, output) {
            (Err(e), _) => progress.error = Some(e.to_string()),
            (Ok(_), Some(output)) if progress.remaining > 0 => {
                progress.outputs[item.index] = Some(output);
                progress.remaining -= 1;
            }
            _ => {}
        }
        if progress.remaining == 0 || progress.error.is_some() {
            item.job.done.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(len: usize, tag: u32) -> Encoded {
        Encoded { ids: vec![tag; len], type_ids: vec![0; len], shared_prefix: 0 }
    }

    /// A "model" that returns each input's first id and length, and records batch shapes.
    fn echo(batches: Arc<Mutex<Vec<(usize, usize)>>>) -> Box<Forward> {
        Box::new(move |batch: &[Encoded]| {
            let longest = batch.iter().map(|e| e.ids.len()).max().unwrap_or(0);
            batches.lock().push((batch.len(), longest));
            std::thread::sleep(Duration::from_millis(5));
            Ok(batch.iter().map(|e| vec![e.ids[0] as f32, e.ids.len() as f32]).collect())
        })
    }

    #[test]
    fn outputs_come_back_in_input_order_within_the_token_budget() {
        let batches = Arc::new(Mutex::new(Vec::new()));
        let queue = Queue::start("test", echo(batches.clone()), 40, 1000);
        let inputs: Vec<Encoded> = (0..20).map(|i| input(1 + (i * 7) % 13, i as u32)).collect();
        let (outputs, timing) = queue.run(inputs.clone(), &Cancel::default()).unwrap();
        for (i, (e, out)) in inputs.iter().zip(&outputs).enumerate() {
            assert_eq!(out, &vec![i as f32, e.ids.len() as f32]);
        }
        assert!(timing.inference > Duration::ZERO);
        for &(n, longest) in batches.lock().iter() {
            assert!(n == 1 || n * longest <= 40, "batch of {n} x {longest} over the budget");
        }
    }

    #[test]
    fn concurrent_jobs_share_batches_and_get_their_own_outputs() {
        let batches = Arc::new(Mutex::new(Vec::new()));
        let queue = Arc::new(Queue::start("test", echo(batches.clone()), 1000, 1000));
        let handles: Vec<_> = (0..8u32)
            .map(|t| {
                let queue = queue.clone();
                std::thread::spawn(move || {
                    let inputs: Vec<Encoded> = (0..10).map(|i| input(2 + i, t * 100 + i as u32)).collect();
                    let (outputs, _) = queue.run(inputs, &Cancel::default()).unwrap();
                    outputs.iter().map(|o| o[0] as u32).collect::<Vec<_>>()
                })
            })
            .collect();
        for (t, h) in handles.into_iter().enumerate() {
            assert_eq!(h.join().unwrap(), (0..10).map(|i| t as u32 * 100 + i).collect::<Vec<_>>());
        }
        assert!(batches.lock().iter().any(|&(n, _)| n > 10), "jobs were never batched together");
    }

    /// A request let in at the model's pace leaves, refused, when the model slows so that its inputs (none taken
    /// yet) would end past its deadline: before the deadline, not cut by it.
    #[test]
    fn a_queued_request_the_model_falls_behind_on_is_refused_before_its_deadline() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let pause = Arc::new(AtomicU64::new(5));
        let forward: Box<Forward> = {
            let pause = pause.clone();
            Box::new(move |batch: &[Encoded]| {
                std::thread::sleep(Duration::from_millis(pause.load(Ordering::Relaxed)));
                Ok(batch.iter().map(|_| vec![0.0]).collect())
            })
        };
        // Batches of 4 inputs of 2 tokens: 5 ms each at first (800 inputs/s), then 200 ms (20 inputs/s).
        let queue = Arc::new(Queue::start("test", forward, 8, 10_000));
        queue.run(vec![input(2, 0); 4], &Cancel::default()).unwrap();
        pause.store(200, Ordering::Relaxed);
        let long = {
            let queue = queue.clone();
            std::thread::spawn(move || queue.run(vec![input(2, 1); 40], &Cancel::default()))
        };
        while queue.queued() < 36 {
            std::thread::sleep(Duration::from_millis(1));
        }
        // At the first pace the 36 inputs ahead take 50 ms: let in with a second left. At the slow one they take
        // nearly 2 s: once a slow batch has run, it leaves.
        let deadline = Instant::now() + Duration::from_secs(1);
        match queue.run(vec![input(2, 2)], &Cancel::until(deadline)) {
            Err(Unfinished { error: ModelError::Overloaded { retry_after_s, .. }, .. }) => {
                assert!(Instant::now() < deadline && retry_after_s >= 1)
            }
            other => panic!("not refused in time: {other:?}"),
        }
        assert_eq!(long.join().unwrap().unwrap().0.len(), 40);
    }

    /// Behind more than its deadline allows with the margin, but with work ahead that can drain in time for its
    /// own, a request waits rather than being refused; behind more than that, it is refused at once.
    #[test]
    fn a_request_is_refused_only_when_the_work_ahead_cannot_drain_in_time() {
        let state = State { rate: 100.0, last_rate: 100.0, ..State::default() };
        let deadline = |secs: f64| Some(Instant::now() + Duration::from_secs_f64(secs));
        // 400 inputs ahead drain in 4 s; with the margin, 4.41 s for them and one more.
        assert!(state.ends_too_late(400, 1, deadline(4.2)) && !state.hopeless(400, 1, deadline(4.2)), "it waits");
        assert!(state.hopeless(400, 1, deadline(3.9)), "refused");
        assert!(!state.ends_too_late(400, 1, deadline(4.5)), "queued at once");
        // A slower last batch is believed.
        let slowed = State { last_rate: 50.0, ..state };
        assert!(slowed.hopeless(400, 1, deadline(4.2)));
    }

    /// A request whose wait ahead would pass its deadline is refused at once, with the drain time as Retry-After;
    /// one with time enough is admitted; inputs of a gone request do not count as ahead.
    #[test]
    fn a_request_that_would_time_out_queued_is_refused_at_once() {
        // Batches of 4 inputs, 40 ms each: about 100 inputs/s.
        let forward: Box<Forward> = Box::new(|batch: &[Encoded]| {
            std::thread::sleep(Duration::from_millis(40));
            Ok(batch.iter().map(|_| vec![0.0]).collect())
        });
        let queue = Arc::new(Queue::start("test", forward, 8, 10_000));
        queue.run(vec![input(2, 0); 4], &Cancel::default()).unwrap(); // the rate is known from here on
        let cancel = Cancel::default();
        let long = {
            let (queue, cancel) = (queue.clone(), cancel.clone());
            std::thread::spawn(move || queue.run(vec![input(2, 1); 200], &cancel))
        };
        while queue.queued() < 150 {
            std::thread::sleep(Duration::from_millis(1));
        }
        // About 1.5 s or more ahead: a request with 200 ms left is refused, one with a minute admitted.
        let soon = Cancel::until(Instant::now() + Duration::from_millis(200));
        match queue.run(vec![input(2, 2)], &soon) {
            Err(Unfinished { error: ModelError::Overloaded { queued, retry_after_s }, .. }) => {
                assert!(queued >= 100 && retry_after_s >= 1, "{queued} queued, retry after {retry_after_s} s")
            }
            other => panic!("not refused: {other:?}"),
        }
        let later = {
            let queue = queue.clone();
            std::thread::spawn(move || {
                queue.run(vec![input(2, 3)], &Cancel::until(Instant::now() + Duration::from_secs(60)))
            })
        };
        // The long request goes away once three of its batches were taken (two of them delivered, at least):
        // what it queued no longer counts, and a short deadline is admitted.
        while queue.stats().inputs < 4 + 12 {
            std::thread::sleep(Duration::from_millis(1));
        }
        cancel.cancel();
        // Cancelled, it hands back the outputs of its batches that ran.
        match long.join().unwrap() {
            Err(Unfinished { error: ModelError::Cancelled, outputs }) => {
                assert_eq!(outputs.len(), 200);
                let kept = outputs.iter().filter(|o| o.is_some()).count();
                assert!(kept >= 8, "kept {kept}");
            }
            other => panic!("not cancelled: {other:?}"),
        }
        assert_eq!(later.join().unwrap().unwrap().0.len(), 1);
        let soon = Cancel::until(Instant::now() + Duration::from_millis(200));
        assert_eq!(queue.run(vec![input(2, 4)], &soon).unwrap().0.len(), 1);
    }

    #[test]
    fn a_full_queue_refuses_and_a_cancelled_job_is_dropped() {
        let gate = Arc::new(Mutex::new(()));
        let held = gate.lock();
        let g = gate.clone();
        let forward: Box<Forward> = Box::new(move |batch: &[Encoded]| {
            drop(g.lock());
            Ok(batch.iter().map(|_| vec![0.0]).collect())
        });
        let queue = Arc::new(Queue::start("test", forward, 2, 5));
        // The first job's first input blocks the thread inside the model; the rest stay queued.
        let cancel = Cancel::default();
        let first = {
            let (queue, cancel) = (queue.clone(), cancel.clone());
            std::thread::spawn(move || queue.run((0..5).map(|i| input(2, i)).collect(), &cancel))
        };
        while queue.queued() != 4 {
            std::thread::sleep(Duration::from_millis(2));
        }
        let refused = queue.run(vec![input(2, 9), input(2, 9)], &Cancel::default()).unwrap_err().error;
        assert!(matches!(refused, ModelError::Overloaded { queued: 4, .. }), "{refused}");
        cancel.cancel();
        assert!(matches!(first.join().unwrap(), Err(Unfinished { error: ModelError::Cancelled, .. })));
        drop(held);
        // The cancelled inputs are dropped, so new work runs.
        let (outputs, _) = queue.run(vec![input(2, 1)], &Cancel::default()).unwrap();
        assert_eq!(outputs.len(), 1);
        assert_eq!(queue.queued(), 0);
    }
}
