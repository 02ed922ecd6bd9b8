//! Cross-cutting request handling in one place, built by `layers`: the host and origin checks, keys by route
//! access, CORS, the body limit, request ids, logging, readiness, timeouts, metrics and compression.
//!
//! The stack's own layers where they fit: tower-http's CORS and response compression (gzip, for clients that
//! ask: run files and large JSON answers), axum's body limit. Written here, for what those lack: the timeout
//! (tower-http's answers an empty 408; ours is the one JSON error, 503 `timeout` saying what cuts the work,
//! leaves uploads alone, and hands the deadline to admission), request ids (tower-http's keeps any incoming
//! value; ours bounds it before it is logged and echoed), and, outside this stack, admission (tower's load
//! shedding and concurrency limits refuse only when nothing is free now, with no wait estimate nor Retry-After:
//! `admission`) and connection limits (below tower, in hyper's accept loop: `connections`).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, HeaderName, HeaderValue, Method};
use axum::middleware::{from_fn, from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tracing::Instrument;

use super::access::Access;
use super::error::{ApiError, Dialect, ErrorCode};
use super::AppState;

/// Routes grouped by access, each group behind its key check; then the stack every request goes through.
pub fn layers(open: Router<AppState>, read: Router<AppState>, admin: Router<AppState>, state: AppState) -> Router {
    let keyed = |router: Router<AppState>, access| {
        let check = move |state: State<AppState>, request: Request, next: Next| require(access, state, request, next);
        router.route_layer(from_fn_with_state(state.clone(), check))
    };
    let metrics_access = if state.config().server.public_metrics { Access::Open } else { Access::Read };
    let metrics = Router::new().route("/metrics", axum::routing::get(super::routes::system::metrics));
    let (open, read) = match metrics_access {
        Access::Open => (open.merge(metrics), read),
        _ => (open, read.merge(metrics)),
    };
    let routes =
        open.merge(keyed(read, Access::Read)).merge(keyed(admin, Access::Admin)).route_layer(from_fn(label_route));
    routes
        .fallback(|uri: axum::http::Uri| async move { ApiError::not_found(uri.path()) })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(DefaultBodyLimit::max(state.config().server.max_body_bytes))
        .layer(from_fn_with_state(state.clone(), guard))
        .layer(cors(&state.config().server.cors_origins))
        .layer(from_fn_with_state(state.clone(), observe))
        .layer(from_fn(speak_dialect))
        .layer(tower_http::compression::CompressionLayer::new())
        .with_state(state)
}

/// Browsers may read answers for the configured origins (and the server's own, which needs no CORS).
fn cors(origins: &[String]) -> CorsLayer {
    let origins: Vec<HeaderValue> =
        origins.iter().filter_map(|o| HeaderValue::from_str(o.trim_end_matches('/')).ok()).collect();
    CorsLayer::new()
        .allow_origin(AllowOrigin::list(origins))
        .allow_methods([Method::GET, Method::POST, Method::DELETE])
        .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE, HeaderName::from_static(REQUEST_ID)])
        .expose_headers([header::RETRY_AFTER, header::CONTENT_DISPOSITION, HeaderName::from_static(REQUEST_ID)])
}

