//! The tasks table: writes to collections, queued in id order (`scheduler::tasks` applies them).

use serde::{Deserialize, Serialize};
use sqlx::Row;

use super::{now_rfc3339, KeyedRequest, Store, StoreError};

/// What a task does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TaskKind {
    CreateCollection,
    AddDocuments,
    DeleteDocuments,
    DeleteCollection,
    /// A bi-encoder's segment vectors and their index computed for the collection (`longrank embed`).
    EmbedCollection,
}

/// A task's lifecycle: `queued`, then `running`, then one of the other three.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl TaskStatus {
    pub fn is_finished(self) -> bool {
        matches!(self, TaskStatus::Succeeded | TaskStatus::Failed | TaskStatus::Cancelled)
    }
}

impl std::fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&text(self))
    }
}

/// Text of a unit enum as serde writes it (the column's value).
fn text<T: Serialize>(value: T) -> String {
    serde_json::to_value(value).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()
}

fn parse<T: for<'de> Deserialize<'de>>(text: String) -> Result<T, StoreError> {
    serde_json::from_value(serde_json::Value::String(text))
        .map_err(|e| StoreError::Sqlx(sqlx::Error::Decode(Box::new(e))))
}

/// A task as stored.
#[derive(Debug, Clone)]
pub struct TaskRow {
    pub id: i64,
    pub collection: String,
    pub kind: TaskKind,
    pub status: TaskStatus,
    /// JSON (`scheduler::tasks::Input`).
    pub input: String,
    pub read: i64,
    pub indexed: i64,
    pub skipped: i64,
    pub deleted: i64,
    /// JSON array of objects.
    pub errors: String,
    pub error: Option<String>,
    pub enqueued_at: String,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
}

/// What a finished task did.
#[derive(Debug, Clone, Default)]
pub struct TaskOutcome {
    pub read: i64,
    pub indexed: i64,
    pub skipped: i64,
    pub deleted: i64,
    /// The first problems met, as JSON objects.
    pub errors: Vec<serde_json::Value>,
    pub error: Option<String>,
}

/// Which tasks a list shows.
#[derive(Debug, Clone, Default)]
pub struct TaskFilter {
    pub collection: Option<String>,
    pub status: Option<TaskStatus>,
    /// Ids below this one (the next page of a newest-first list).
    pub before: Option<i64>,
    pub limit: usize,
}

const COLUMNS: &str = "id, collection, kind, status, input, read, indexed, skipped, deleted, errors, error, \
                       enqueued_at, started_at, finished_at";

impl Store {
    /// Queues a task; its id.
    pub async fn create_task(
        &self,
        collection: &str,
        kind: TaskKind,
        input: &str,
        keyed: Option<&KeyedRequest>,
    ) -> Result<i64, StoreError> {
        let row = sqlx::query(
            "INSERT INTO tasks (collection, kind, status, input, enqueued_at, idempotency_key, request) \
             VALUES ($1, $2, 'queued', $3, $4, $5, $6) RETURNING id",
        )
        .bind(collection)
        .bind(text(kind))
        .bind(input)
        .bind(now_rfc3339())
        .bind(keyed.map(|k| k.key.as_str()))
        .bind(keyed.map(|k| k.request.as_str()))
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get(0)?)
    }

    /// The task queued with this Idempotency-Key, if any, and the digest of its request.
    pub async fn task_by_idempotency_key(&self, key: &str) -> Result<Option<(i64, Option<String>)>, StoreError> {
        let row = sqlx::query("SELECT id, request FROM tasks WHERE idempotency_key = $1")
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).transpose()
    }

    pub async fn task(&self, id: i64) -> Result<Option<TaskRow>, StoreError> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM tasks WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| task_row(&r)).transpose()
    }

    /// Tasks, newest first.
    pub async fn tasks(&self, filter: &TaskFilter) -> Result<Vec<TaskRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM tasks WHERE ($1 IS NULL OR collection = $1) AND ($2 IS NULL OR status = $2) \
             AND ($3 IS NULL OR id < $3) ORDER BY id DESC LIMIT $4"
        ))
        .bind(&filter.collection)
        .bind(filter.status.map(text))
        .bind(filter.before)
        .bind(filter.limit as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(task_row).collect()
    }

    /// The oldest queued task, marked running.
    pub async fn start_next_task(&self) -> Result<Option<TaskRow>, StoreError> {
        let row = sqlx::query(&format!(
            "UPDATE tasks SET status = 'running', started_at = $1 \
             WHERE id = (SELECT id FROM tasks WHERE status = 'queued' ORDER BY id LIMIT 1) AND status = 'queued' \
             RETURNING {COLUMNS}"
        ))
        .bind(now_rfc3339())
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| task_row(&r)).transpose()
    }

    /// Tasks a stop interrupted run again, in their turn: running ones go back to the queue, those asked to
    /// stop end cancelled.
    pub async fn requeue_running_tasks(&self) -> Result<u64, StoreError> {
        sqlx::query(
            "UPDATE tasks SET status = 'cancelled', finished_at = $1 WHERE status = 'running' AND cancel_requested = 1",
        )
        .bind(now_rfc3339())
        .execute(&self.pool)
        .await?;
        let done = sqlx::query("UPDATE tasks SET status = 'queued', started_at = NULL WHERE status = 'running'")
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    /// Asks a running task to stop; false when it is not running.
    pub async fn request_cancel(&self, id: i64) -> Result<bool, StoreError> {
        let done = sqlx::query("UPDATE tasks SET cancel_requested = 1 WHERE id = $1 AND status = 'running'")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Finishes a running task.
    pub async fn finish_task(&self, id: i64, status: TaskStatus, outcome: &TaskOutcome) -> Result<(), StoreError> {
        let errors = serde_json::to_string(&outcome.errors).unwrap_or_else(|_| "[]".into());
        sqlx::query(
            "UPDATE tasks SET status = $1, read = $2, indexed = $3, skipped = $4, deleted = $5, errors = $6, error = $7, \
             finished_at = $8 WHERE id = $9 AND status = 'running'",
        )
        .bind(text(status))
        .bind(outcome.read)
        .bind(outcome.indexed)
        .bind(outcome.skipped)
        .bind(outcome.deleted)
        .bind(errors)
        .bind(&outcome.error)
        .bind(now_rfc3339())
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Cancels a queued task: its input; none when it is not queued (running or finished).
    pub async fn cancel_queued_task(&self, id: i64) -> Result<Option<String>, StoreError> {
        let row = sqlx::query(
            "UPDATE tasks SET status = 'cancelled', finished_at = $1 WHERE id = $2 AND status = 'queued' RETURNING input",
        )
        .bind(now_rfc3339())
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| r.try_get(0)).transpose()?)
    }

    /// The inputs of the tasks not finished (the uploads they still need).
    pub async fn unfinished_task_inputs(&self) -> Result<Vec<String>, StoreError> {
        let rows =
            sqlx::query("SELECT input FROM tasks WHERE status IN ('queued', 'running')").fetch_all(&self.pool).await?;
        rows.iter().map(|r| r.try_get::<String, _>(0).map_err(StoreError::from)).collect()
    }
}

