//! An upload sent to a replica that does not write the collections, forwarded to the one that does, streamed
//! both ways (the body is never held whole). A proxy, not a redirect: behind HAProxy a redirect would point the
//! client at a replica's internal address. The client's headers go along (its key, its Idempotency-Key, the
//! body's type), less those that belong to one connection.

use std::sync::OnceLock;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderName};
use axum::response::Response;

use super::ApiError;
use crate::scheduler::tasks::TaskError;

/// Headers of one hop (RFC 9110, 7.6.1), and the ones the client sets itself.
const HOP: [HeaderName; 6] =
    [header::CONNECTION, header::HOST, header::TE, header::TRAILER, header::TRANSFER_ENCODING, header::UPGRADE];

/// `request` sent to the writer at `base` (`http://HOST:PORT`), and its answer.
pub async fn to_writer(base: &str, request: Request) -> Result<Response, ApiError> {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    let client = CLIENT.get_or_init(|| {
        crate::replication::objects::install_tls();
        reqwest::Client::new()
    });
    let (parts, body) = request.into_parts();
    let target = format!("{base}{}", parts.uri.path_and_query().map_or("/", |p| p.as_str()));
    let mut forwarded = client.request(parts.method, target);
    for (name, value) in parts.headers.iter().filter(|(name, _)| !HOP.contains(name)) {
        forwarded = forwarded.header(name, value);
    }
    let unreachable = |e: reqwest::Error| ApiError::from(TaskError::NoWriter(format!("{base}: {e}")));
    let answer =
        forwarded.body(reqwest::Body::wrap_stream(body.into_data_stream())).send().await.map_err(unreachable)?;
    let mut response = Response::builder().status(answer.status());
    for (name, value) in answer.headers().iter().filter(|(name, _)| !HOP.contains(name)) {
        response = response.header(name, value);
    }
    response.body(Body::from_stream(answer.bytes_stream())).map_err(|e| ApiError::internal(e.to_string()))
}
