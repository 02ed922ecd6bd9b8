//! The embedded SQLite database (WAL) through sqlx: batch jobs, their runs topic by topic, the tasks that
//! write collections (`tasks`), and the query log. The schema lives in `migrations/`, applied at start. Queries are checked at run time (sqlx's
//! compile-time macros would need a database at build time).

use std::path::Path;
use std::str::FromStr;

mod tasks;

pub use tasks::{TaskFilter, TaskKind, TaskOutcome, TaskRow, TaskStatus};

use serde::{Deserialize, Serialize};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Sqlx(#[from] sqlx::Error),
    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

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
}

/// What a new job starts with.
pub struct NewJob<'a> {
    pub id: &'a str,
    pub params: &'a str,
    pub topics: &'a str,
    pub qrels: Option<&'a str>,
    pub rerank: Option<&'a str>,
    pub provenance: &'a str,
    pub total: i64,
}

/// One search, for the query log.
pub struct QueryLogEntry<'a> {
    pub query: &'a str,
    pub collection: Option<&'a str>,
    pub pipeline: &'a str,
    pub latency_ms: f64,
    pub results: i64,
}

#[derive(Clone)]
pub struct Store {
    pool: SqlitePool,
}

/// `JOB_COLUMNS` without the files and with `metrics` cut to the means (`{all}`), for lists.
const SUMMARY_COLUMNS: &str =
    "id, status, created_at, updated_at, params, '' AS topics, NULL AS qrels, NULL AS rerank, provenance, total, \
    warnings, CASE WHEN metrics IS NULL THEN NULL ELSE json_object('all', json(json_extract(metrics, '$.all'))) END \
    AS metrics, error, (SELECT COUNT(*) FROM job_topics t WHERE t.job_id = jobs.id) AS done, \
    (SELECT SUM(flops) FROM job_topics t WHERE t.job_id = jobs.id) AS flops";

const JOB_COLUMNS: &str =
    "id, status, created_at, updated_at, params, topics, qrels, rerank, provenance, total, warnings, \
    metrics, error, (SELECT COUNT(*) FROM job_topics t WHERE t.job_id = jobs.id) AS done, \
    (SELECT SUM(flops) FROM job_topics t WHERE t.job_id = jobs.id) AS flops";

impl Store {
    /// Opens (creating if needed) the database and applies the migrations.
    pub async fn open(path: &Path) -> Result<Store, StoreError> {
        if let Some(parent) = path.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // With WAL, NORMAL survives a process crash (kill -9); only power loss can drop the last commits.
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(std::time::Duration::from_secs(10));
        let pool = SqlitePoolOptions::new().max_connections(4).connect_with(options).await?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        Ok(Store { pool })
    }

    pub async fn create_job(&self, job: NewJob<'_>) -> Result<(), StoreError> {
        let now = now_rfc3339();
        sqlx::query(
            "INSERT INTO jobs (id, status, created_at, updated_at, params, topics, qrels, rerank, provenance, total) \
             VALUES (?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?)",
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
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Moves a job that is not finished to `status` (a cancelled or failed job stays so).
    pub async fn set_status(&self, id: &str, status: JobStatus, error: Option<&str>) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE jobs SET status = ?, error = COALESCE(?, error), updated_at = ? \
             WHERE id = ? AND status IN ('queued', 'running')",
        )
        .bind(status.as_str())
        .bind(error)
        .bind(now_rfc3339())
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Records a finished topic; a topic already recorded (a resumed job) is left as it was.
    pub async fn add_topic(
        &self,
        id: &str,
        seq: i64,
        qid: &str,
        run: &str,
        flops: Option<f64>,
    ) -> Result<(), StoreError> {
        sqlx::query("INSERT OR IGNORE INTO job_topics (job_id, seq, qid, run, flops) VALUES (?, ?, ?, ?, ?)")
            .bind(id)
            .bind(seq)
            .bind(qid)
            .bind(run)
            .bind(flops)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Positions of the topics already finished.
    pub async fn finished_topics(&self, id: &str) -> Result<Vec<i64>, StoreError> {
        let rows = sqlx::query("SELECT seq FROM job_topics WHERE job_id = ? ORDER BY seq")
            .bind(id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| r.try_get::<i64, _>("seq").map_err(StoreError::from)).collect()
    }

    /// Completes a running job (unless it was cancelled meanwhile).
    pub async fn finish(
        &self,
        id: &str,
        status: JobStatus,
        metrics: Option<&str>,
        warnings: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE jobs SET status = ?, metrics = ?, warnings = ?, updated_at = ? WHERE id = ? AND status = 'running'",
        )
        .bind(status.as_str())
        .bind(metrics)
        .bind(warnings)
        .bind(now_rfc3339())
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn job(&self, id: &str) -> Result<Option<JobRow>, StoreError> {
        let row = sqlx::query(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| job_row(&r)).transpose()
    }

    /// A page of jobs, newest first, without what only one job's view needs (the topic, qrels and rerank
    /// files, per-topic metrics), and how many jobs there are.
    pub async fn jobs(&self, offset: usize, limit: usize) -> Result<(Vec<JobRow>, i64), StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {SUMMARY_COLUMNS} FROM jobs ORDER BY created_at DESC, id DESC LIMIT ? OFFSET ?"
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
        sqlx::query("DELETE FROM jobs WHERE id = ?").bind(id).execute(&self.pool).await?;
        Ok(())
    }

    /// Deletes the finished jobs (with their runs) beyond the newest `keep`; 0 keeps every one.
    pub async fn keep_finished(&self, keep: usize) -> Result<u64, StoreError> {
        if keep == 0 {
            return Ok(0);
        }
        let deleted = sqlx::query(
            "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE status IN ('done', 'failed', 'cancelled', \
             'interrupted') ORDER BY created_at DESC, id DESC LIMIT -1 OFFSET ?)",
        )
        .bind(keep as i64)
        .execute(&self.pool)
        .await?;
        Ok(deleted.rows_affected())
    }

    /// Jobs a crash or restart cut off.
    pub async fn unfinished_jobs(&self) -> Result<Vec<JobRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE status IN ('queued', 'running') ORDER BY created_at, id"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(job_row).collect()
    }

