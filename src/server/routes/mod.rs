//! One thin handler file per API: parse, call the engine once, map the result.

pub mod batch;
pub mod cluster;
pub mod collections;
pub mod compat;
pub mod documents;
pub mod pipelines;
pub mod rerank;
pub mod search;
pub mod system;
pub mod tasks;
pub mod web;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};

use crate::scheduler::jobs::JobView;
use crate::scheduler::tasks::TaskView;
use crate::server::AppState;

/// A write's `Idempotency-Key` header, checked: a repeat of the write with the same key (a client's or a
/// proxy's retry) answers the first job or task instead of making another.
#[derive(Debug, Default, utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
pub struct IdempotencyKey {
    /// 1 to 255 printable ASCII characters naming this write; kept as long as its job or task is.
    #[param(rename = "Idempotency-Key", min_length = 1, max_length = 255, pattern = "^[ -~]{1,255}$")]
    key: Option<String>,
}

impl IdempotencyKey {
    pub fn get(&self) -> Option<&str> {
        self.key.as_deref()
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for IdempotencyKey {
    type Rejection = crate::server::ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        let Some(value) = parts.headers.get("idempotency-key") else { return Ok(IdempotencyKey::default()) };
        match std::str::from_utf8(value.as_bytes()) {
            Ok(key) if (1..=255).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_graphic() || b == b' ') => {
                Ok(IdempotencyKey { key: Some(key.to_string()) })
            }
            _ => Err(crate::server::ApiError::new(
                crate::server::error::ErrorCode::InvalidIdempotencyKey,
                "Idempotency-Key: 1 to 255 printable ASCII characters",
            )),
        }
    }
}

/// Until when a `?wait=true` write waits for its job or task: most of `server.request_timeout_ms`, so that it
/// answers with the job or task itself before the timeout would answer without it.
fn wait_deadline(state: &AppState) -> Instant {
    Instant::now() + Duration::from_millis(state.config().server.request_timeout_ms * 9 / 10)
}

/// A job or task a write started: 200 when it has finished (waited for with `?wait=true`), else 202 with it as
/// it is now and `Location` where to follow it.
pub struct Submitted<T> {
    view: T,
    finished: bool,
    location: String,
}

impl<T: Serialize> IntoResponse for Submitted<T> {
    fn into_response(self) -> Response {
        match self.finished {
            true => Json(self.view).into_response(),
            false => (StatusCode::ACCEPTED, [(header::LOCATION, self.location)], Json(self.view)).into_response(),
        }
    }
}

/// `Submitted`'s answers in the OpenAPI document, for a view of schema `T` followed at `location`.
fn submitted_responses<T: utoipa::ToSchema>(location: &str) -> BTreeMap<String, RefOr<utoipa::openapi::Response>> {
    let content = || ContentBuilder::new().schema(Some(Ref::from_schema_name(T::name()))).build();
    let follow = HeaderBuilder::new().description(Some(format!("{location}, where it is followed"))).build();
    let finished =
        ResponseBuilder::new().description("finished (with `?wait=true`)").content("application/json", content());
    let accepted = ResponseBuilder::new()
        .description("queued or running (with `?wait=true`: not finished within most of `server.request_timeout_ms`)")
        .content("application/json", content())
        .header("location", follow);
    BTreeMap::from([("200".into(), finished.build().into()), ("202".into(), accepted.build().into())])
}

/// The answers of `POST /batch`: the job, finished or followed at its `Location`.
pub struct JobSubmitted;

impl utoipa::IntoResponses for JobSubmitted {
    fn responses() -> BTreeMap<String, RefOr<utoipa::openapi::Response>> {
        submitted_responses::<JobView>("/batch/{id}")
    }
}

/// The answers of a collection write: its task, finished or followed at its `Location`.
pub struct TaskSubmitted;

impl utoipa::IntoResponses for TaskSubmitted {
    fn responses() -> BTreeMap<String, RefOr<utoipa::openapi::Response>> {
        submitted_responses::<TaskView>("/tasks/{id}")
    }
}
