//! `GET /health` and `GET /metrics`.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use crate::server::error::{ApiError, HealthErrors, PlainErrors};
use crate::server::AppState;

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ready` once every index is open.
    pub status: &'static str,
    pub collections: usize,
    pub version: &'static str,
    /// This replica's name (`server.replica_id`, else host:port).
    pub replica: String,
    /// The fingerprint of each collection this replica serves (`/collections`).
    pub fingerprints: std::collections::BTreeMap<String, String>,
}

/// Readiness: 200 once the indexes are open, 503 before.
#[utoipa::path(get, path = "/health", tag = "system",
    responses((status = 200, body = Health), HealthErrors))]
pub async fn health(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    if !state.is_ready() {
        return Err(ApiError::not_ready());
    }
    let collections = state.engine().catalog().names().len();
    // Hashing a collection's files first (a few hundred MB/s; after a start they are cached) must not hold a
    // runtime worker.
    let engine = state.engine_arc();
    let fingerprints = tokio::task::spawn_blocking(move || engine.fingerprints()).await.unwrap_or_default();
    let (version, replica) = (env!("CARGO_PKG_VERSION"), state.replica());
    Ok(Json(Health { status: "ready", collections, version, replica, fingerprints }))
}

/// Prometheus metrics (text exposition format).
#[utoipa::path(get, path = "/metrics", tag = "system", responses((status = 200, content_type = "text/plain", body = String), PlainErrors))]
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let text = state.metrics().render(
        state.engine().catalog(),
        &state.engine().models().status(),
        state.waiting(),
        state.connections(),
    );
    // Counted in the store (every replica shows the same number); left out when the store does not answer.
    let stranded = state.jobs().store().stranded_jobs().await.ok();
    let text = text + &state.metrics().render_batch(&state.replica(), &state.jobs().counters, stranded);
    let text = text + &state.metrics().render_query_log(state.query_log().counts(), state.query_log().queued());
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}