    /// The ids of the jobs queued or running on `collection` (as their provenance records it).
    pub async fn unfinished_jobs_on(&self, collection: &str) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query(
            "SELECT id FROM jobs WHERE status IN ('queued', 'running') \
             AND json_extract(provenance, '$.collection.name') = ? ORDER BY created_at, id",
        )
        .bind(collection)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(|r| r.get::<String, _>("id")).collect())
    }

    /// The job's TREC run, topics in topic-file order.
    pub async fn run_text(&self, id: &str) -> Result<String, StoreError> {
        let rows = sqlx::query("SELECT run FROM job_topics WHERE job_id = ? ORDER BY seq")
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
        let rows = sqlx::query("SELECT seq, run FROM job_topics WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?")
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

    /// Logs a search, keeping the newest `keep` entries (0: logs nothing).
    pub async fn log_query(&self, entry: QueryLogEntry<'_>, keep: usize) -> Result<(), StoreError> {
        if keep == 0 {
            return Ok(());
        }
        let id = sqlx::query(
            "INSERT INTO query_log (at, query, collection, pipeline, latency_ms, results) VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(now_rfc3339())
        .bind(entry.query)
        .bind(entry.collection)
        .bind(entry.pipeline)
        .bind(entry.latency_ms)
        .bind(entry.results)
        .execute(&self.pool)
        .await?
        .last_insert_rowid();
        // Ids grow by one per entry: everything `keep` behind the newest goes (a range on the primary key).
        sqlx::query("DELETE FROM query_log WHERE id <= ?").bind(id - keep as i64).execute(&self.pool).await?;
        Ok(())
    }

    /// Entries in the query log.
    pub async fn query_log_len(&self) -> Result<i64, StoreError> {
        Ok(sqlx::query("SELECT COUNT(*) FROM query_log").fetch_one(&self.pool).await?.try_get(0)?)
    }

    /// Searches logged since the database was made (the newest entry's id).
    pub async fn queries_logged(&self) -> Result<i64, StoreError> {
        Ok(sqlx::query("SELECT COALESCE(MAX(id), 0) FROM query_log").fetch_one(&self.pool).await?.try_get(0)?)
    }

    /// `PRAGMA integrity_check`: "ok" when the database is sound.
    pub async fn integrity_check(&self) -> Result<String, StoreError> {
        Ok(sqlx::query("PRAGMA integrity_check").fetch_one(&self.pool).await?.try_get::<String, _>(0)?)
    }
}

fn job_row(r: &sqlx::sqlite::SqliteRow) -> Result<JobRow, StoreError> {
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
    })
}

/// The current UTC time as RFC 3339 with milliseconds (sortable as text).
pub fn now_rfc3339() -> String {
    crate::timestamp::rfc3339(std::time::SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_round_trip_and_resume_points() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).await.unwrap();
        let job =
            NewJob { id: "j1", params: "{}", topics: "1\tx\n", qrels: None, rerank: None, provenance: "{}", total: 2 };
        store.create_job(job).await.unwrap();
        store.add_topic("j1", 1, "2", "2 Q0 d 1 1 t\n", Some(2.5)).await.unwrap();
        store.add_topic("j1", 0, "1", "1 Q0 d 1 1 t\n", Some(1.0)).await.unwrap();
        store.add_topic("j1", 0, "1", "ignored\n", Some(9.0)).await.unwrap();
        assert_eq!(store.finished_topics("j1").await.unwrap(), vec![0, 1]);
        assert_eq!(store.run_text("j1").await.unwrap(), "1 Q0 d 1 1 t\n2 Q0 d 1 1 t\n");
        let row = store.job("j1").await.unwrap().unwrap();
        assert_eq!((row.status, row.done, row.total, row.flops), (JobStatus::Queued, 2, 2, Some(3.5)));
        assert_eq!(store.unfinished_jobs().await.unwrap().len(), 1);
        store.set_status("j1", JobStatus::Running, None).await.unwrap();
        store.finish("j1", JobStatus::Done, Some("{}"), "[]").await.unwrap();
        assert_eq!(store.job("j1").await.unwrap().unwrap().status, JobStatus::Done);
        store.set_status("j1", JobStatus::Cancelled, None).await.unwrap();
        assert_eq!(store.job("j1").await.unwrap().unwrap().status, JobStatus::Done, "finished jobs stay finished");
        assert!(store.unfinished_jobs().await.unwrap().is_empty());
        assert_eq!(store.integrity_check().await.unwrap(), "ok");
    }
}
