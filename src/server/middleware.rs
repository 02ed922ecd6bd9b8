//! Cross-cutting request handling in one place: request ids, logging, readiness, timeouts and metrics.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::Instrument;

use super::error::ApiError;
use super::AppState;

pub const REQUEST_ID: &str = "x-request-id";

/// The matched route, written by `label_route` (which runs after routing) and read by `observe` (which
/// wraps everything, unmatched requests included).
#[derive(Clone, Default)]
struct RouteLabel(Arc<OnceLock<String>>);

/// Routes that answer while indexes are still opening.
const ALWAYS_AVAILABLE: [&str; 2] = ["/health", "/metrics"];

pub async fn observe(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let started = Instant::now();
    let request_id = request
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(String::from)
        .unwrap_or_else(new_request_id);
    let method = request.method().to_string();
    let path = request.uri().path().to_string();
    let label = RouteLabel::default();
    request.extensions_mut().insert(label.clone());
    let span = tracing::info_span!("request", id = %request_id, %method, %path);

    let timeout_ms = state.config().server.request_timeout_ms;
    let mut response = if !state.is_ready() && !ALWAYS_AVAILABLE.contains(&path.as_str()) {
        ApiError::not_ready().into_response()
    } else {
        match tokio::time::timeout(Duration::from_millis(timeout_ms), next.run(request).instrument(span.clone())).await
        {
            Ok(response) => response,
            Err(_) => ApiError::timeout(timeout_ms).into_response(),
        }
    };
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    let route = label.0.get().map_or("unmatched", String::as_str);
    let status = response.status().as_u16();
    let latency = started.elapsed();
    state.metrics().observe(route, &method, status, latency);
    span.in_scope(|| tracing::info!(status, latency_ms = latency.as_secs_f64() * 1e3, "served"));
    response
}

/// Records the matched route pattern (`/documents/{docid}`, not the concrete path) for metrics.
pub async fn label_route(request: Request, next: Next) -> Response {
    if let (Some(label), Some(matched)) =
        (request.extensions().get::<RouteLabel>(), request.extensions().get::<MatchedPath>())
    {
        let _ = label.0.set(matched.as_str().to_string());
    }
    next.run(request).await
}

fn new_request_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{:x}-{:x}", nanos as u64, COUNTER.fetch_add(1, Ordering::Relaxed))
}
