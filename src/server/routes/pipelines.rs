//! `GET /pipelines`.

use axum::extract::State;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use crate::rank::{ModelStatus, PipelineInfo};
use crate::server::error::{ApiError, EngineErrors};
use crate::server::AppState;

#[derive(Debug, Serialize, ToSchema)]
pub struct Pipelines {
    pub pipelines: Vec<PipelineInfo>,
    /// The models re-ranking pipelines can name (`default` unless a request names another).
    pub models: Vec<ModelStatus>,
}

/// The pipelines and the models a client can ask for.
#[utoipa::path(get, path = "/pipelines", tag = "search", responses((status = 200, body = Pipelines), EngineErrors))]
pub async fn list_pipelines(State(state): State<AppState>) -> Result<Json<Pipelines>, ApiError> {
    // On a blocking thread: a model not loaded yet is loaded to tell.
    let (pipelines, models) = state.run(|engine, _| Ok((engine.pipelines(), engine.models().status()))).await?;
    Ok(Json(Pipelines { pipelines, models }))
}