/// The request head must be within its bounds (`head_within_limits`); the Host header must name this server (DNS rebinding aims pages at loopback servers), and a request that
/// writes must come from no page, the server's own, or an allowed origin (a form a foreign page posts needs no
/// CORS preflight). `/health` answers whatever the host (load balancers probe by address).
async fn guard(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if let Err(e) = head_within_limits(&request) {
        return e.into_response();
    }
    let server = &state.config().server;
    let host = request.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default().to_string();
    if !host.is_empty()
        && request.uri().path() != "/health"
        && !host_allowed(&host, state.loopback(), &server.allowed_hosts)
    {
        return ApiError::new(ErrorCode::ForbiddenHost, format!("this server does not answer to host {host:?}"))
            .into_response();
    }
    let safe = matches!(*request.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    if let Some(origin) = request.headers().get(header::ORIGIN).and_then(|o| o.to_str().ok()) {
        if !safe && !origin_allowed(origin, &host, &server.cors_origins) {
            let message = format!("a write from a page of {origin} (allow it with server.cors_origins)");
            return ApiError::new(ErrorCode::ForbiddenOrigin, message).into_response();
        }
    }
    // A body announced larger than the limit is refused before it is sent (the limit on reading would
    // otherwise wait for the bytes, however slowly they come).
    let (limit, code) = if is_upload(&request) {
        (state.config().limits.max_upload_bytes, ErrorCode::UploadTooLarge)
    } else {
        (server.max_body_bytes as u64, ErrorCode::BodyTooLarge)
    };
    let announced = request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if let Some(len) = announced.filter(|&len| len > limit) {
        let message = format!("the body is announced at {len} bytes; the limit is {limit}");
        return ApiError::new(code, message).into_response();
    }
    next.run(request).await
}

/// The most bytes of a request's target (path and query string) and of its headers, and the most headers. The
/// HTTP layer's own bounds lie beyond (`HYPER_MAX_HEADERS`, hyper's 64 KiB target and 400 KiB head), so that
/// a client past these gets the JSON error, not hyper's empty answer.
pub const MAX_URI_BYTES: usize = 32 * 1024;
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
pub const MAX_HEADERS: usize = 100;
/// Headers hyper parses before it answers 431 itself (an empty body).
pub const HYPER_MAX_HEADERS: usize = 1024;

/// 414 and 431 as JSON errors, for a request head past the bounds above.
fn head_within_limits(request: &Request) -> Result<(), ApiError> {
    let target = request.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if target > MAX_URI_BYTES {
        let message = format!(
            "the request target is {target} bytes; the limit is {MAX_URI_BYTES}: send the \
            parameters in a POST body"
        );
        return Err(ApiError::new(ErrorCode::UriTooLong, message));
    }
    let headers = request.headers();
    let bytes: usize = headers.iter().map(|(name, value)| name.as_str().len() + value.len()).sum();
    if headers.len() > MAX_HEADERS || bytes > MAX_HEADER_BYTES {
        let message = format!(
            "{} headers of {bytes} bytes; the limits are {MAX_HEADERS} headers and {MAX_HEADER_BYTES} bytes",
            headers.len()
        );
        return Err(ApiError::new(ErrorCode::HeadersTooLarge, message));
    }
    Ok(())
}

/// A document upload (`POST /collections/{name}/documents`): bounded by `limits.max_upload_bytes`, streamed to
/// disk, and given whatever time it takes, not `server.request_timeout_ms`.
fn is_upload(request: &Request) -> bool {
    let segments: Vec<&str> = request.uri().path().split('/').collect();
    request.method() == Method::POST && matches!(segments[..], ["", "collections", _, "documents"])
}

/// Whether a Host header (`name` or `name:port`) names this server: a loopback name, an allowed host, or any
/// host on an address beyond loopback when none are listed.
pub fn host_allowed(host: &str, loopback: bool, allowed: &[String]) -> bool {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !name.ends_with(':') => name,
        _ => host,
    };
    let name = name.to_ascii_lowercase();
    ["localhost", "127.0.0.1", "[::1]"].contains(&name.as_str())
        || allowed.iter().any(|a| a.eq_ignore_ascii_case(&name))
        || (!loopback && allowed.is_empty())
}

/// Whether a page of `origin` may write: the server's own (same host and port) or a configured one.
pub fn origin_allowed(origin: &str, host: &str, allowed: &[String]) -> bool {
    let authority = origin.split_once("://").map_or(origin, |(_, rest)| rest).trim_end_matches('/');
    authority.eq_ignore_ascii_case(host) || allowed.iter().any(|a| a.trim_end_matches('/').eq_ignore_ascii_case(origin))
}

/// The key check of a group of routes.
async fn require(access: Access, State(state): State<AppState>, request: Request, next: Next) -> Response {
    match check_key(access, &state, request.headers().get(header::AUTHORIZATION)) {
        Ok(()) => next.run(request).await,
        Err(error) => error.into_response(),
    }
}

