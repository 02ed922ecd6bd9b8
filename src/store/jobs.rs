//! The jobs table: batch jobs as submitted, their status, and their runs read back topic by topic (the topics'
//! queue is `leases`).

use serde::{Deserialize, Serialize};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::{now_rfc3339, KeyedRequest, Store, StoreError};

/// A job's lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    Queued,
    Running,
    Done,
    Failed,
    Cancelled,
    Interrupted,
}

impl JobStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Queued => "queued",
            JobStatus::Running => "running",
            JobStatus::Done => "done",
            JobStatus::Failed => "failed",
            JobStatus::Cancelled => "cancelled",
            JobStatus::Interrupted => "interrupted",
        }
    }

    fn parse(s: &str) -> JobStatus {
        match s {
            "queued" => JobStatus::Queued,
            "running" => JobStatus::Running,
            "done" => JobStatus::Done,
            "failed" => JobStatus::Failed,
            "cancelled" => JobStatus::Cancelled,
            _ => JobStatus::Interrupted,
        }
    }

    pub fn is_finished(self) -> bool {
        matches!(self, JobStatus::Done | JobStatus::Failed | JobStatus::Cancelled | JobStatus::Interrupted)
    }
}

/// A job as stored.
#[derive(Debug, Clone)]
pub struct JobRow {
    pub id: String,
    pub status: JobStatus,
    pub created_at: String,
    pub updated_at: String,
    pub params: String,
    pub topics: String,
    pub qrels: Option<String>,
    pub rerank: Option<String>,
    pub provenance: String,
    pub total: i64,
    pub done: i64,
    /// Model FLOPs summed over the finished topics that have a count.
    pub flops: Option<f64>,
    pub warnings: String,
    pub metrics: Option<String>,
    pub error: Option<String>,
    /// When its first topic was claimed, milliseconds since the epoch (by the database's clock).
    pub started_ms: Option<i64>,
    /// Since when no live replica serves its index files and model weights (milliseconds, the database's clock).
    pub stranded_ms: Option<i64>,
    /// The fingerprint of the index files it was submitted against.
    pub fingerprint: Option<String>,
    /// The weights hash of its model (none for first-stage pipelines).
    pub weights: Option<String>,
}

/// What a new job starts with.
#[derive(Default)]
pub struct NewJob<'a> {
    pub id: &'a str,
    pub params: &'a str,
    pub topics: &'a str,
    pub qrels: Option<&'a str>,
    pub rerank: Option<&'a str>,
    pub provenance: &'a str,
    pub total: i64,
    /// The collection's fingerprint at submission.
    pub fingerprint: Option<&'a str>,
    /// The model's weights hash (re-ranking pipelines).
    pub weights: Option<&'a str>,
    /// The client's Idempotency-Key, and a digest of the submission.
    pub keyed: Option<&'a KeyedRequest>,
}

/// `JOB_COLUMNS` without the files and with `metrics` cut to the means (`{all}`), for lists.
const SUMMARY_COLUMNS: &str =
    "id, status, created_at, updated_at, params, '' AS topics, NULL AS qrels, NULL AS rerank, provenance, total, \
    warnings, metrics_all AS metrics, error, started_ms, stranded_ms, fingerprint, weights, (SELECT COUNT(*) FROM job_topics t WHERE t.job_id = jobs.id) AS done, \
    (SELECT SUM(flops) FROM job_topics t WHERE t.job_id = jobs.id) AS flops";

const JOB_COLUMNS: &str =
    "id, status, created_at, updated_at, params, topics, qrels, rerank, provenance, total, warnings, \
    metrics, error, started_ms, stranded_ms, fingerprint, weights, (SELECT COUNT(*) FROM job_topics t WHERE t.job_id = jobs.id) AS done, \
    (SELECT SUM(flops) FROM job_topics t WHERE t.job_id = jobs.id) AS flops";