fn task_row(r: &sqlx::any::AnyRow) -> Result<TaskRow, StoreError> {
    Ok(TaskRow {
        id: r.try_get("id")?,
        collection: r.try_get("collection")?,
        kind: parse(r.try_get("kind")?)?,
        status: parse(r.try_get("status")?)?,
        input: r.try_get("input")?,
        read: r.try_get("read")?,
        indexed: r.try_get("indexed")?,
        skipped: r.try_get("skipped")?,
        deleted: r.try_get("deleted")?,
        errors: r.try_get("errors")?,
        error: r.try_get("error")?,
        enqueued_at: r.try_get("enqueued_at")?,
        started_at: r.try_get("started_at")?,
        finished_at: r.try_get("finished_at")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tasks_run_in_order_resume_and_cancel() {
        for store in crate::store::testing::stores().await.0 {
            tasks_in_order(&store).await;
        }
    }

    async fn tasks_in_order(store: &Store) {
        let a = store.create_task("c", TaskKind::CreateCollection, "{}", None).await.unwrap();
        let b = store.create_task("c", TaskKind::AddDocuments, "{\"file\": \"x\"}", None).await.unwrap();
        let c = store.create_task("d", TaskKind::DeleteCollection, "{}", None).await.unwrap();
        assert!(a < b && b < c);
        let first = store.start_next_task().await.unwrap().unwrap();
        assert_eq!((first.id, first.status, first.kind), (a, TaskStatus::Running, TaskKind::CreateCollection));
        // A stop: the running task goes back first in line.
        assert_eq!(store.requeue_running_tasks().await.unwrap(), 1);
        assert!(!store.request_cancel(a).await.unwrap(), "a queued task is not running");
        assert_eq!(store.start_next_task().await.unwrap().unwrap().id, a);
        store.finish_task(a, TaskStatus::Succeeded, &TaskOutcome { indexed: 0, ..Default::default() }).await.unwrap();
        assert_eq!(store.cancel_queued_task(c).await.unwrap().as_deref(), Some("{}"));
        assert!(store.cancel_queued_task(a).await.unwrap().is_none(), "a finished task is not cancelled");
        assert_eq!(store.unfinished_task_inputs().await.unwrap(), vec!["{\"file\": \"x\"}".to_string()]);
        let second = store.start_next_task().await.unwrap().unwrap();
        assert_eq!(second.id, b, "the cancelled task is passed over");
        let outcome = TaskOutcome {
            read: 3,
            indexed: 2,
            skipped: 1,
            errors: vec![serde_json::json!({"line": 2})],
            ..Default::default()
        };
        store.finish_task(b, TaskStatus::Succeeded, &outcome).await.unwrap();
        assert!(store.start_next_task().await.unwrap().is_none());
        let listed =
            store.tasks(&TaskFilter { collection: Some("c".into()), limit: 10, ..Default::default() }).await.unwrap();
        assert_eq!(listed.iter().map(|t| t.id).collect::<Vec<_>>(), vec![b, a], "newest first, one collection");
        assert_eq!((listed[0].read, listed[0].indexed, listed[0].skipped), (3, 2, 1));
        assert_eq!(listed[0].errors, "[{\"line\":2}]");
        let page = store.tasks(&TaskFilter { before: Some(b), limit: 10, ..Default::default() }).await.unwrap();
        assert_eq!(page.len(), 1);
        let filter = TaskFilter { status: Some(TaskStatus::Cancelled), limit: 10, ..Default::default() };
        assert_eq!(store.tasks(&filter).await.unwrap()[0].id, c);
    }
}
