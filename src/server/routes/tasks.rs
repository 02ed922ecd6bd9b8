//! `GET /tasks`, `GET /tasks/{id}`, `DELETE /tasks/{id}`: the tasks that write collections.

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use utoipa::IntoParams;

use crate::scheduler::tasks::TaskView;
use crate::server::error::{ApiError, ApiPath, ApiQuery, CancelTaskErrors, TaskErrors};
use crate::server::AppState;
use crate::store::{TaskFilter, TaskStatus};

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TaskListParams {
    /// Only this collection's tasks.
    collection: Option<String>,
    /// Only tasks in this state.
    status: Option<TaskStatus>,
    /// Tasks per page, newest first (default 20, at most 1000).
    limit: Option<usize>,
    /// The next page: tasks older than this id (the last id of the page before).
    cursor: Option<i64>,
}

/// Tasks, newest first, a page at a time.
#[utoipa::path(get, path = "/tasks", tag = "collections", params(TaskListParams),
    responses((status = 200, body = Vec<TaskView>), TaskErrors))]
pub async fn list(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<TaskListParams>,
) -> Result<Json<Vec<TaskView>>, ApiError> {
    let limit = params.limit.unwrap_or(20).clamp(1, 1000);
    let filter = TaskFilter { collection: params.collection, status: params.status, before: params.cursor, limit };
    Ok(Json(state.tasks().list(&filter).await?))
}

/// A task: its status, documents read, indexed, skipped and deleted, problems, progress and times.
#[utoipa::path(get, path = "/tasks/{id}", tag = "collections",
    params(("id" = i64, Path, description = "The task's id")), responses((status = 200, body = TaskView), TaskErrors))]
pub async fn get(State(state): State<AppState>, ApiPath(id): ApiPath<i64>) -> Result<Json<TaskView>, ApiError> {
    Ok(Json(state.tasks().get(id).await?))
}

/// Cancel a queued task, or stop a running upload at its next document (it keeps what it had committed); a
/// finished task stays as it is.
#[utoipa::path(delete, path = "/tasks/{id}", tag = "collections",
    params(("id" = i64, Path, description = "The task's id")), responses((status = 200, body = TaskView), CancelTaskErrors))]
pub async fn cancel(State(state): State<AppState>, ApiPath(id): ApiPath<i64>) -> Result<Json<TaskView>, ApiError> {
    Ok(Json(state.tasks().cancel(id).await?))
}
