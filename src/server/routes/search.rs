//! `POST /search` and `GET /search`.

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use utoipa::IntoParams;

use crate::rank::{SearchRequest, SearchResponse};
use crate::server::error::{ApiError, ApiJson, ApiQuery, ErrorBody};
use crate::server::AppState;

/// Rank documents of a collection for a query.
#[utoipa::path(post, path = "/search", tag = "search", request_body = SearchRequest,
    responses(
        (status = 200, body = SearchResponse),
        (status = 400, description = "malformed JSON, missing or mistyped field, empty query, k or depth out of range", body = ErrorBody),
        (status = 404, description = "unknown collection", body = ErrorBody),
        (status = 413, description = "body too large", body = ErrorBody),
        (status = 422, description = "unknown pipeline or model", body = ErrorBody),
        (status = 429, description = "the model's queue is full; see Retry-After", body = ErrorBody),
        (status = 503, description = "not ready, timed out, or the model is unavailable", body = ErrorBody),
    ))]
pub async fn post_search(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<SearchRequest>,
) -> Result<Json<SearchResponse>, ApiError> {
    state.search(request).await.map(Json)
}

/// Query-string form of a search.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct SearchParams {
    /// The query.
    q: String,
    k: Option<i64>,
    depth: Option<i64>,
    pipeline: Option<String>,
    collection: Option<String>,
    model: Option<String>,
}

/// Rank documents of a collection for a query given in the URL.
#[utoipa::path(get, path = "/search", tag = "search", params(SearchParams),
    responses(
        (status = 200, body = SearchResponse),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody),
    ))]
pub async fn get_search(
    State(state): State<AppState>,
    ApiQuery(p): ApiQuery<SearchParams>,
) -> Result<Json<SearchResponse>, ApiError> {
    let request = SearchRequest {
        query: p.q,
        k: p.k,
        depth: p.depth,
        pipeline: p.pipeline,
        collection: p.collection,
        model: p.model,
        ..Default::default()
    };
    state.search(request).await.map(Json)
}
