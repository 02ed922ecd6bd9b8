//! Batch jobs over HTTP. A submitted job is stored with one task per topic; in every replica that shares the
//! store, `batch.workers` workers for jobs that re-rank with a model and as many for jobs that need none (so
//! that these never wait behind model work) claim topics one at a time, round-robin across the jobs of their
//! lane, with a lease (`store::leases`), run each through
//! the same `BatchPlan` as `longrank batch`, and commit its run lines, so a job survives the death of any
//! replica: a topic whose lease runs out is run by another worker, and the commit of the last topic computes
//! the metrics. The run is the topics in file order, whichever replica ran each.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use utoipa::ToSchema;

use crate::config::Config;
use crate::eval::{self, Comparison, EvalError, EvalOptions, Measure, Qrels, Run, Warning};
use crate::model::Cancel;
use crate::rank::{BatchParams, BatchPlan, Engine, RankError};
use crate::service::{Bell, Next, Services};
use crate::store::{Claim, Committed, Completion, JobRow, JobStatus, KeyedRequest, Lane, NewJob, Store, StoreError};

use super::cluster::{self, Cluster};

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(transparent)]
    Rank(#[from] RankError),
    #[error(transparent)]
    Input(#[from] EvalError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("no batch job {0:?}")]
    UnknownJob(String),
    #[error("job {id} is {status}: {message}")]
    Conflict { id: String, status: &'static str, message: String },
    #[error("batch worker failed: {0}")]
    Worker(String),
    #[error("collection {collection} is in use by batch jobs {} (queued or running): cancel them or let them finish", jobs.join(", "))]
    CollectionInUse { collection: String, jobs: Vec<String> },
    #[error("Idempotency-Key {key:?} was given to job {id}, submitted with other parameters or files: use a new key for another job")]
    KeyReused { key: String, id: String },
}

/// A batch submission: the parameters and the files' contents.
#[derive(Debug, Clone, Default)]
pub struct Submission {
    pub params: BatchParams,
    pub topics: String,
    pub qrels: Option<String>,
    /// A TREC run whose candidates are re-ranked instead of the first stage's.
    pub rerank: Option<String>,
}

/// A job as clients see it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct JobView {
    pub id: String,
    pub status: JobStatus,
    pub created_at: String,
    pub updated_at: String,
    pub progress: Progress,
    /// What the model's passes cost the finished topics (re-ranking pipelines).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flops: Option<Flops>,
    /// The batch parameters as submitted.
    #[schema(value_type = Object)]
    pub params: serde_json::Value,
    /// Effective configuration, index, model and version the run was made with.
    #[schema(value_type = Object)]
    pub provenance: serde_json::Value,
    /// Present when qrels were given and the job is done.
    pub metrics: Option<Metrics>,
    /// One per kind, with a count and the first ids.
    pub warnings: Vec<Warning>,
    pub error: Option<String>,
    /// Present while no live replica can run the job (none serves the index files and model weights it was
    /// submitted against): it resumes when one can, or fails at `fails_at`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stranded: Option<Stranded>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Stranded {
    pub since: String,
    /// When it fails if no replica can run it by then (`batch.stranded_fail_after_ms`; absent: it waits).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fails_at: Option<String>,
    pub message: String,
}

impl Stranded {
    fn of(row: &JobRow, fail_after_ms: u64) -> Option<Stranded> {
        let since = row.stranded_ms.filter(|_| !row.status.is_finished())?;
        let time = |ms: i64| crate::timestamp::rfc3339(std::time::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64));
        let needs = cluster::unserved(row.fingerprint.as_deref().unwrap_or_default(), row.weights.as_deref());
        let message =
            format!("no live replica serves {needs} this job was submitted against: it resumes when one does");
        let fails_at = (fail_after_ms > 0).then(|| time(since + fail_after_ms as i64));
        Some(Stranded { since: time(since), fails_at, message })
    }
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Progress {
    pub done: i64,
    pub total: i64,
    /// Seconds left, estimated from the rate of the topics done since the job's first topic was claimed
    /// (a running job with a topic done).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eta_s: Option<f64>,
}

impl Progress {
    fn of(row: &JobRow) -> Progress {
        let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
        let eta_s = match (row.status, row.started_ms) {
            (JobStatus::Running, Some(started)) if row.done > 0 => {
                let elapsed_s = (now_ms as f64 - started as f64).max(0.0) / 1000.0;
                Some(eta(elapsed_s, row.done, row.total))
            }
            _ => None,
        };
        Progress { done: row.done, total: row.total, eta_s }
    }
}

/// Seconds left for `total - done` items at the rate of `done` in `elapsed_s`, to a tenth of a second.
fn eta(elapsed_s: f64, done: i64, total: i64) -> f64 {
    let left = elapsed_s / done.max(1) as f64 * (total - done).max(0) as f64;
    (left * 10.0).round() / 10.0
}

/// Model FLOPs, counted as `/search` counts them (`timing.flops`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Flops {
    pub total: f64,
    /// The mean over the finished topics.
    pub per_topic: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Metrics {
    pub all: BTreeMap<String, f64>,
    /// Per topic, in one job's view (a list of jobs leaves it out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_topic: Option<BTreeMap<String, BTreeMap<String, f64>>>,
}

/// The job queue and this replica's workers.
pub struct Jobs {
    engine: Arc<Engine>,
    store: Store,
    config: Config,
    /// What this replica serves, and the settings in force (the lease's length).
    cluster: Arc<Cluster>,
    /// This replica's name in the leases it takes (set by `start`).
    replica: OnceLock<String>,
    /// Wake idle workers when a job is submitted here (others' jobs are found by polling).
    workers: Mutex<Vec<Bell>>,
    /// Told whenever a job finishes or is cancelled here.
    finished: Notify,
    /// The plans of the jobs this replica works on, each built once from its stored row.
    plans: Mutex<HashMap<String, Arc<Planned>>>,
    /// The cancel flags of the topics running here, by job and topic.
    running: Mutex<HashMap<(String, i64), Cancel>>,
    pub counters: Counters,
}

/// What this replica's workers did with topics, for `/metrics`.
#[derive(Default)]
pub struct Counters {
    pub claimed: AtomicU64,
    pub renewed: AtomicU64,
    /// Leases lost while the topic ran (they ran out, or the job stopped).
    pub expired: AtomicU64,
    /// Claims of a topic that an earlier claim had held.
    pub retried: AtomicU64,
    /// Commits refused because the lease had been lost.
    pub fenced: AtomicU64,
}

struct Planned {
    plan: BatchPlan,
    qrels: Option<String>,
}

/// How long an idle worker waits before looking for topics again (jobs submitted to other replicas, leases
/// that ran out), and how often a waiting client looks at a job that runs elsewhere.
const IDLE_POLL: Duration = Duration::from_millis(250);

impl Jobs {
    /// The queue on `store`, run with the lease and the stranded jobs' rule `cluster` holds in force.
    pub fn new(engine: Arc<Engine>, store: Store, config: Config, cluster: Arc<Cluster>) -> Arc<Jobs> {
        Arc::new(Jobs {
            cluster,
            engine,
            store,
            config,
            replica: OnceLock::new(),
            workers: Mutex::default(),
            finished: Notify::new(),
            plans: Mutex::new(HashMap::new()),
            running: Mutex::new(HashMap::new()),
            counters: Counters::default(),
        })
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Submits a job: its id. With an Idempotency-Key, a repeat of a submission (a client's or a proxy's retry)
    /// answers the first job's id instead of creating another, and the key given with other parameters or
    /// files is refused.
    pub async fn submit(self: &Arc<Self>, submission: Submission, key: Option<&str>) -> Result<String, JobError> {
        let params = serde_json::to_string(&submission.params).unwrap_or_default();
        // The submission's parameters and files, each told from absent.
        let parts = serde_json::to_string(&(&params, &submission.topics, &submission.qrels, &submission.rerank))
            .expect("a submission serializes");
        let keyed = key.map(|key| KeyedRequest::new(key, &[parts.as_bytes()]));
        if let Some(first) = self.first_with_key(keyed.as_ref()).await? {
            return Ok(first);
        }
        let topics = eval::formats::parse_topics(&submission.topics, &eval::formats::upload_path("topics"))?;
        if let Some(qrels) = &submission.qrels {
            Qrels::parse(qrels, &eval::formats::upload_path("qrels"))?;
        }
        let total = topics.len() as i64;
        let rerank = parse_rerank(submission.rerank.as_deref())?;
        let plan = self.engine.plan_batch(&submission.params, topics, rerank)?;
        let id = new_job_id();
        let provenance =
            serde_json::to_string(&plan.provenance(&self.engine, &self.config.recorded())).unwrap_or_default();
        // Hashing new index files reads them: on a blocking thread.
        let collection = plan.collection.clone();
        let fingerprint = tokio::task::spawn_blocking(move || collection.fingerprint())
            .await
            .map_err(|e| JobError::Worker(e.to_string()))?
            .map_err(RankError::from)?;
        let weights = self.engine.model_for(&plan.options)?.map(|m| m.weights_hash.clone());
        let job = NewJob {
            id: &id,
            params: &params,
            topics: &submission.topics,
            qrels: submission.qrels.as_deref(),
            rerank: submission.rerank.as_deref(),
            provenance: &provenance,
            total,
            fingerprint: Some(&fingerprint),
            weights: weights.as_deref(),
            keyed: keyed.as_ref(),
        };
        match self.store.create_job(job).await {
            // The same key submitted at once by another request (or replica): the first one created wins.
            Err(e) if e.is_duplicate() && keyed.is_some() => {
                if let Some(first) = self.first_with_key(keyed.as_ref()).await? {
                    return Ok(first);
                }
                return Err(e.into());
            }
            created => created?,
        }
        self.plans.lock().insert(id.clone(), Arc::new(Planned { plan, qrels: submission.qrels }));
        for worker in self.workers.lock().iter() {
            worker.ring();
        }
        Ok(id)
    }

    /// The job already submitted with this key, when this submission repeats it.
    async fn first_with_key(&self, keyed: Option<&KeyedRequest>) -> Result<Option<String>, JobError> {
        let Some(keyed) = keyed else { return Ok(None) };
        let first = self.store.job_by_idempotency_key(&keyed.key).await?;
        keyed.repeats(first).map_err(|id| JobError::KeyReused { key: keyed.key.clone(), id })
    }

    /// Starts this replica's workers, named `replica` in their leases. First the leases a previous run of this
    /// replica held are freed (on an unshared store every lease: one process owns it), so its topics run again
    /// at once; with `batch.resume_interrupted = false` their jobs (on an unshared store every unfinished job)
    /// are marked interrupted instead.
    pub async fn start(self: &Arc<Self>, replica: String, services: &Services) -> Result<(), JobError> {
        let shared = self.store.shared();
        let stale = self.store.release_leases(shared.then_some(replica.as_str())).await?;
        let _ = self.replica.set(replica);
        if !self.config.batch.resume_interrupted {
            let cut_off = match shared {
                true => stale,
                false => self.store.unfinished_jobs().await?,
            };
            for id in cut_off {
                self.store
                    .set_status(&id, JobStatus::Interrupted, Some("the server stopped while the job ran"))
                    .await?;
            }
        }
        let runtime = tokio::runtime::Handle::current();
        for i in 0..self.config.batch.workers.max(1) {
            for (lane, name) in [(Lane::Model, "batch-model"), (Lane::FirstStage, "batch-first-stage")] {
                let (jobs, runtime) = (self.clone(), runtime.clone());
                let worker =
                    services.spawn_worker(&format!("{name}-{i}"), Duration::ZERO, move || jobs.work(lane, &runtime));
                self.workers.lock().push(worker);
            }
        }
        Ok(())
    }

    /// A tick of a worker of `lane`: claims a topic, runs it, commits it; when there is none, waits.
    fn work(self: &Arc<Self>, lane: Lane, runtime: &tokio::runtime::Handle) -> Next {
        let replica = self.replica.get().cloned().unwrap_or_default();
        // Replicas take only jobs they can run exactly; an unshared store has one process, which runs all.
        let serves = self.store.shared().then(|| self.cluster.serves_now());
        let claimed = self.store.claim_topic(&replica, self.cluster.lease_ms() as i64, serves.as_ref(), lane);
        let claim = match runtime.block_on(claimed) {
            Ok(Some(claim)) => claim,
            Ok(None) => {
                runtime.block_on(self.prune());
                return Next::After(IDLE_POLL);
            }
            Err(e) => {
                tracing::warn!("claiming a topic: {e}");
                return Next::After(IDLE_POLL);
            }
        };
        self.counters.claimed.fetch_add(1, Ordering::Relaxed);
        if claim.attempt > 1 {
            self.counters.retried.fetch_add(1, Ordering::Relaxed);
            tracing::info!(job = %claim.job_id, topic = claim.seq, attempt = claim.attempt, "retrying a topic");
        }
        match self.run_topic(&claim, runtime) {
            Ok(()) => {}
            // The store failed (a replica stalled past its pool's timeout, a lost connection): not the job's
            // fault. The topic's lease runs out and a claim, here or on another replica, runs it again.
            Err(JobError::Store(e)) => tracing::warn!(
                job = %claim.job_id, topic = claim.seq,
                "the store failed for a topic, which runs again once its lease runs out: {e}"
            ),
            Err(e) => {
                tracing::error!(job = %claim.job_id, "batch job failed: {e}");
                let error = e.to_string();
                let _ = runtime.block_on(self.store.set_status(&claim.job_id, JobStatus::Failed, Some(&error)));
                self.forget(&claim.job_id);
                self.finished.notify_waiters();
            }
        }
        Next::Now
    }

    /// Runs one claimed topic, renewing its lease meanwhile, and commits it.
    fn run_topic(self: &Arc<Self>, claim: &Claim, runtime: &tokio::runtime::Handle) -> Result<(), JobError> {
        let planned = self.plan(&claim.job_id, runtime)?;
        let cancel = Cancel::default();
        let key = (claim.job_id.clone(), claim.seq);
        self.running.lock().insert(key.clone(), cancel.clone());
        let renewal = runtime.spawn(self.clone().renew(claim.clone(), cancel.clone()));
        let seq = claim.seq as usize;
        let plan = &planned.plan;
        let ranked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            plan.run_topic(&self.engine, &plan.topics[seq], &cancel)
        }));
        renewal.abort();
        self.running.lock().remove(&key);
        let ranked = match ranked.map_err(|_| JobError::Worker("the topic's worker panicked".into()))? {
            // The lease was lost or the job stopped while the topic ran: another claim runs it, or none.
            Err(_) if cancel.is_cancelled() => return Ok(()),
            ranked => ranked?,
        };
        let qid = &plan.topics[seq].qid;
        let mut run = Run { tag: plan.tag.clone(), ..Default::default() };
        run.topics.insert(qid.clone(), ranked.scored);
        let mut text = Vec::new();
        run.write(&mut text).expect("writing to memory");
        let complete = |whole: &str| completion(plan, whole, planned.qrels.as_deref()).map_err(|e| e.to_string());
        crate::hooks::point("batch.commit");
        if crate::hooks::fails("batch.commit") {
            return Err(StoreError::Sqlx(sqlx::Error::PoolTimedOut).into());
        }
        let text = String::from_utf8_lossy(&text);
        let committed = runtime.block_on(self.store.commit_topic(claim, qid, &text, ranked.flops, complete))?;
        if matches!(committed, Committed::Topic | Committed::Job) {
            crate::hooks::point("batch.topic");
        }
        match committed {
            Committed::Topic => {}
            Committed::Job => {
                self.forget(&claim.job_id);
                // Retention: the newest finished jobs stay, older ones go with their runs; before the waiters
                // are woken, so that a client the finish wakes finds the jobs retention removes gone.
                match runtime.block_on(self.store.keep_finished(self.config.batch.keep_finished_jobs)) {
                    Ok(0) => {}
                    Ok(n) => tracing::info!("deleted {n} finished jobs beyond batch.keep_finished_jobs"),
                    Err(e) => tracing::warn!("job retention: {e}"),
                }
                self.finished.notify_waiters();
            }
            Committed::Fenced => {
                self.counters.fenced.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(job = %claim.job_id, topic = claim.seq, "the topic's lease was lost: its result is dropped");
            }
            Committed::Stopped => self.forget(&claim.job_id),
        }
        Ok(())
    }

    /// Renews a claim's lease every third of it; cancels the topic when the lease is lost.
    async fn renew(self: Arc<Self>, claim: Claim, cancel: Cancel) {
        loop {
            // The lease's length in force now (cluster settings change it without a restart).
            let lease_ms = self.cluster.lease_ms();
            tokio::time::sleep(Duration::from_millis(lease_ms / 3)).await;
            match self.store.renew(&claim, lease_ms as i64).await {
                Ok(true) => {
                    self.counters.renewed.fetch_add(1, Ordering::Relaxed);
                }
                Ok(false) => {
                    self.counters.expired.fetch_add(1, Ordering::Relaxed);
                    cancel.cancel();
                    return;
                }
                Err(e) => tracing::warn!(job = %claim.job_id, "renewing a lease: {e}"),
            }
        }
    }

    /// The job's plan, built from its row the first time this replica works on it, with the options it was
    /// submitted with whatever the configuration says today.
    fn plan(&self, id: &str, runtime: &tokio::runtime::Handle) -> Result<Arc<Planned>, JobError> {
        if let Some(planned) = self.plans.lock().get(id) {
            return Ok(planned.clone());
        }
        let row = runtime.block_on(self.row(id))?;
        let params = serde_json::from_str::<BatchParams>(&row.params).map_err(|e| JobError::Worker(e.to_string()))?;
        let topics = eval::formats::parse_topics(&row.topics, &eval::formats::upload_path("topics"))?;
        let rerank = parse_rerank(row.rerank.as_deref())?;
        let mut plan = self.engine.plan_batch(&params, topics, rerank)?;
        plan.restore(&self.engine, &row.provenance)?;
        let planned = Arc::new(Planned { plan, qrels: row.qrels });
        self.plans.lock().insert(id.to_string(), planned.clone());
        Ok(planned)
    }

    /// Drops the plans of jobs that finished elsewhere (another replica committed their last topic).
    async fn prune(&self) {
        let planned: Vec<String> = self.plans.lock().keys().cloned().collect();
        for id in planned {
            if let Ok(status) = self.store.job_status(&id).await {
                if status.is_none_or(|s| s.is_finished()) {
                    self.forget(&id);
                }
            }
        }
    }

    /// Drops the plan of a job this replica will not run again.
    fn forget(&self, id: &str) {
        self.plans.lock().remove(id);
    }

    /// The job `id` as stored; an unknown one is `UnknownJob`.
    async fn row(&self, id: &str) -> Result<JobRow, JobError> {
        self.store.job(id).await?.ok_or_else(|| JobError::UnknownJob(id.to_string()))
    }

    pub async fn get(&self, id: &str) -> Result<JobView, JobError> {
        let row = self.row(id).await?;
        Ok(self.view(row))
    }

    /// A page of jobs, newest first, without per-topic metrics, and how many jobs there are.
    pub async fn list(&self, offset: usize, limit: usize) -> Result<(Vec<JobView>, i64), JobError> {
        let (rows, total) = self.store.jobs(offset, limit).await?;
        Ok((rows.into_iter().map(|row| self.view(row)).collect(), total))
    }

    /// Waits until a job finishes, here or on another replica, or the deadline passes: the job as it is then.
    pub async fn wait(&self, id: &str, deadline: Instant) -> Result<JobView, JobError> {
        loop {
            // Listening before reading, so a finish between the two is not missed.
            let finished = self.finished.notified();
            let view = self.get(id).await?;
            if view.status.is_finished() || Instant::now() >= deadline {
                return Ok(view);
            }
            let _ = tokio::time::timeout_at(deadline.min(Instant::now() + IDLE_POLL).into(), finished).await;
        }
    }

    /// The run of a finished job as a stream of parts (topics in topic-file order), never whole in memory.
    pub async fn run_file(
        &self,
        id: &str,
    ) -> Result<impl futures_util::Stream<Item = Result<String, StoreError>> + Send + 'static, JobError> {
        let row = self.row(id).await?;
        if row.status != JobStatus::Done {
            return Err(JobError::Conflict {
                id: row.id,
                status: row.status.as_str(),
                message: "the run is complete only when the job is done".into(),
            });
        }
        /// Topics per part: a few MB at most at k = 1000.
        const PART: i64 = 64;
        let (store, id) = (self.store.clone(), id.to_string());
        Ok(futures_util::stream::try_unfold(Some(-1), move |after| {
            let (store, id) = (store.clone(), id.clone());
            async move {
                let Some(after) = after else { return Ok(None) };
                let (text, last) = store.run_part(&id, after, PART).await?;
                Ok((!text.is_empty()).then_some((text, last)))
            }
        }))
    }

    /// Cancels a queued or running job (its view), or deletes a finished one with its run (`None`).
    pub async fn cancel_or_delete(&self, id: &str) -> Result<Option<JobView>, JobError> {
        let row = self.row(id).await?;
        if row.status.is_finished() {
            self.store.delete_job(id).await?;
            return Ok(None);
        }
        self.store.set_status(id, JobStatus::Cancelled, None).await?;
        // Topics running here stop now; other replicas' stop when they next renew their leases.
        for ((job, _), cancel) in self.running.lock().iter() {
            if job == id {
                cancel.cancel();
            }
        }
        self.forget(id);
        self.finished.notify_waiters();
        self.get(id).await.map(Some)
    }

    /// What `longrank compare` gives for two finished jobs with qrels (the first job's qrels judge both).
    pub async fn compare(&self, a: &str, b: &str) -> Result<Vec<Comparison>, JobError> {
        let mut evaluations = Vec::new();
        let qrels_a = self.row(a).await?.qrels;
        for id in [a, b] {
            let row = self.row(id).await?;
            if row.status != JobStatus::Done {
                return Err(JobError::Conflict {
                    id: row.id,
                    status: row.status.as_str(),
                    message: "compare needs finished jobs".into(),
                });
            }
            let Some(qrels) = &qrels_a else {
                return Err(JobError::Conflict {
                    id: a.to_string(),
                    status: "done",
                    message: "compare needs qrels; this job had none".into(),
                });
            };
            let qrels = Qrels::parse(qrels, &eval::formats::upload_path("qrels"))?;
            let run = Run::parse(&self.store.run_text(id).await?, &eval::formats::upload_path("run"))?;
            evaluations.push(eval::evaluate(&run, &qrels, &Measure::all(), EvalOptions::default()));
        }
        Ok(eval::compare(&evaluations[0], &evaluations[1]))
    }

    fn view(&self, row: JobRow) -> JobView {
        let json = |s: &str| serde_json::from_str(s).unwrap_or(serde_json::Value::Null);
        JobView {
            stranded: Stranded::of(&row, self.cluster.stranded_fail_after_ms()),
            progress: Progress::of(&row),
            flops: row.flops.map(|total| Flops { total, per_topic: total / row.done.max(1) as f64 }),
            params: json(&row.params),
            provenance: json(&row.provenance),
            metrics: row.metrics.as_deref().and_then(|m| serde_json::from_str(m).ok()),
            warnings: serde_json::from_str(&row.warnings).unwrap_or_default(),
            id: row.id,
            status: row.status,
            created_at: row.created_at,
            updated_at: row.updated_at,
            error: row.error,
        }
    }
}

