//! `/batch`: TREC topic files in, runs and metrics out, as queued jobs.

use axum::extract::{FromRequest, Multipart, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use crate::eval::Comparison;
use crate::rank::{BatchParams, RankError};
use crate::scheduler::jobs::{JobView, Submission};
use crate::server::decode::{self, ApiJson, Fields};
use crate::server::error::{
    ApiError, ApiPath, ApiQuery, CancelErrors, CompareErrors, ErrorCode, JobErrors, ListErrors, SubmitErrors,
};
use crate::server::AppState;

/// A batch request: the topic file's content, optional qrels, and how to run it. As JSON, or as a multipart
/// form with the same field names (each part decoded by its field's type: object-valued ones such as `bm25`
/// hold JSON text).
#[derive(Debug, Deserialize, ToSchema)]
pub struct BatchRequest {
    /// The topic file: TREC `<top>`, web-track XML or `qid<TAB>text`.
    #[schema(example = "1\twhat similarity laws must be obeyed when constructing aeroelastic models\n")]
    pub topics: String,
    /// TREC qrels (`qid 0 docid grade`); metrics are computed when given.
    #[serde(default)]
    #[schema(example = "1 0 184 2\n")]
    pub qrels: Option<String>,
    /// A TREC run (`qid Q0 docid rank score tag` lines) whose candidates a re-ranking pipeline re-ranks
    /// instead of BM25's.
    #[serde(default)]
    #[schema(example = "1 Q0 184 1 10.5 anserini\n1 Q0 29 2 9.25 anserini\n")]
    pub rerank: Option<String>,
    #[serde(flatten)]
    pub params: BatchParams,
}

impl From<BatchRequest> for Submission {
    fn from(r: BatchRequest) -> Submission {
        Submission { params: r.params, topics: r.topics, qrels: r.qrels, rerank: r.rerank }
    }
}

/// JSON or multipart, into one `BatchRequest`.
pub struct BatchUpload(BatchRequest);

impl<S: Send + Sync> FromRequest<S> for BatchUpload {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let multipart = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("multipart/form-data"));
        if !multipart {
            let ApiJson(body) = ApiJson::<BatchRequest>::from_request(request, state).await?;
            return Ok(BatchUpload(body));
        }
        let invalid = |e: axum::extract::multipart::MultipartError| ApiError::body(e.status(), e.body_text());
        let mut form =
            Multipart::from_request(request, state).await.map_err(|e| ApiError::body(e.status(), e.body_text()))?;
        let mut parts = Vec::new();
        while let Some(field) = form.next_field().await.map_err(invalid)? {
            let name = field.name().unwrap_or_default().to_string();
            parts.push((name, field.text().await.map_err(invalid)?));
        }
        let object = Fields::of::<BatchRequest>().decode(parts, true, ErrorCode::InvalidBody)?;
        decode::from_object(object, ErrorCode::InvalidBody).map(BatchUpload)
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WaitParams {
    /// Answer when the job has finished (200), or after most of `server.request_timeout_ms` with the job as it
    /// is then (202, `Location` naming it): for small topic files.
    wait: Option<bool>,
}

/// Start a batch run. With an `Idempotency-Key` header, a repeat of the submission (a client's or a proxy's
/// retry) answers the first job instead of creating another, for as long as the job is kept.
#[utoipa::path(post, path = "/batch", tag = "batch", request_body(content = BatchRequest, content_type = "application/json"),
    params(WaitParams, super::IdempotencyKey),
    responses(
        super::JobSubmitted,
        SubmitErrors,
    ))]
pub async fn submit(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<WaitParams>,
    key: super::IdempotencyKey,
    BatchUpload(request): BatchUpload,
) -> Result<Response, ApiError> {
    let id = state.jobs().submit(request.into(), key.get()).await?;
    let waits = params.wait.unwrap_or(false);
    let view = match waits {
        true => state.jobs().wait(&id, super::wait_deadline(&state)).await?,
        false => state.jobs().get(&id).await?,
    };
    let finished = waits && view.status.is_finished();
    Ok(super::Submitted { view, finished, location: format!("/batch/{id}") }.into_response())
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// Jobs skipped, newest first (default 0).
    offset: Option<usize>,
    /// Jobs answered, at most 1000 (default 100).
    limit: Option<usize>,
}

/// Jobs a page answers at most.
pub const MAX_PAGE: usize = 1000;

