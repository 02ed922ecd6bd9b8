//! Batch jobs over HTTP: submitted runs wait in a queue bounded by `batch.max_concurrent_jobs`, run topic by
//! topic through the same `BatchPlan` as `longrank batch`, and persist every finished topic, so a job cut
//! off by a crash or restart resumes from its last finished topic (or is marked interrupted).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Semaphore};
use utoipa::ToSchema;

use crate::config::Config;
use crate::eval::{self, Comparison, EvalError, EvalOptions, Measure, Qrels, Run, Warning};
use crate::index::Catalog;
use crate::model::Cancel;
use crate::rank::{BatchParams, BatchPlan, Engine, RankError};
use crate::store::{JobRow, JobStatus, NewJob, Store, StoreError};

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
}

/// Deletes a collection, refused while a queued or running job reads it (`longrank collections delete`).
pub async fn delete_collection(catalog: &Catalog, store: &Store, name: &str) -> Result<(), JobError> {
    let jobs = store.unfinished_jobs_on(name).await?;
    if !jobs.is_empty() {
        return Err(JobError::CollectionInUse { collection: name.to_string(), jobs });
    }
    catalog.delete(name).map_err(RankError::from)?;
    Ok(())
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
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Progress {
    pub done: i64,
    pub total: i64,
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

/// The job queue and its workers.
pub struct Jobs {
    engine: Arc<Engine>,
    store: Store,
    config: Config,
    permits: Arc<Semaphore>,
    /// Cancellation flags and completion signals of jobs queued or running in this process.
    live: Mutex<HashMap<String, Live>>,
}

#[derive(Clone)]
struct Live {
    cancel: Cancel,
    finished: watch::Receiver<bool>,
}

impl Jobs {
    pub fn new(engine: Arc<Engine>, store: Store, config: Config) -> Arc<Jobs> {
        let permits = Arc::new(Semaphore::new(config.batch.max_concurrent_jobs.max(1)));
        Arc::new(Jobs { engine, store, config, permits, live: Mutex::new(HashMap::new()) })
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Validates and queues a job; returns its id at once.
    pub async fn submit(self: &Arc<Self>, submission: Submission) -> Result<String, JobError> {
        let topics = eval::formats::parse_topics(&submission.topics, &eval::formats::upload_path("topics"))?;
        if let Some(qrels) = &submission.qrels {
            Qrels::parse(qrels, &eval::formats::upload_path("qrels"))?;
        }
        let total = topics.len() as i64;
        let rerank = parse_rerank(submission.rerank.as_deref())?;
        let plan = self.engine.plan_batch(&submission.params, topics, rerank)?;
        let id = new_job_id();
        let params = serde_json::to_string(&submission.params).unwrap_or_default();
        let provenance =
            serde_json::to_string(&plan.provenance(&self.engine, &self.config.recorded())).unwrap_or_default();
        let job = NewJob {
            id: &id,
            params: &params,
            topics: &submission.topics,
            qrels: submission.qrels.as_deref(),
            rerank: submission.rerank.as_deref(),
            provenance: &provenance,
            total,
        };
        self.store.create_job(job).await?;
        self.spawn(id.clone(), plan, submission.qrels);
        Ok(id)
    }

    /// Resumes (or marks interrupted) the jobs a previous process left queued or running.
    pub async fn recover(self: &Arc<Self>) -> Result<(), JobError> {
        for row in self.store.unfinished_jobs().await? {
            if !self.config.batch.resume_interrupted {
                self.store
                    .set_status(&row.id, JobStatus::Interrupted, Some("the server stopped while the job ran"))
                    .await?;
                continue;
            }
            let plan = serde_json::from_str::<BatchParams>(&row.params).map_err(|e| e.to_string()).and_then(|params| {
                let topics = eval::formats::parse_topics(&row.topics, &eval::formats::upload_path("topics"))
                    .map_err(|e| e.to_string())?;
                let rerank = parse_rerank(row.rerank.as_deref()).map_err(|e| e.to_string())?;
                let mut plan = self.engine.plan_batch(&params, topics, rerank).map_err(|e| e.to_string())?;
                // As submitted, whatever the configuration says today.
                plan.restore(&self.engine, &row.provenance).map_err(|e| e.to_string())?;
                Ok(plan)
            });
            match plan {
                Ok(plan) => {
                    tracing::info!(job = %row.id, done = row.done, total = row.total, "resuming batch job");
                    self.spawn(row.id.clone(), plan, row.qrels.clone());
                }
                Err(e) => {
                    let message = format!("could not resume after a restart: {e}");
                    self.store.set_status(&row.id, JobStatus::Interrupted, Some(&message)).await?;
                }
            }
        }
        Ok(())
    }

    fn spawn(self: &Arc<Self>, id: String, plan: BatchPlan, qrels: Option<String>) {
        let cancel = Cancel::default();
        let (done_tx, done_rx) = watch::channel(false);
        self.live_map().insert(id.clone(), Live { cancel: cancel.clone(), finished: done_rx });
        let jobs = self.clone();
        tokio::spawn(async move {
            let result = jobs.run(&id, Arc::new(plan), qrels, &cancel).await;
            if let Err(e) = result {
                tracing::error!(job = %id, "batch job failed: {e}");
                let _ = jobs.store.set_status(&id, JobStatus::Failed, Some(&e.to_string())).await;
            }
            // Retention: the newest finished jobs stay, older ones go with their runs.
            match jobs.store.keep_finished(jobs.config.batch.keep_finished_jobs).await {
                Ok(0) => {}
                Ok(n) => tracing::info!("deleted {n} finished jobs beyond batch.keep_finished_jobs"),
                Err(e) => tracing::warn!("job retention: {e}"),
            }
            jobs.live_map().remove(&id);
            let _ = done_tx.send(true);
        });
    }

    async fn run(
        &self,
        id: &str,
        plan: Arc<BatchPlan>,
        qrels: Option<String>,
        cancel: &Cancel,
    ) -> Result<(), JobError> {
        let _permit = self.permits.clone().acquire_owned().await.map_err(|e| JobError::Worker(e.to_string()))?;
        if cancel.is_cancelled() {
            return Ok(());
        }
        self.store.set_status(id, JobStatus::Running, None).await?;
        let finished: std::collections::HashSet<i64> = self.store.finished_topics(id).await?.into_iter().collect();
        for seq in 0..plan.topics.len() {
            if finished.contains(&(seq as i64)) {
                continue;
            }
            if cancel.is_cancelled() {
                return Ok(());
            }
            let (engine, plan_ref, topic_cancel) = (self.engine.clone(), plan.clone(), cancel.clone());
            let ranked =
                tokio::task::spawn_blocking(move || plan_ref.run_topic(&engine, &plan_ref.topics[seq], &topic_cancel))
                    .await
                    .map_err(|e| JobError::Worker(e.to_string()))?;
            let ranked = match ranked {
                // Cancelled while the model scored this topic: the job stops where it was.
                Err(_) if cancel.is_cancelled() => return Ok(()),
                ranked => ranked?,
            };
            let qid = &plan.topics[seq].qid;
            let mut run = Run { tag: plan.tag.clone(), ..Default::default() };
            run.topics.insert(qid.clone(), ranked.scored);
            let mut text = Vec::new();
            run.write(&mut text).expect("writing to memory");
            self.store.add_topic(id, seq as i64, qid, &String::from_utf8_lossy(&text), ranked.flops).await?;
            crate::hooks::point("batch.topic");
        }
        let (metrics, warnings) = self.evaluate(id, &plan, qrels.as_deref()).await?;
        let metrics = metrics.map(|m| serde_json::to_string(&m).unwrap_or_default());
        let warnings = serde_json::to_string(&warnings).unwrap_or_default();
        self.store.finish(id, JobStatus::Done, metrics.as_deref(), &warnings).await?;
        Ok(())
    }

    /// Metrics of the run exactly as `GET /batch/{id}/run` serves it.
    /// The run's warnings, and its metrics when there are qrels.
    async fn evaluate(
        &self,
        id: &str,
        plan: &BatchPlan,
        qrels: Option<&str>,
    ) -> Result<(Option<Metrics>, Vec<Warning>), JobError> {
        let run = Run::parse(&self.store.run_text(id).await?, &eval::formats::upload_path("run"))?;
        let qrels = qrels.map(|q| Qrels::parse(q, &eval::formats::upload_path("qrels"))).transpose()?;
        let topics: Vec<&str> = plan.topics.iter().map(|t| t.qid.as_str()).collect();
        let warnings = eval::warnings::of_batch(&run, &topics, qrels.as_ref()).list();
        let Some(qrels) = qrels else { return Ok((None, warnings)) };
        let evaluation = eval::evaluate(&run, &qrels, &Measure::all(), EvalOptions::default());
        let per_topic = evaluation.per_topic.iter().map(|(q, v)| (q.clone(), v.iter().cloned().collect())).collect();
        Ok((Some(Metrics { all: evaluation.all_map(), per_topic: Some(per_topic) }), warnings))
    }

    pub async fn get(&self, id: &str) -> Result<JobView, JobError> {
        let row = self.store.job(id).await?.ok_or_else(|| JobError::UnknownJob(id.to_string()))?;
        Ok(view(row))
    }

    /// Every job, newest first.
    /// A page of jobs, newest first, without per-topic metrics, and how many jobs there are.
    pub async fn list(&self, offset: usize, limit: usize) -> Result<(Vec<JobView>, i64), JobError> {
        let (rows, total) = self.store.jobs(offset, limit).await?;
        Ok((rows.into_iter().map(view).collect(), total))
    }

    /// Waits until a job of this process finishes (immediately for others).
    pub async fn wait(&self, id: &str) -> Result<JobView, JobError> {
        let live = self.live_map().get(id).cloned();
        if let Some(mut live) = live {
            let _ = live.finished.wait_for(|done| *done).await;
        }
        self.get(id).await
    }

    /// The TREC run of a finished job.
    /// The run of a finished job as a stream of parts (topics in topic-file order), never whole in memory.
    pub async fn run_file(
        &self,
        id: &str,
    ) -> Result<impl futures_util::Stream<Item = Result<String, StoreError>> + Send + 'static, JobError> {
        let row = self.store.job(id).await?.ok_or_else(|| JobError::UnknownJob(id.to_string()))?;
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
        let row = self.store.job(id).await?.ok_or_else(|| JobError::UnknownJob(id.to_string()))?;
        if row.status.is_finished() {
            self.store.delete_job(id).await?;
            return Ok(None);
        }
        if let Some(live) = self.live_map().get(id) {
            live.cancel.cancel();
        }
        self.store.set_status(id, JobStatus::Cancelled, None).await?;
        self.get(id).await.map(Some)
    }

    /// What `longrank compare` gives for two finished jobs with qrels (the first job's qrels judge both).
    pub async fn compare(&self, a: &str, b: &str) -> Result<Vec<Comparison>, JobError> {
        let mut evaluations = Vec::new();
        let qrels_a = self.store.job(a).await?.ok_or_else(|| JobError::UnknownJob(a.to_string()))?.qrels;
        for id in [a, b] {
            let row = self.store.job(id).await?.ok_or_else(|| JobError::UnknownJob(id.to_string()))?;
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

    fn live_map(&self) -> parking_lot::MutexGuard<'_, HashMap<String, Live>> {
        self.live.lock()
    }
}

fn view(row: JobRow) -> JobView {
    let json = |s: &str| serde_json::from_str(s).unwrap_or(serde_json::Value::Null);
    JobView {
        progress: Progress { done: row.done, total: row.total },
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