impl Store {
    /// Stores a queued job with its topics, free for any replica's workers to claim.
    pub async fn create_job(&self, job: NewJob<'_>) -> Result<(), StoreError> {
        let now = now_rfc3339();
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO jobs (id, status, created_at, updated_at, params, topics, qrels, rerank, provenance, total, \
             fingerprint, weights, idempotency_key, request) \
             VALUES ($1, 'queued', $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
        )
        .bind(job.id)
        .bind(&now)
        .bind(&now)
        .bind(job.params)
        .bind(job.topics)
        .bind(job.qrels)
        .bind(job.rerank)
        .bind(job.provenance)
        .bind(job.total)
        .bind(job.fingerprint)
        .bind(job.weights)
        .bind(job.keyed.map(|k| k.key.as_str()))
        .bind(job.keyed.map(|k| k.request.as_str()))
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "WITH RECURSIVE s(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM s WHERE n + 1 < $2) \
             INSERT INTO job_tasks (job_id, seq) SELECT $1, n FROM s WHERE n < $2",
        )
        .bind(job.id)
        .bind(job.total)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The job submitted with this Idempotency-Key, if any (kept as long as the job is), and its submission's
    /// digest.
    pub async fn job_by_idempotency_key(&self, key: &str) -> Result<Option<(String, Option<String>)>, StoreError> {
        let row = sqlx::query("SELECT id, request FROM jobs WHERE idempotency_key = $1")
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| Ok::<_, sqlx::Error>((r.try_get(0)?, r.try_get(1)?))).transpose()?)
    }

    /// Moves a job that is not finished to `status` (a cancelled or failed job stays so).
    pub async fn set_status(&self, id: &str, status: JobStatus, error: Option<&str>) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE jobs SET status = $1, error = COALESCE($2, error), updated_at = $3 \
             WHERE id = $4 AND status IN ('queued', 'running')",
        )
        .bind(status.as_str())
        .bind(error)
        .bind(now_rfc3339())
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// A job's status alone (none: no such job).
    pub async fn job_status(&self, id: &str) -> Result<Option<JobStatus>, StoreError> {
        let row = sqlx::query("SELECT status FROM jobs WHERE id = $1").bind(id).fetch_optional(&self.pool).await?;
        row.map(|r| Ok(JobStatus::parse(r.try_get(0)?))).transpose()
    }

    pub async fn job(&self, id: &str) -> Result<Option<JobRow>, StoreError> {
        let row = sqlx::query(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| job_row(&r)).transpose()
    }

    /// A page of jobs, newest first, without what only one job's view needs (the topic, qrels and rerank
    /// files, per-topic metrics), and how many jobs there are.
    pub async fn jobs(&self, offset: usize, limit: usize) -> Result<(Vec<JobRow>, i64), StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {SUMMARY_COLUMNS} FROM jobs ORDER BY created_at DESC, id DESC LIMIT $1 OFFSET $2"
        ))
        .bind(limit as i64)
        .bind(offset as i64)
        .fetch_all(&self.pool)
        .await?;
        let total: i64 = sqlx::query("SELECT COUNT(*) FROM jobs").fetch_one(&self.pool).await?.try_get(0)?;
        Ok((rows.iter().map(job_row).collect::<Result<_, _>>()?, total))
    }

    /// Deletes a job with its run.
    pub async fn delete_job(&self, id: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM jobs WHERE id = $1").bind(id).execute(&self.pool).await?;
        self.reclaim().await
    }

    /// Deletes the finished jobs (with their runs) beyond the newest `keep`; 0 keeps every one.
    pub async fn keep_finished(&self, keep: usize) -> Result<u64, StoreError> {
        if keep == 0 {
            return Ok(0);
        }
        let deleted = sqlx::query(
            "DELETE FROM jobs WHERE status IN ('done', 'failed', 'cancelled', 'interrupted') AND id NOT IN \
             (SELECT id FROM jobs WHERE status IN ('done', 'failed', 'cancelled', 'interrupted') \
             ORDER BY created_at DESC, id DESC LIMIT $1)",
        )
        .bind(keep as i64)
        .execute(&self.pool)
        .await?;
        if deleted.rows_affected() > 0 {
            self.reclaim().await?;
        }
        Ok(deleted.rows_affected())
    }

    /// The ids of the jobs queued or running.
    pub async fn unfinished_jobs(&self) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query("SELECT id FROM jobs WHERE status IN ('queued', 'running') ORDER BY created_at, id")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| r.try_get::<String, _>(0).map_err(StoreError::from)).collect()
    }

    /// The ids of the jobs queued or running on `collection` (as their provenance records it).
    pub async fn unfinished_jobs_on(&self, collection: &str) -> Result<Vec<String>, StoreError> {
        // Unfinished jobs are few: their provenance is read here rather than with each backend's JSON functions.
        let rows = sqlx::query(
            "SELECT id, provenance FROM jobs WHERE status IN ('queued', 'running') ORDER BY created_at, id",
        )
        .fetch_all(&self.pool)
        .await?;
        let on = |provenance: &str| {
            let provenance = serde_json::from_str::<serde_json::Value>(provenance).unwrap_or_default();
            provenance.pointer("/collection/name").and_then(|n| n.as_str()) == Some(collection)
        };
        Ok(rows.iter().filter(|r| on(r.get("provenance"))).map(|r| r.get::<String, _>("id")).collect())
    }

    /// The job's TREC run, topics in topic-file order.
    pub async fn run_text(&self, id: &str) -> Result<String, StoreError> {
        let rows = sqlx::query("SELECT run FROM job_topics WHERE job_id = $1 ORDER BY seq")
            .bind(id)
            .fetch_all(&self.pool)
            .await?;
        let mut text = String::new();
        for row in rows {
            text.push_str(row.try_get::<&str, _>("run")?);
        }
        Ok(text)
    }

    /// Part of the job's TREC run: up to `topics` topics after position `after`, and the last position read
    /// (`None` past the end). A run streams in parts, so its size never sits in memory whole.
    pub async fn run_part(&self, id: &str, after: i64, topics: i64) -> Result<(String, Option<i64>), StoreError> {
        let rows = sqlx::query("SELECT seq, run FROM job_topics WHERE job_id = $1 AND seq > $2 ORDER BY seq LIMIT $3")
            .bind(id)
            .bind(after)
            .bind(topics)
            .fetch_all(&self.pool)
            .await?;
        let mut text = String::new();
        let mut last = None;
        for row in rows {
            text.push_str(row.try_get::<&str, _>("run")?);
            last = Some(row.try_get::<i64, _>("seq")?);
        }
        Ok((text, last))
    }
}