fn check_key(access: Access, state: &AppState, authorization: Option<&HeaderValue>) -> Result<(), ApiError> {
    let server = &state.config().server;
    if server.admin_keys.is_empty() && server.search_keys.is_empty() {
        if access == Access::Admin && !state.loopback() {
            let message = "this server listens beyond loopback without an admin key, so it serves reads only: \
                           set server.admin_keys (LONGRANK_SERVER_ADMIN_KEYS) to run jobs";
            return Err(ApiError::new(ErrorCode::AdminKeyRequired, message));
        }
        return Ok(());
    }
    if access == Access::Open {
        return Ok(());
    }
    let Some(key) = authorization.and_then(|a| a.to_str().ok()).and_then(|a| a.strip_prefix("Bearer ")) else {
        return Err(ApiError::new(ErrorCode::MissingKey, "this route needs a key: Authorization: Bearer KEY"));
    };
    let is = |keys: &[String]| keys.iter().any(|k| constant_time_eq(k.as_bytes(), key.trim().as_bytes()));
    match (is(&server.admin_keys), is(&server.search_keys)) {
        (true, _) => Ok(()),
        (false, true) if access == Access::Read => Ok(()),
        (false, true) => {
            Err(ApiError::new(ErrorCode::InsufficientKey, "this route needs an admin key, not a search key"))
        }
        (false, false) => Err(ApiError::new(ErrorCode::InvalidKey, "the key is not one of this server's")),
    }
}

/// Compares without stopping at the first difference, so timing tells nothing of a key.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub const REQUEST_ID: &str = "x-request-id";

/// The matched route, written by `label_route` (which runs after routing) and read by `observe` (which
/// wraps everything, unmatched requests included).
#[derive(Clone, Default)]
struct RouteLabel(Arc<OnceLock<String>>);

/// Routes that answer while indexes are still opening.
const ALWAYS_AVAILABLE: [&str; 2] = ["/health", "/metrics"];

async fn observe(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let started = Instant::now();
    let request_id = request
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(String::from)
        .unwrap_or_else(crate::timestamp::unique_id);
    // Handlers read it too (a compatible API's response `id`).
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        request.headers_mut().insert(REQUEST_ID, value);
    }
    let method = request.method().to_string();
    let path = request.uri().path().to_string();
    let label = RouteLabel::default();
    request.extensions_mut().insert(label.clone());
    let span = tracing::info_span!("request", id = %request_id, %method, %path);

    let timeout_ms = state.config().server.request_timeout_ms;
    let mut response = if !state.is_ready() && !ALWAYS_AVAILABLE.contains(&path.as_str()) {
        ApiError::not_ready().into_response()
    } else if is_upload(&request) {
        next.run(request).instrument(span.clone()).await
    } else {
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        let handled = super::deadline::within(deadline, next.run(request).instrument(span.clone()));
        match tokio::time::timeout_at(deadline.into(), handled).await {
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

/// Errors of the compatible APIs, wherever they arise (keys, timeouts, the handler), in their clients' shape.
async fn speak_dialect(request: Request, next: Next) -> Response {
    let dialect = Dialect::of_path(request.uri().path());
    dialect.render(next.run(request).await)
}

/// Records the matched route pattern (`/documents/{docid}`, not the concrete path) for metrics.
async fn label_route(request: Request, next: Next) -> Response {
    if let (Some(label), Some(matched)) =
        (request.extensions().get::<RouteLabel>(), request.extensions().get::<MatchedPath>())
    {
        let _ = label.0.set(matched.as_str().to_string());
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_origins() {
        let allowed = vec!["search.example.org".to_string()];
        assert!(host_allowed("localhost:8080", true, &[]));
        assert!(host_allowed("127.0.0.1", true, &[]));
        assert!(host_allowed("[::1]:80", true, &[]));
        assert!(!host_allowed("evil.example:8080", true, &[]), "a rebinding page's name, on a loopback server");
        assert!(host_allowed("search.example.org:8080", true, &allowed));
        assert!(host_allowed("anything.example", false, &[]), "beyond loopback with no list: any host");
        assert!(!host_allowed("anything.example", false, &allowed));
        assert!(origin_allowed("http://localhost:8080", "localhost:8080", &[]));
        assert!(!origin_allowed("http://evil.example", "localhost:8080", &[]));
        assert!(origin_allowed("https://app.example", "localhost:8080", &["https://app.example/".to_string()]));
    }

    #[test]
    fn keys_compare_whole() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT") && !constant_time_eq(b"secret", b"secre"));
    }
}
