//! `GET /cluster` and `PUT /cluster/settings`: the replicas sharing the store, the jobs none can run, and the
//! cluster-wide settings (`scheduler::cluster`).

use axum::extract::State;
use axum::Json;

use crate::scheduler::cluster::{ClusterSettings, ClusterView};
use crate::server::decode::ApiJson;
use crate::server::error::{ApiError, ClusterErrors, ClusterSettingsErrors};
use crate::server::AppState;

/// The replicas seen in the last day (live: a heartbeat within 5 s) with what each serves, how many jobs no
/// live replica can run, and the settings in force.
#[utoipa::path(get, path = "/cluster", tag = "system", responses((status = 200, body = ClusterView), ClusterErrors))]
pub async fn get(State(state): State<AppState>) -> Result<Json<ClusterView>, ApiError> {
    Ok(Json(state.cluster().view().await?))
}

/// Replace the cluster-wide settings (absent: each replica's configuration): in force on the replica that
/// answers at once, on every other within a second, without a restart.
#[utoipa::path(put, path = "/cluster/settings", tag = "system", request_body = ClusterSettings,
    responses((status = 200, body = ClusterView), ClusterSettingsErrors))]
pub async fn put_settings(
    State(state): State<AppState>,
    ApiJson(settings): ApiJson<ClusterSettings>,
) -> Result<Json<ClusterView>, ApiError> {
    Ok(Json(state.cluster().set(settings).await?))
}