/// `{"all": …}` of a job's metrics, for lists.
pub(super) fn means_of(metrics: Option<&str>) -> Option<String> {
    let all = serde_json::from_str::<serde_json::Value>(metrics?).ok()?.get("all")?.clone();
    Some(serde_json::json!({ "all": all }).to_string())
}

fn job_row(r: &AnyRow) -> Result<JobRow, StoreError> {
    Ok(JobRow {
        id: r.try_get("id")?,
        status: JobStatus::parse(r.try_get("status")?),
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
        params: r.try_get("params")?,
        topics: r.try_get("topics")?,
        qrels: r.try_get("qrels")?,
        rerank: r.try_get("rerank")?,
        provenance: r.try_get("provenance")?,
        total: r.try_get("total")?,
        done: r.try_get("done")?,
        flops: r.try_get("flops")?,
        warnings: r.try_get("warnings")?,
        metrics: r.try_get("metrics")?,
        error: r.try_get("error")?,
        started_ms: r.try_get("started_ms")?,
        stranded_ms: r.try_get("stranded_ms")?,
        fingerprint: r.try_get("fingerprint")?,
        weights: r.try_get("weights")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{testing, Backend, Completion, Lane};

    #[tokio::test]
    async fn jobs_round_trip_and_resume_points() {
        for store in testing::stores().await.0 {
            jobs_round_trip(&store).await;
        }
    }

    /// A job's Idempotency-Key finds it with its submission's digest; a second job with the key is a
    /// duplicate; jobs without a key are any number.
    #[tokio::test]
    async fn an_idempotency_key_names_one_job() {
        for store in testing::stores().await.0 {
            let key = KeyedRequest::new("key", &[b"1\tx\n"]);
            let keyed = NewJob { id: "k1", topics: "1\tx\n", total: 1, keyed: Some(&key), ..NewJob::default() };
            store.create_job(keyed).await.unwrap();
            let found = store.job_by_idempotency_key("key").await.unwrap();
            assert_eq!(found, Some(("k1".to_string(), Some(key.request.clone()))));
            assert_eq!(store.job_by_idempotency_key("other").await.unwrap(), None);
            let again = NewJob { id: "k2", total: 1, keyed: Some(&key), ..NewJob::default() };
            assert!(store.create_job(again).await.unwrap_err().is_duplicate());
            for id in ["n1", "n2"] {
                store.create_job(NewJob { id, total: 1, ..NewJob::default() }).await.unwrap();
            }
        }
    }

    /// Claims and commits `n` topics (the oldest job's first), finishing jobs with `metrics`.
    async fn run_topics(store: &Store, n: usize, metrics: &str) {
        for _ in 0..n {
            let claim = store.claim_topic("r", 60_000, None, Lane::FirstStage).await.unwrap().unwrap();
            let line = format!("{} Q0 d 1 1 t\n", claim.seq);
            let complete = |_: &str| Ok(Completion { metrics: Some(metrics.into()), warnings: "[]".into() });
            store.commit_topic(&claim, &claim.seq.to_string(), &line, Some(1.5), complete).await.unwrap();
        }
    }

    async fn jobs_round_trip(store: &Store) {
        let job = NewJob { id: "j1", topics: "1\tx\n", total: 2, ..NewJob::default() };
        store.create_job(job).await.unwrap();
        assert_eq!(store.unfinished_jobs().await.unwrap().len(), 1);
        run_topics(store, 1, "{}").await;
        let row = store.job("j1").await.unwrap().unwrap();
        assert_eq!((row.status, row.done, row.total, row.flops), (JobStatus::Running, 1, 2, Some(1.5)));
        run_topics(store, 1, "{}").await;
        assert_eq!(store.run_text("j1").await.unwrap(), "0 Q0 d 1 1 t\n1 Q0 d 1 1 t\n");
        assert_eq!(store.job("j1").await.unwrap().unwrap().status, JobStatus::Done);
        store.set_status("j1", JobStatus::Cancelled, None).await.unwrap();
        assert_eq!(store.job("j1").await.unwrap().unwrap().status, JobStatus::Done, "finished jobs stay finished");
        assert!(store.unfinished_jobs().await.unwrap().is_empty());
        assert_eq!(store.job_status("j1").await.unwrap(), Some(JobStatus::Done));
        assert_eq!(store.job_status("nope").await.unwrap(), None);
        let sound = store.integrity_check().await.unwrap();
        assert_eq!(sound.as_deref(), (store.backend() == Backend::Sqlite).then_some("ok"));
    }

    #[tokio::test]
    async fn lists_and_retention_of_jobs() {
        for store in testing::stores().await.0 {
            lists_and_retention(&store).await;
        }
    }

    async fn lists_and_retention(store: &Store) {
        let create = |id: &'static str, collection: &str| {
            let provenance = format!("{{\"collection\": {{\"name\": \"{collection}\"}}}}");
            async move {
                let job = NewJob { id, provenance: &provenance, total: 3, ..NewJob::default() };
                store.create_job(job).await.unwrap();
            }
        };
        create("a", "robust04").await;
        create("b", "gov2").await;
        create("z", "robust04").await;
        assert_eq!(store.unfinished_jobs_on("robust04").await.unwrap(), ["a", "z"]);
        store.delete_job("z").await.unwrap();
        let metrics = r#"{"all": {"map": 0.5}, "per_topic": {"1": {"map": 0.5}}}"#;
        run_topics(store, 6, metrics).await; // a and b
        create("c", "robust04").await;
        assert_eq!(store.run_part("a", 0, 1).await.unwrap(), ("1 Q0 d 1 1 t\n".to_string(), Some(1)));
        assert_eq!(store.run_part("a", 2, 1).await.unwrap(), (String::new(), None));
        let (page, total) = store.jobs(0, 10).await.unwrap();
        assert_eq!(total, 3);
        let summary = page.iter().find(|j| j.id == "a").unwrap();
        assert_eq!(summary.metrics.as_deref(), Some(r#"{"all":{"map":0.5}}"#), "lists carry the means only");
        assert_eq!((summary.done, summary.topics.as_str(), summary.flops), (3, "", Some(4.5)));
        assert_eq!(store.job("a").await.unwrap().unwrap().metrics.as_deref(), Some(metrics));
        assert_eq!(store.keep_finished(1).await.unwrap(), 1, "one of the two finished jobs goes");
        assert_eq!(store.jobs(0, 10).await.unwrap().1, 2);
        assert!(store.job("c").await.unwrap().is_some(), "an unfinished job is never deleted");
        store.delete_job("c").await.unwrap();
        assert!(store.job("c").await.unwrap().is_none());
        assert_eq!(store.run_text("c").await.unwrap(), "", "its run goes with it");
    }
}
