//! One thin handler file per API: parse, call the engine once, map the result.

pub mod batch;
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