/// The jobs, newest first, a page at a time (`offset`, `limit`; `X-Total-Count` says how many there are),
/// without per-topic metrics (`GET /batch/{id}` has them).
#[utoipa::path(get, path = "/batch", tag = "batch", params(ListParams),
    responses((status = 200, body = Vec<JobView>, headers(("x-total-count" = i64, description = "Jobs in all"))),
    ListErrors))]
pub async fn list(State(state): State<AppState>, ApiQuery(page): ApiQuery<ListParams>) -> Result<Response, ApiError> {
    let limit = page.limit.unwrap_or(100);
    if !(1..=MAX_PAGE).contains(&limit) {
        let value = limit as f64;
        return Err(RankError::OutOfRange { field: "limit", value, min: 1.0, max: MAX_PAGE as f64 }.into());
    }
    let (jobs, total) = state.jobs().list(page.offset.unwrap_or(0), limit).await?;
    Ok(([("x-total-count", total.to_string())], Json(jobs)).into_response())
}

/// A job: status, progress, metrics (when qrels were given), warnings, parameters and provenance.
#[utoipa::path(get, path = "/batch/{id}", tag = "batch", params(("id" = String, Path)),
    responses((status = 200, body = JobView), JobErrors))]
pub async fn get(State(state): State<AppState>, ApiPath(id): ApiPath<String>) -> Result<Json<JobView>, ApiError> {
    Ok(Json(state.jobs().get(&id).await?))
}

/// The TREC run file of a finished job.
#[utoipa::path(get, path = "/batch/{id}/run", tag = "batch", params(("id" = String, Path)),
    responses((status = 200, content_type = "text/plain", body = String), JobErrors))]
pub async fn run_file(State(state): State<AppState>, ApiPath(id): ApiPath<String>) -> Result<Response, ApiError> {
    let parts = state.jobs().run_file(&id).await?;
    let disposition = format!("attachment; filename=\"{id}.run\"");
    Ok((
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8".to_string()), (header::CONTENT_DISPOSITION, disposition)],
        axum::body::Body::from_stream(parts),
    )
        .into_response())
}

/// Cancel a queued or running job (its view answers), or delete a finished one with its run (204).
#[utoipa::path(delete, path = "/batch/{id}", tag = "batch", params(("id" = String, Path)),
    responses((status = 200, description = "cancelled", body = JobView), (status = 204, description = "deleted"),
    CancelErrors))]
pub async fn cancel(State(state): State<AppState>, ApiPath(id): ApiPath<String>) -> Result<Response, ApiError> {
    Ok(match state.jobs().cancel_or_delete(&id).await? {
        Some(view) => Json(view).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    })
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CompareParams {
    a: String,
    b: String,
}

/// Compare two finished jobs: per measure the means, delta, paired t-test p-value, wins/ties/losses.
#[utoipa::path(get, path = "/batch/compare", tag = "batch", params(CompareParams),
    responses((status = 200, body = Vec<Comparison>), CompareErrors))]
pub async fn compare(
    State(state): State<AppState>,
    ApiQuery(p): ApiQuery<CompareParams>,
) -> Result<Json<Vec<Comparison>>, ApiError> {
    Ok(Json(state.jobs().compare(&p.a, &p.b).await?))
}

#[cfg(test)]
mod tests {
    use super::BatchRequest;
    use crate::rank::SearchRequest;
    use crate::server::decode::{Fields, Kind};

    #[test]
    fn fields_come_from_the_types_schema_through_flatten() {
        let fields = Fields::of::<BatchRequest>();
        let kind = |name: &str| fields.get(name).unwrap_or_else(|| panic!("no field {name}")).kind;
        for (name, expected) in [
            ("topics", Kind::Text),
            ("qrels", Kind::Text),
            ("collection", Kind::Text),
            ("pipeline", Kind::Text),
            ("field", Kind::Text),
            ("tag", Kind::Text),
            ("k", Kind::Scalar),
            ("depth", Kind::Scalar),
            ("interpolate", Kind::Scalar),
            ("bm25", Kind::Object),
            ("rm3", Kind::Object),
            ("segments", Kind::Object),
        ] {
            assert_eq!(kind(name), expected, "{name}");
        }
        assert!(fields.get("topics").unwrap().required);
        assert!(!fields.get("k").unwrap().required);
        let search = Fields::of::<SearchRequest>();
        assert_eq!(search.get("segment_text").unwrap().kind, Kind::Scalar);
        assert!(search.get("query").unwrap().required);
    }
}
