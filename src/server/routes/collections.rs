//! `GET /collections`, and the writes to a collection, each answered 202 with its task (`scheduler::tasks`):
//! `PUT` and `DELETE /collections/{name}`, `POST /collections/{name}/documents` (an upload),
//! `DELETE /collections/{name}/documents/{docid}` and `POST /collections/{name}/documents/delete`.

use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use crate::corpus::Format;
use crate::index::OnError;
use crate::rank::CollectionInfo;
use crate::replication::writer::Route;
use crate::scheduler::tasks::{Input, TaskError, TaskView};
use crate::server::decode::ApiJson;
use crate::server::error::{
    ApiError, ApiPath, ApiQuery, DeleteDocumentsErrors, EmbedCollectionErrors, EngineErrors, TaskSubmitErrors,
    UploadErrors,
};
use crate::server::forward;
use crate::server::AppState;
use crate::store::TaskKind;

/// Every collection with its size and BM25 parameters.
#[utoipa::path(get, path = "/collections", tag = "collections", responses((status = 200, body = Vec<CollectionInfo>), EngineErrors))]
pub async fn list_collections(State(state): State<AppState>) -> Result<Json<Vec<CollectionInfo>>, ApiError> {
    state.run(|engine, _| engine.collections()).await.map(Json)
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TaskWait {
    /// Answer when the task has finished (200), or after most of `server.request_timeout_ms` with the task as
    /// it is then (202, `Location` naming it).
    wait: Option<bool>,
}

type Accepted = super::Submitted<TaskView>;

/// Queues a task on collection `name`, answered as `accepted` answers.
async fn queue(
    state: &AppState,
    name: &str,
    kind: TaskKind,
    input: Input,
    key: super::IdempotencyKey,
    wait: Option<bool>,
) -> Result<Accepted, ApiError> {
    let task = state.tasks().enqueue(name, kind, &input, key.get()).await?;
    accepted(state, task, wait).await
}

async fn accepted(state: &AppState, task: TaskView, wait: Option<bool>) -> Result<Accepted, ApiError> {
    let waits = wait.unwrap_or(false);
    let view = match waits {
        true => state.tasks().wait(task.id, super::wait_deadline(state)).await?,
        false => task,
    };
    let (finished, location) = (waits && view.status.is_finished(), format!("/tasks/{}", view.id));
    Ok(super::Submitted { view, finished, location })
}

/// Create an empty collection (BM25 parameters as configured); one that exists is left as it is.
#[utoipa::path(put, path = "/collections/{name}", tag = "collections",
    params(("name" = String, Path, description = "The collection's name"), TaskWait, super::IdempotencyKey),
    responses(super::TaskSubmitted, TaskSubmitErrors))]
pub async fn create(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(params): ApiQuery<TaskWait>,
    key: super::IdempotencyKey,
) -> Result<Accepted, ApiError> {
    queue(&state, &name, TaskKind::CreateCollection, Input::default(), key, params.wait).await
}

/// Delete a collection (its task fails while a batch job reads it).
#[utoipa::path(delete, path = "/collections/{name}", tag = "collections",
    params(("name" = String, Path, description = "The collection's name"), TaskWait, super::IdempotencyKey),
    responses(super::TaskSubmitted, TaskSubmitErrors))]
pub async fn delete(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(params): ApiQuery<TaskWait>,
    key: super::IdempotencyKey,
) -> Result<Accepted, ApiError> {
    queue(&state, &name, TaskKind::DeleteCollection, Input::default(), key, params.wait).await
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UploadParams {
    /// The upload's format, as `longrank index --format` (default: a JSON array for `application/json`, else
    /// detected from the content). Gzipped bodies are read as such.
    format: Option<Format>,
    /// A malformed document: reported with its position and skipped, or the task fails (nothing after its
    /// last commit kept). Default: `index.on_error` (configuration).
    on_error: Option<OnError>,
    /// As for the other writes.
    wait: Option<bool>,
}

/// A document of an upload (JSON lines, or an element of a JSON array); Anserini's `{"id", "contents"}` too.
#[derive(Debug, ToSchema)]
#[allow(dead_code, reason = "the upload's shape, for the OpenAPI document: the corpus reader parses uploads")]
pub struct UploadDocument {
    #[schema(example = "doc-1")]
    pub id: String,
    pub title: Option<String>,
    #[schema(example = "The harbor lantern was lit at dusk.")]
    pub text: String,
}

/// Add or replace documents (same docid: replaced): JSON lines (`application/x-ndjson`), a JSON array
/// (`application/json`), or a file in any format `longrank index` reads. The body is streamed to the data
/// directory (up to `limits.max_upload_bytes`) and the 202 comes once it is stored durably; the collection is
/// created if needed.
#[utoipa::path(post, path = "/collections/{name}/documents", tag = "collections",
    params(("name" = String, Path, description = "The collection's name"), UploadParams, super::IdempotencyKey),
    request_body(description = "The documents: a JSON array (`application/json`), or any other body (JSON lines \
        as `application/x-ndjson`, a file of any format `longrank index` reads)", content(
        (Vec<UploadDocument> = "application/json"),
        (Vec<u8> = "application/octet-stream"),
    )),
    responses(super::TaskSubmitted, UploadErrors))]
