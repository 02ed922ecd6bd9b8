//! `POST /rerank`.

use axum::extract::State;
use axum::Json;

use crate::rank::{RerankRequest, RerankResponse};
use crate::server::error::{ApiError, ApiJson, ErrorBody};
use crate::server::AppState;

/// Re-rank the client's own candidates (texts, or docids of a collection) with the model, with evidence.
#[utoipa::path(post, path = "/rerank", tag = "search", request_body = RerankRequest,
    responses(
        (status = 200, body = RerankResponse),
        (status = 400, body = ErrorBody),
        (status = 404, description = "unknown collection or docid", body = ErrorBody),
        (status = 422, description = "unknown pipeline, or no model loaded", body = ErrorBody),
    ))]
pub async fn rerank(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<RerankRequest>,
) -> Result<Json<RerankResponse>, ApiError> {
    state.run(move |engine, cancel| engine.rerank_documents(request, cancel)).await.map(Json)
}
