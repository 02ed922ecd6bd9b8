//! `GET /collections`.

use axum::extract::State;
use axum::Json;

use crate::rank::CollectionInfo;
use crate::server::error::{ApiError, EngineErrors};
use crate::server::AppState;

/// Every collection with its size and BM25 parameters.
#[utoipa::path(get, path = "/collections", tag = "collections", responses((status = 200, body = Vec<CollectionInfo>), EngineErrors))]
pub async fn list_collections(State(state): State<AppState>) -> Result<Json<Vec<CollectionInfo>>, ApiError> {
    state.run(|engine, _| engine.collections()).await.map(Json)
}
