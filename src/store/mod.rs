//! The database through sqlx: batch jobs, their runs topic by topic, the tasks that write collections
//! (`tasks`), and the query log. SQLite (WAL, a file in the data directory) by default, or PostgreSQL, which
//! several replicas share. One SQL text serves both (`$N` parameters, which sqlx's SQLite driver binds by
//! number, and no JSON functions), run through sqlx's `Any` driver; each backend's schema lives in
//! `migrations/sqlite` and `migrations/postgres`, version for version, applied at start. Queries are checked at
//! run time (sqlx's compile-time macros would need a database at build time).

use std::path::Path;

mod jobs;
mod leases;
mod replicas;
mod tasks;
mod versions;

pub use jobs::{JobRow, JobStatus, NewJob};
pub use leases::{Claim, Committed, Completion, Lane, Serves};
pub use replicas::{ReplicaRow, StrandedJob};
pub use tasks::{TaskFilter, TaskKind, TaskOutcome, TaskRow, TaskStatus};
pub use versions::{ObjectsState, VersionRow, WriterLease};

use sqlx::any::AnyPoolOptions;
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

/// Creates the directory of the SQLite file a `sqlite:` URL names (none for an in-memory database).
fn create_sqlite_directory(url: &str) -> Result<(), StoreError> {
    let options: sqlx::sqlite::SqliteConnectOptions = url.parse()?;
    match options.get_filename().parent() {
        Some(dir) if !dir.as_os_str().is_empty() => std::fs::create_dir_all(dir)
            .map_err(|source| StoreError::Directory { path: dir.display().to_string(), source }),
        _ => Ok(()),
    }
}

/// A write's Idempotency-Key and a digest of what it asked (a job's parameters and files; a task's route,
/// parameters and upload), kept with the job or task it made: one scheme for both. A repeat with the key and
/// the same digest answers the first; the key with another digest is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedRequest {
    pub key: String,
    pub request: String,
}

impl KeyedRequest {
    /// `key` given to the request made of `parts`.
    pub fn new(key: &str, parts: &[&[u8]]) -> KeyedRequest {
        let mut hash = crate::hash::Fnv::default();
        for part in parts {
            hash.write(part);
            hash.write(&[0]);
        }
        KeyedRequest { key: key.to_string(), request: hash.hex() }
    }

    /// What the row the key names (its id, and its digest) makes of this request: `Ok(Some(id))` when it
    /// repeats it, `Err(id)` when the key was given to another request. A row keyed before digests were kept
    /// has none, and answers by its key alone.
    pub fn repeats<Id>(&self, first: Option<(Id, Option<String>)>) -> Result<Option<Id>, Id> {
        match first {
            None => Ok(None),
            Some((id, request)) if request.as_ref().is_none_or(|r| *r == self.request) => Ok(Some(id)),
            Some((id, _)) => Err(id),
        }
    }
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
    async fn the_query_log_keeps_the_newest() {
        for store in testing::stores().await.0 {
            query_log(&store).await;
        }
    }

    /// One Idempotency-Key scheme: a key repeats the request whose digest it was stored with (or one keyed
    /// before digests were kept), and is refused for another.
    #[test]
    fn a_key_repeats_its_own_request_only() {
        let keyed = KeyedRequest::new("k", &[b"a", b"bc"]);
        assert_eq!(keyed.request, KeyedRequest::new("other key", &[b"a", b"bc"]).request);
        assert_ne!(keyed.request, KeyedRequest::new("k", &[b"ab", b"c"]).request, "parts are told apart");
        assert_eq!(keyed.repeats::<i64>(None), Ok(None));
        assert_eq!(keyed.repeats(Some((7, Some(keyed.request.clone())))), Ok(Some(7)));
        assert_eq!(keyed.repeats(Some((7, None))), Ok(Some(7)));
        assert_eq!(keyed.repeats(Some((7, Some("another".into())))), Err(7));
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