/// A finished job's warnings, and its metrics when there are qrels, from its whole run as `GET
/// /batch/{id}/run` serves it.
fn completion(plan: &BatchPlan, run: &str, qrels: Option<&str>) -> Result<Completion, JobError> {
    let run = Run::parse(run, &eval::formats::upload_path("run"))?;
    let qrels = qrels.map(|q| Qrels::parse(q, &eval::formats::upload_path("qrels"))).transpose()?;
    let topics: Vec<&str> = plan.topics.iter().map(|t| t.qid.as_str()).collect();
    let warnings = run.batch_warnings(&topics, qrels.as_ref()).list();
    let metrics = qrels.map(|qrels| {
        let evaluation = eval::evaluate(&run, &qrels, &Measure::all(), EvalOptions::default());
        let per_topic = evaluation.per_topic.iter().map(|(q, v)| (q.clone(), v.iter().cloned().collect())).collect();
        serde_json::to_string(&Metrics { all: evaluation.all_map(), per_topic: Some(per_topic) }).unwrap_or_default()
    });
    Ok(Completion { metrics, warnings: serde_json::to_string(&warnings).unwrap_or_default() })
}

/// The run a job re-ranks, as submitted or as stored.
fn parse_rerank(text: Option<&str>) -> Result<Option<Run>, EvalError> {
    text.map(|r| Run::parse(r, &eval::formats::upload_path("rerank"))).transpose()
}

/// Sortable, unique job ids: creation time in microseconds plus a process counter.
fn new_job_id() -> String {
    use std::sync::atomic::AtomicU64;
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let micros = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros());
    format!("{micros:016x}{:04x}", COUNTER.fetch_add(1, Ordering::Relaxed) & 0xffff)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_eta_is_the_time_left_at_the_rate_so_far() {
        assert_eq!(super::eta(10.0, 5, 20), 30.0);
        assert_eq!(super::eta(1.0, 3, 3), 0.0);
        assert_eq!(super::eta(1.0, 3, 4), 0.3);
    }
}
