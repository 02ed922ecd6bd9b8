//! `POST /rerank`.

use axum::extract::State;
use axum::Json;

use crate::rank::{RerankRequest, RerankResponse};
use crate::server::decode::ApiJson;
use crate::server::error::{ApiError, RerankErrors};
use crate::server::AppState;

/// Re-rank the client's own candidates (texts, or docids of a collection) with the model, with evidence.
#[utoipa::path(post, path = "/rerank", tag = "search", request_body = RerankRequest,
    responses((status = 200, body = RerankResponse), RerankErrors))]
pub async fn rerank(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<RerankRequest>,
) -> Result<Json<RerankResponse>, ApiError> {
    state.rerank(request).await.map(Json)
}
