//! `GET /pipelines`.

use axum::extract::State;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use crate::rank::Pipeline;
use crate::server::AppState;

#[derive(Debug, Serialize, ToSchema)]
pub struct Pipelines {
    pub pipelines: Vec<PipelineInfo>,
    /// The re-ranking model, when one is loaded.
    pub model: Option<ModelInfo>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PipelineInfo {
    pub name: &'static str,
    /// Whether the pipeline re-ranks with the model.
    pub needs_model: bool,
    /// Whether a request can use it now.
    pub available: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ModelInfo {
    pub source: String,
    /// `cross-encoder` or `bi-encoder`.
    pub kind: &'static str,
}

/// The pipelines and the model a client can ask for.
#[utoipa::path(get, path = "/pipelines", tag = "search", responses((status = 200, body = Pipelines)))]
pub async fn list_pipelines(State(state): State<AppState>) -> Json<Pipelines> {
    let model = state.engine().model();
    let pipelines = Pipeline::ALL
        .iter()
        .map(|p| PipelineInfo {
            name: p.name(),
            needs_model: p.needs_model(),
            available: !p.needs_model() || model.is_some(),
        })
        .collect();
    let model = model.map(|m| ModelInfo { source: m.source.clone(), kind: m.reranker.kind() });
    Json(Pipelines { pipelines, model })
}
