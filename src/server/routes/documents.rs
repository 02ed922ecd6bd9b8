//! `GET /documents/{docid}`.

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use utoipa::IntoParams;

use crate::rank::DocumentResponse;
use crate::server::error::{ApiError, ApiPath, ApiQuery, DocumentErrors};
use crate::server::AppState;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DocumentParams {
    /// Collection to look in; without it every collection is searched.
    collection: Option<String>,
}

/// A stored document's title and full text.
#[utoipa::path(get, path = "/documents/{docid}", tag = "documents",
    params(("docid" = String, Path, description = "The document's id"), DocumentParams),
    responses((status = 200, body = DocumentResponse), DocumentErrors))]
pub async fn get_document(
    State(state): State<AppState>,
    ApiPath(docid): ApiPath<String>,
    ApiQuery(params): ApiQuery<DocumentParams>,
) -> Result<Json<DocumentResponse>, ApiError> {
    state.run(move |engine, _| engine.document(&docid, params.collection.as_deref())).await.map(Json)
}