pub async fn add_documents(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(params): ApiQuery<UploadParams>,
    key: super::IdempotencyKey,
    request: Request,
) -> Result<Response, ApiError> {
    match state.tasks().route().await? {
        Route::Here => {}
        Route::Writer(url) => return forward::to_writer(&url, request).await,
        Route::NoWriter => return Err(TaskError::NoWriter("no server holds the writer lock".into()).into()),
    }
    let content_type = request.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let json_array = params.format.is_none() && content_type.starts_with("application/json");
    let format = params.format.unwrap_or(if json_array { Format::Jsonl } else { Format::Auto });
    let on_error = params.on_error.unwrap_or(state.config().index.on_error);
    let input = Input { format, json_array, on_error, ..Input::default() };
    let limit = state.config().limits.max_upload_bytes;
    let body = request.into_body().into_data_stream();
    let task = state.tasks().upload(&name, body, limit, input, key.get()).await?;
    Ok(accepted(&state, task, params.wait).await?.into_response())
}

/// Delete one document by docid.
#[utoipa::path(delete, path = "/collections/{name}/documents/{docid}", tag = "collections",
    params(("name" = String, Path, description = "The collection's name"),
        ("docid" = String, Path, description = "The document's id"), TaskWait, super::IdempotencyKey),
    responses(super::TaskSubmitted, TaskSubmitErrors))]
pub async fn delete_document(
    State(state): State<AppState>,
    ApiPath((name, docid)): ApiPath<(String, String)>,
    ApiQuery(params): ApiQuery<TaskWait>,
    key: super::IdempotencyKey,
) -> Result<Accepted, ApiError> {
    let input = Input { ids: vec![docid], ..Input::default() };
    queue(&state, &name, TaskKind::DeleteDocuments, input, key, params.wait).await
}

/// What to embed: a served bi-encoder, and the model whose segments it embeds.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EmbedCollection {
    /// The bi-encoder (default: the default model).
    #[schema(example = "minilm")]
    pub model: Option<String>,
    /// Embed the segments this served model reads, for a `bi-encoder:NAME` preselection in front of it
    /// (default: the bi-encoder's own).
    #[serde(rename = "for")]
    pub for_model: Option<String>,
}

/// Compute a bi-encoder's segment vectors for every document of the collection and build their vector index
/// (`longrank embed`), for the dense and hybrid first stages; on a cluster they are published with the
/// collection's version. What is stored already is kept, so a task cut short resumes.
#[utoipa::path(post, path = "/collections/{name}/embeddings", tag = "collections",
    params(("name" = String, Path, description = "The collection's name"), TaskWait, super::IdempotencyKey),
    request_body = EmbedCollection, responses(super::TaskSubmitted, EmbedCollectionErrors))]
pub async fn embed(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(params): ApiQuery<TaskWait>,
    key: super::IdempotencyKey,
    ApiJson(body): ApiJson<EmbedCollection>,
) -> Result<Accepted, ApiError> {
    let models = state.engine().models();
    let model = models.check(body.model.as_deref())?;
    let for_model = body.for_model.as_deref().map(|m| models.check(Some(m))).transpose()?;
    let input = Input { model: Some(model), for_model, ..Input::default() };
    queue(&state, &name, TaskKind::EmbedCollection, input, key, params.wait).await
}

/// Docids to delete.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteDocuments {
    #[schema(example = json!(["doc-1", "doc-2"]))]
    pub ids: Vec<String>,
}

/// Delete documents by docid, in one task.
#[utoipa::path(post, path = "/collections/{name}/documents/delete", tag = "collections",
    params(("name" = String, Path, description = "The collection's name"), TaskWait, super::IdempotencyKey),
    request_body = DeleteDocuments, responses(super::TaskSubmitted, DeleteDocumentsErrors))]
pub async fn delete_documents(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(params): ApiQuery<TaskWait>,
    key: super::IdempotencyKey,
    ApiJson(body): ApiJson<DeleteDocuments>,
) -> Result<Accepted, ApiError> {
    let input = Input { ids: body.ids, ..Input::default() };
    queue(&state, &name, TaskKind::DeleteDocuments, input, key, params.wait).await
}
