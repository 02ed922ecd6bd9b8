//! One JSON error shape for every failure, `{"error": {"code", "message"}}`, with stable codes; every
//! rejection of axum's extractors is mapped here too, so no plain-text error ever leaves the server.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::jobs::JobError;
use crate::model::ModelError;
use crate::rank::RankError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Seconds for `Retry-After` (429 and 503).
    pub retry_after_s: u64,
}

/// The body of every error response.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable machine-readable code, e.g. `empty_query`, `unknown_collection`, `body_too_large`.
    pub code: String,
    /// What went wrong, for people.
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into(), retry_after_s: 1 }
    }

    pub fn not_found(what: &str) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no route for {what}"))
    }

    pub fn method_not_allowed() -> ApiError {
        ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "method not allowed on this route")
    }

    pub fn not_ready() -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "not_ready", "the server is still opening its indexes")
    }

    pub fn timeout(ms: u64) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "timeout", format!("request took longer than {ms} ms"))
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(code = self.code, "{}", self.message);
        }
        let body = ErrorBody { error: ErrorDetail { code: self.code.to_string(), message: self.message } };
        let mut response = (self.status, axum::Json(body)).into_response();
        if matches!(self.status, StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS) {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(self.retry_after_s));
        }
        response
    }
}

impl From<RankError> for ApiError {
    fn from(e: RankError) -> ApiError {
        use StatusCode as S;
        let (status, code) = match &e {
            RankError::EmptyQuery => (S::BAD_REQUEST, "empty_query"),
            RankError::QueryTooLong { .. } => (S::BAD_REQUEST, "query_too_long"),
            RankError::OutOfRange { .. } => (S::BAD_REQUEST, "out_of_range"),
            RankError::InvalidParameter(_) => (S::BAD_REQUEST, "invalid_parameter"),
            RankError::UnknownPipeline { .. } => (S::UNPROCESSABLE_ENTITY, "unknown_pipeline"),
            RankError::CollectionRequired { .. } => (S::BAD_REQUEST, "collection_required"),
            RankError::UnknownCollection { .. } => (S::NOT_FOUND, "unknown_collection"),
            RankError::UnknownDocument { .. } => (S::NOT_FOUND, "unknown_document"),
            RankError::AmbiguousDocument { .. } => (S::CONFLICT, "ambiguous_document"),
            RankError::ModelRequired { .. } => (S::UNPROCESSABLE_ENTITY, "model_required"),
            RankError::UnknownModel { .. } => (S::UNPROCESSABLE_ENTITY, "unknown_model"),
            RankError::ModelUnavailable { .. } => (S::SERVICE_UNAVAILABLE, "model_unavailable"),
            RankError::Model(ModelError::Overloaded { retry_after_s, .. }) => {
                let mut error = ApiError::new(S::TOO_MANY_REQUESTS, "overloaded", e.to_string());
                error.retry_after_s = *retry_after_s;
                return error;
            }
            // The client is gone; nginx's 499 says so in logs.
            RankError::Model(ModelError::Cancelled) => (S::from_u16(499).expect("499 is a valid status"), "cancelled"),
            RankError::Model(_) => (S::INTERNAL_SERVER_ERROR, "model_error"),
            RankError::Index(_) => (S::INTERNAL_SERVER_ERROR, "index_error"),
        };
        ApiError::new(status, code, e.to_string())
    }
}

impl From<JobError> for ApiError {
    fn from(e: JobError) -> ApiError {
        match e {
            JobError::Rank(e) => e.into(),
            JobError::Input(e) => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "malformed_file", e.to_string()),
            JobError::UnknownJob(_) => ApiError::new(StatusCode::NOT_FOUND, "unknown_job", e.to_string()),
            JobError::Conflict { .. } => ApiError::new(StatusCode::CONFLICT, "job_conflict", e.to_string()),
            JobError::Store(_) | JobError::Worker(_) => ApiError::internal(e.to_string()),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> ApiError {
        let message = r.body_text();
        match r {
            JsonRejection::JsonSyntaxError(_) => ApiError::new(StatusCode::BAD_REQUEST, "malformed_json", message),
            JsonRejection::JsonDataError(_) => ApiError::new(StatusCode::BAD_REQUEST, "invalid_body", message),
            JsonRejection::MissingJsonContentType(_) => {
                ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", message)
            }
            other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", message)
            }
            other => ApiError::new(other.status(), "invalid_body", message),
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_query_string", r.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_path", r.body_text())
    }
}

/// `axum::Json` with rejections in our error shape.
#[derive(axum::extract::FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct ApiJson<T>(pub T);

/// `axum::extract::Query` with rejections in our error shape.
#[derive(axum::extract::FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct ApiQuery<T>(pub T);

/// `axum::extract::Path` with rejections in our error shape.
#[derive(axum::extract::FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);
