//! `GET /pipelines`.

use axum::extract::State;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use crate::rank::{ModelStatus, Pipeline};
use crate::server::error::PlainErrors;
use crate::server::AppState;

#[derive(Debug, Serialize, ToSchema)]
pub struct Pipelines {
    pub pipelines: Vec<PipelineInfo>,
    /// The models re-ranking pipelines can name (`default` unless a request names another).
    pub models: Vec<ModelStatus>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PipelineInfo {
    pub name: &'static str,
    /// Whether the pipeline re-ranks with a model.
    pub needs_model: bool,
    /// Whether a request can use it now (with the default model, for re-ranking pipelines).
    pub available: bool,
}

/// The pipelines and the models a client can ask for.
#[utoipa::path(get, path = "/pipelines", tag = "search", responses((status = 200, body = Pipelines), PlainErrors))]
pub async fn list_pipelines(State(state): State<AppState>) -> Json<Pipelines> {
    let models = state.engine().models().status();
    let default_ready = models.iter().any(|m| m.name == crate::rank::DEFAULT_MODEL && m.state == "ready");
    let pipelines = Pipeline::ALL
        .iter()
        .map(|p| PipelineInfo {
            name: p.name(),
            needs_model: p.needs_model(),
            available: !p.needs_model() || default_ready,
        })
        .collect();
    Json(Pipelines { pipelines, models })
}
