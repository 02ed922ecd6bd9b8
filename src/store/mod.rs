//! The database through sqlx: batch jobs, their runs topic by topic, the tasks that write collections
//! (`tasks`), and the query log. SQLite (WAL, a file in the data directory) by default, or PostgreSQL, which
//! several replicas share. One SQL text serves both (`$N` parameters, which sqlx's SQLite driver binds by
//! number, and no JSON functions), run through sqlx's `Any` driver; each backend's schema lives in
//! `migrations/sqlite` and `migrations/postgres`, version for version, applied at start. Queries are checked at
//! run time (sqlx's compile-time macros would need a database at build time).

use std::path::Path;

mod leases;
mod replicas;
mod tasks;
mod versions;

pub use leases::{Claim, Committed, Completion, Lane, Serves};
pub use replicas::{ReplicaRow, StrandedJob};
pub use tasks::{KeyedRequest, TaskFilter, TaskKind, TaskOutcome, TaskRow, TaskStatus};
pub use versions::{ObjectsState, VersionRow, WriterLease};

use serde::{Deserialize, Serialize};
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Executor, Row};

use crate::config::{redact_url, sqlite_url};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Sqlx(#[from] sqlx::Error),
    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("store url {url}: the scheme is neither sqlite: nor postgres:")]
    Scheme { url: String },
    #[error("creating {path}, the directory of the SQLite store: {source}")]
    Directory { path: String, source: std::io::Error },
}

impl StoreError {
    /// The database did not answer: no connection within `ACQUIRE_TIMEOUT`, or one that broke (PostgreSQL down
    /// or unreachable). A request then answers 503 at once rather than wait.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StoreError::Sqlx(sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_)))
    }

    /// A row whose unique key another row holds (two submissions with one Idempotency-Key at once).
    pub fn is_duplicate(&self) -> bool {
        matches!(self, StoreError::Sqlx(sqlx::Error::Database(e)) if e.is_unique_violation())
    }
}

/// The database behind a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    /// The backend a store URL names by its scheme.
    fn of_url(url: &str) -> Option<Backend> {
        match url.split(':').next()? {
            "sqlite" => Some(Backend::Sqlite),
            "postgres" | "postgresql" => Some(Backend::Postgres),
            _ => None,
        }
    }
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
    /// The client's Idempotency-Key.
    pub idempotency_key: Option<&'a str>,
}

/// A job submitted with an Idempotency-Key, and what it was submitted with.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyedJob {
    pub id: String,
    pub params: String,
    pub topics: String,
    pub qrels: Option<String>,
    pub rerank: Option<String>,
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
    pool: AnyPool,
    backend: Backend,
    /// Where it connects (for `alone`).
    url: std::sync::Arc<str>,
}

/// How long a query waits for a connection: the pool's few connections are each held for a short statement or
/// transaction, so a longer wait means a database that does not answer (sqlx's default, 30 s, held every request
/// that long while PostgreSQL was down).
const ACQUIRE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// `PRAGMA auto_vacuum`'s value for incremental vacuum.
const INCREMENTAL_VACUUM: i64 = 2;

/// Pages one step of `Store::reclaim` hands back (4 KiB each: 8 MiB).
const RECLAIM_PAGES: i64 = 2048;

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
    /// Opens (creating if needed) the SQLite database at `path` and applies the migrations.
    pub async fn open(path: &Path) -> Result<Store, StoreError> {
        Store::connect(&sqlite_url(path)).await
    }

    /// Connects to `sqlite://PATH` (the file and its directories created if missing: a fresh data directory
    /// is a first start, not an error) or `postgres://…` and applies the migrations.
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        sqlx::any::install_default_drivers();
        let backend = Backend::of_url(url).ok_or_else(|| StoreError::Scheme { url: redact_url(url) })?;
        if backend == Backend::Sqlite {
            create_sqlite_directory(url)?;
        }
        if backend == Backend::Sqlite {
            Store::incremental_vacuum(url).await?;
        }
        let pool = Store::pool(
            url,
            backend,
            match backend {
                Backend::Sqlite => 4,
                Backend::Postgres => 8,
            },
        )
        .await?;
        match backend {
            Backend::Sqlite => sqlx::migrate!("./migrations/sqlite").run(&pool).await?,
            Backend::Postgres => sqlx::migrate!("./migrations/postgres").run(&pool).await?,
        }
        Ok(Store { pool, backend, url: url.into() })
    }

    /// The same database through one connection of its own (its schema already migrated): for a writer that
    /// must neither wait behind the shared pool nor make its users wait (the query log).
    pub async fn alone(&self) -> Result<Store, StoreError> {
        let pool = Store::pool(&self.url, self.backend, 1).await?;
        Ok(Store { pool, backend: self.backend, url: self.url.clone() })
    }

    async fn pool(url: &str, backend: Backend, connections: u32) -> Result<AnyPool, StoreError> {
        let options = AnyPoolOptions::new().max_connections(connections).acquire_timeout(ACQUIRE_TIMEOUT);
        Ok(match backend {
            Backend::Sqlite => {
                options
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            // With WAL, NORMAL survives a process crash (kill -9); only power loss can drop the
                            // last commits.
                            conn.execute(
                                "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; \
                                 PRAGMA busy_timeout = 10000;",
                            )
                            .await?;
                            Ok(())
                        })
                    })
                    .connect(url)
                    .await?
            }
            Backend::Postgres => options.connect(url).await?,
        })
    }

    /// SQLite keeps the pages of deleted rows (old jobs' runs) in its file: an incremental-vacuum database can
    /// hand them back in small steps (`reclaim`). A new database is made so; one made before is changed once,
    /// at its next opening, by a VACUUM out of WAL mode (VACUUM cannot change the setting in it; it writes the
    /// whole file once). Best effort: while another process holds the file, it stays as it is until later.
    async fn incremental_vacuum(url: &str) -> Result<(), StoreError> {
        use sqlx::Connection;
        let mut conn = sqlx::SqliteConnection::connect(url).await?;
        let mode: i64 = sqlx::query("PRAGMA auto_vacuum").fetch_one(&mut conn).await?.try_get(0)?;
        if mode != INCREMENTAL_VACUUM {
            conn.execute("PRAGMA busy_timeout = 10000").await?;
            // Another process with the file open keeps it in WAL mode: then not now.
            let journal: String = sqlx::query("PRAGMA journal_mode = DELETE").fetch_one(&mut conn).await?.try_get(0)?;
            if journal == "delete" {
                conn.execute("PRAGMA auto_vacuum = INCREMENTAL").await?;
                if let Err(e) = conn.execute("VACUUM").await {
                    tracing::warn!("the store's file keeps its deleted pages for now (VACUUM: {e})");
                }
            }
        }
        conn.close().await?;
        Ok(())
    }

    /// Hands the pages that deleted rows left back to the file system (SQLite; PostgreSQL's autovacuum does
    /// its own), a few megabytes per write transaction, so that readers never wait (WAL) and writers briefly.
    pub async fn reclaim(&self) -> Result<(), StoreError> {
        if self.backend != Backend::Sqlite {
            return Ok(());
        }
        loop {
            let free: i64 = sqlx::query("PRAGMA freelist_count").fetch_one(&self.pool).await?.try_get(0)?;
            if free == 0 {
                return Ok(());
            }
            sqlx::query(&format!("PRAGMA incremental_vacuum({RECLAIM_PAGES})")).execute(&self.pool).await?;
            tokio::task::yield_now().await;
        }
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Whether replicas share this store (PostgreSQL): each then serves a read-only copy of the collections
    /// and takes only the batch topics it can run exactly. A SQLite store has one process.
    pub fn shared(&self) -> bool {
        self.backend == Backend::Postgres
    }

    /// Stores a queued job with its topics, free for any replica's workers to claim.
    pub async fn create_job(&self, job: NewJob<'_>) -> Result<(), StoreError> {
        let now = now_rfc3339();
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO jobs (id, status, created_at, updated_at, params, topics, qrels, rerank, provenance, total, \
             fingerprint, weights, idempotency_key) VALUES ($1, 'queued', $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
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
        .bind(job.idempotency_key)
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

    /// The job submitted with this Idempotency-Key, if any (kept as long as the job is).
    pub async fn job_by_idempotency_key(&self, key: &str) -> Result<Option<KeyedJob>, StoreError> {
        let row = sqlx::query("SELECT id, params, topics, qrels, rerank FROM jobs WHERE idempotency_key = $1")
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        let keyed = |r: AnyRow| -> Result<KeyedJob, sqlx::Error> {
            Ok(KeyedJob {
                id: r.try_get(0)?,
                params: r.try_get(1)?,
                topics: r.try_get(2)?,
                qrels: r.try_get(3)?,
                rerank: r.try_get(4)?,
            })
        };
        Ok(row.map(keyed).transpose()?)
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

    /// Logs searches in one transaction, keeping the newest `keep` entries.
    pub async fn log_queries(&self, entries: &[QueryLogEntry<'_>], keep: usize) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        let at = now_rfc3339();
        let rows: Vec<String> = (0..entries.len())
            .map(|i| {
                let n = 6 * i;
                format!("(${}, ${}, ${}, ${}, ${}, ${})", n + 1, n + 2, n + 3, n + 4, n + 5, n + 6)
            })
            .collect();
        let sql = format!(
            "INSERT INTO query_log (at, query, collection, pipeline, latency_ms, results) VALUES {}",
            rows.join(", ")
        );
        let mut insert = sqlx::query(&sql);
        for entry in entries {
            insert = insert
                .bind(at.as_str())
                .bind(entry.query)
                .bind(entry.collection)
                .bind(entry.pipeline)
                .bind(entry.latency_ms)
                .bind(entry.results);
        }
        let mut tx = self.pool.begin().await?;
        insert.execute(&mut *tx).await?;
        let newest: i64 = sqlx::query("SELECT MAX(id) FROM query_log").fetch_one(&mut *tx).await?.try_get(0)?;
        // Ids grow by one per entry: everything `keep` behind the newest goes (a range on the primary key).
        sqlx::query("DELETE FROM query_log WHERE id <= $1").bind(newest - keep as i64).execute(&mut *tx).await?;
        tx.commit().await?;
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

    /// SQLite's `PRAGMA integrity_check`: "ok" when the file is sound (none for PostgreSQL, which checks its
    /// own pages).
    pub async fn integrity_check(&self) -> Result<Option<String>, StoreError> {
        if self.backend != Backend::Sqlite {
            return Ok(None);
        }
        Ok(Some(sqlx::query("PRAGMA integrity_check").fetch_one(&self.pool).await?.try_get::<String, _>(0)?))
    }
}

/// `{"all": …}` of a job's metrics, for lists.
fn means_of(metrics: Option<&str>) -> Option<String> {
    let all = serde_json::from_str::<serde_json::Value>(metrics?).ok()?.get("all")?.clone();
    Some(serde_json::json!({ "all": all }).to_string())
}

/// Creates the directory of the SQLite file a `sqlite:` URL names (none for an in-memory database).
fn create_sqlite_directory(url: &str) -> Result<(), StoreError> {
    let options: sqlx::sqlite::SqliteConnectOptions = url.parse()?;
    match options.get_filename().parent() {
        Some(dir) if !dir.as_os_str().is_empty() => std::fs::create_dir_all(dir)
            .map_err(|source| StoreError::Directory { path: dir.display().to_string(), source }),
        _ => Ok(()),
    }
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

/// The current UTC time as RFC 3339 with milliseconds (sortable as text).
pub fn now_rfc3339() -> String {
    crate::timestamp::rfc3339(std::time::SystemTime::now())
}

/// Stores for the tests to run against: SQLite, and PostgreSQL when `LONGRANK_TEST_POSTGRES` names a server
/// (`postgres://USER:PASSWORD@HOST:PORT/DB`, a user that may create databases; `scripts/postgres.sh start`
/// makes one), each a fresh database. `LONGRANK_EXPECT_POSTGRES` (set by CI) makes a missing server an error.
#[doc(hidden)]
pub mod testing {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use sqlx::Connection;

    #[cfg(test)]
    use super::Store;

    /// The stores, with the SQLite one's directory (kept while the test runs).
    #[cfg(test)]
    pub async fn stores() -> (Vec<Store>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let mut stores = vec![Store::open(&dir.path().join("db.sqlite")).await.unwrap()];
        if let Some(url) = fresh_postgres().await {
            stores.push(Store::connect(&url).await.unwrap());
        }
        (stores, dir)
    }

    /// The URL of a new, empty database on the test server.
    pub async fn fresh_postgres() -> Option<String> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let Ok(url) = std::env::var("LONGRANK_TEST_POSTGRES") else {
            assert!(
                std::env::var_os("LONGRANK_EXPECT_POSTGRES").is_none(),
                "LONGRANK_EXPECT_POSTGRES is set but LONGRANK_TEST_POSTGRES names no server"
            );
            return None;
        };
        sqlx::any::install_default_drivers();
        let name = format!("longrank_test_{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let mut admin = sqlx::AnyConnection::connect(&url).await.expect("connecting to LONGRANK_TEST_POSTGRES");
        sqlx::query(&format!("DROP DATABASE IF EXISTS {name}")).execute(&mut admin).await.unwrap();
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut admin).await.unwrap();
        let (server, query) = url.split_once('?').map_or((url.as_str(), None), |(s, q)| (s, Some(q)));
        let server = server.rsplit_once('/').map_or(server, |(s, _)| s);
        Some(format!("{server}/{name}{}", query.map(|q| format!("?{q}")).unwrap_or_default()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A first start on a data directory that does not exist yet (README's quick start on a fresh clone).
    #[tokio::test]
    async fn a_sqlite_store_creates_its_directories() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new").join("data dir?#%").join("longrank.db");
        Store::connect(&sqlite_url(&path)).await.unwrap();
        assert!(path.is_file());
        Store::connect("sqlite::memory:").await.unwrap();
    }

    #[tokio::test]
    async fn jobs_round_trip_and_resume_points() {
        for store in testing::stores().await.0 {
            jobs_round_trip(&store).await;
        }
    }

    /// A job's Idempotency-Key finds it with what it was submitted with; a second job with the key is a
    /// duplicate; jobs without a key are any number.
    #[tokio::test]
    async fn an_idempotency_key_names_one_job() {
        for store in testing::stores().await.0 {
            let keyed =
                NewJob { id: "k1", topics: "1\tx\n", total: 1, idempotency_key: Some("key"), ..NewJob::default() };
            store.create_job(keyed).await.unwrap();
            let found = store.job_by_idempotency_key("key").await.unwrap().unwrap();
            assert_eq!((found.id.as_str(), found.topics.as_str(), found.qrels), ("k1", "1\tx\n", None));
            assert_eq!(store.job_by_idempotency_key("other").await.unwrap(), None);
            let again = NewJob { id: "k2", total: 1, idempotency_key: Some("key"), ..NewJob::default() };
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
    async fn lists_retention_and_the_query_log() {
        for store in testing::stores().await.0 {
            lists_and_retention(&store).await;
            query_log(&store).await;
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

    /// Deleting old jobs hands their pages back: the database shrinks (SQLite; set to incremental vacuum at
    /// its first opening, or by one VACUUM when it was made without).
    #[tokio::test]
    async fn deleted_jobs_give_their_space_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        let store = Store::open(&path).await.unwrap();
        let pages = |store: Store| async move {
            let count: i64 = sqlx::query("PRAGMA page_count").fetch_one(&store.pool).await.unwrap().try_get(0).unwrap();
            count
        };
        let empty = pages(store.clone()).await;
        let topics = format!("1\t{}\n", "word ".repeat(40_000));
        store.create_job(NewJob { id: "big", topics: &topics, total: 1, ..NewJob::default() }).await.unwrap();
        store.set_status("big", JobStatus::Cancelled, None).await.unwrap();
        let grown = pages(store.clone()).await;
        assert!(grown > empty + 40, "{empty} -> {grown}");
        assert_eq!(store.keep_finished(1).await.unwrap(), 0);
        store.delete_job("big").await.unwrap();
        assert!(pages(store.clone()).await <= empty + 1, "{empty} -> {grown} -> {}", pages(store.clone()).await);
        // A database made without incremental vacuum is switched at its next opening.
        drop(store);
        let old = dir.path().join("old.sqlite");
        let pool = sqlx::SqlitePool::connect(&sqlite_url(&old)).await.unwrap();
        sqlx::query("CREATE TABLE t (x TEXT)").execute(&pool).await.unwrap();
        pool.close().await;
        let reopened = Store::open(&old).await.unwrap();
        let mode: i64 = sqlx::query("PRAGMA auto_vacuum").fetch_one(&reopened.pool).await.unwrap().try_get(0).unwrap();
        assert_eq!(mode, INCREMENTAL_VACUUM);
    }

    async fn query_log(store: &Store) {
        let entry = |query| QueryLogEntry { query, collection: None, pipeline: "bm25", latency_ms: 1.5, results: 3 };
        store.log_queries(&[entry("a"), entry("b"), entry("c")], 2).await.unwrap();
        assert_eq!((store.query_log_len().await.unwrap(), store.queries_logged().await.unwrap()), (2, 3));
        // Through a connection of its own, as the server's writer logs.
        store.alone().await.unwrap().log_queries(&[entry("d"), entry("e")], 2).await.unwrap();
        assert_eq!((store.query_log_len().await.unwrap(), store.queries_logged().await.unwrap()), (2, 5));
    }
}
