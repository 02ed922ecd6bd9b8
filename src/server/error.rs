//! One JSON error shape for every failure, `{"error": {"code", "message"}}`. Each stable code is declared
//! once, in `ErrorCode`, with its status; the lower layers' errors map onto codes here and nowhere else, and
//! every rejection of axum's extractors too, so no plain-text error ever leaves the server. The OpenAPI
//! document lists the codes (the `ErrorCode` schema) and, per route, the statuses with their codes.

use std::collections::BTreeMap;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::openapi::{ContentBuilder, RefOr, ResponseBuilder};
use utoipa::ToSchema;

use super::access::Access;
use crate::index::IndexError;
use crate::model::ModelError;
use crate::rank::RankError;
use crate::scheduler::cluster::ClusterError;
use crate::scheduler::jobs::JobError;
use crate::scheduler::tasks::TaskError;
use crate::store::StoreError;

/// Declares every code once: its variant, its text, its HTTP status and what it means.
macro_rules! codes {
    ($($variant:ident = $code:literal, $status:literal, $doc:literal;)*) => {
        /// Stable machine-readable error codes.
        // `rename_all`, not a `rename` per variant: utoipa does not read a rename whose value comes from a macro
        // argument (the schema listed the variants' names). A test checks that both spell `$code`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum ErrorCode {
            $(#[doc = $doc] $variant,)*
        }

        impl ErrorCode {
            pub const ALL: &[ErrorCode] = &[$(ErrorCode::$variant,)*];

            pub fn as_str(self) -> &'static str {
                match self { $(ErrorCode::$variant => $code,)* }
            }

            pub fn status(self) -> StatusCode {
                let status = match self { $(ErrorCode::$variant => $status,)* };
                StatusCode::from_u16(status).expect("codes have valid statuses")
            }

            pub fn description(self) -> &'static str {
                match self { $(ErrorCode::$variant => $doc,)* }
            }
        }
    };
}

codes! {
    MalformedJson = "malformed_json", 400, "The body is not valid JSON.";
    InvalidBody = "invalid_body", 400, "A field is missing, mistyped or unknown (JSON body or multipart form).";
    DuplicateField = "duplicate_field", 400, "A JSON key, multipart part or query parameter is given more than once.";
    InvalidQueryString = "invalid_query_string", 400, "A query parameter is unknown, mistyped, or an object.";
    InvalidPath = "invalid_path", 400, "A path parameter is malformed.";
    EmptyQuery = "empty_query", 400, "The query (or a topic's) has no text.";
    QueryTooLong = "query_too_long", 400, "The query is longer than `limits.max_query_chars`, or (decoder rerankers, which never cut it) than `model.max_query_tokens` with its instruction.";
    OutOfRange = "out_of_range", 400, "A number is outside its range (k, depth, bm25, rm3, interpolate, \
        preselect, documents, cluster settings).";
    InvalidTag = "invalid_tag", 400, "The run tag is not one word.";
    InvalidSegments = "invalid_segments", 400, "The segmenting options are inconsistent.";
    RerankingPipelineRequired = "reranking_pipeline_required", 400, "This needs a re-ranking pipeline, not bm25 or bm25+rm3.";
    NotApplicable = "not_applicable", 400, "A parameter that does not apply to this route or pipeline (a first-stage one for /rerank, rm3 to a pipeline other than bm25+rm3).";
    DocumentsOrDocids = "documents_or_docids", 400, "/rerank needs either documents or docids.";
    NoFirstStage = "no_first_stage", 400, "interpolate needs first-stage scores, which documents given as text lack.";
    CollectionRequired = "collection_required", 400, "Several collections and no default: name one.";
    InvalidIdempotencyKey = "invalid_idempotency_key", 400, "An Idempotency-Key must be 1 to 255 printable ASCII \
        characters.";
    InvalidCollectionName = "invalid_collection_name", 400, "A collection name must be letters, digits, '-', '_' \
        and '.' (not leading), at most 128.";
    InputTooLong = "input_too_long", 400, "An input to embed is longer than the model reads, and the request does \
        not ask to cut it (`truncate`).";
    MissingKey = "missing_key", 401, "The route needs a key (`Authorization: Bearer KEY`) and none was sent.";
    InvalidKey = "invalid_key", 403, "The key is not one of this server's.";
    InsufficientKey = "insufficient_key", 403, "A search key on a route that needs an admin key.";
    AdminKeyRequired = "admin_key_required", 403, "The server listens beyond loopback and has no admin key: it serves reads only.";
    ForbiddenOrigin = "forbidden_origin", 403, "A write from a page of another origin than the server's or `server.cors_origins`.";
    ForbiddenHost = "forbidden_host", 403, "The Host header names neither a loopback name nor one of `server.allowed_hosts`.";
    NotFound = "not_found", 404, "No such route or static file.";
    UnknownCollection = "unknown_collection", 404, "No collection of that name.";
    UnknownDocument = "unknown_document", 404, "No document with that docid.";
    UnknownJob = "unknown_job", 404, "No batch job with that id.";
    UnknownTask = "unknown_task", 404, "No task with that id.";
    MethodNotAllowed = "method_not_allowed", 405, "The route does not take this method.";
    AmbiguousDocument = "ambiguous_document", 409, "The docid exists in several collections; name one.";
    NoVectors = "no_vectors", 409, "A dense or hybrid first stage on a collection whose segments lack the \
        bi-encoder's stored embeddings: run `longrank embed` on it (the message says how).";
    OtherModelsIndex = "other_models_index", 409, "The collection's vector index beside this bi-encoder's \
        embeddings holds another model's (the message names it): remove it and run `longrank embed`.";
    CollectionInUse = "collection_in_use", 409, "The collection is read by a queued or running batch job.";
    JobConflict = "job_conflict", 409, "The job is not in a state that allows this (the run of an unfinished job, cancelling a finished one).";
    TaskConflict = "task_conflict", 409, "A finished task cannot be cancelled.";
    ReadOnlyReplica = "read_only_replica", 409, "This server is a replica (its store is PostgreSQL) without an object \
        store: its collections are read-only; build a collection with `longrank index` and copy its directory to each \
        replica, or give the replicas `store.objects`.";
    BodyTooLarge = "body_too_large", 413, "The body is larger than `server.max_body_bytes`.";
    UploadTooLarge = "upload_too_large", 413, "A document upload is larger than `limits.max_upload_bytes`; nothing \
        of it is kept.";
    UriTooLong = "uri_too_long", 414, "The request's target (path and query string) is longer than 32 KiB: send \
        the parameters in a POST body.";
    UnsupportedMediaType = "unsupported_media_type", 415, "The body is not JSON (or multipart where taken).";
    UnknownPipeline = "unknown_pipeline", 422, "No pipeline of that name.";
    PipelineUnavailable = "pipeline_unavailable", 422, "The pipeline cannot run now: its model could not be loaded, or is not what it needs (cobert without a Co-BERT model); the message says why.";
    ModelRequired = "model_required", 422, "A re-ranking pipeline or embeddings, and no model is configured.";
    UnknownModel = "unknown_model", 422, "No model of that name.";
    NotABiEncoder = "not_a_bi_encoder", 422, "The model named is not a bi-encoder (embeddings computed ahead or \
        asked for, a `bi-encoder:NAME` selector, a dense or hybrid first stage's model).";
    IdempotencyKeyReused = "idempotency_key_reused", 422, "The Idempotency-Key was given to a job or task submitted \
        with another route, parameters or files (the message names it): a new write needs a new key.";
    MalformedFile = "malformed_file", 422, "A topic, qrels or run file does not parse (the message names the line).";
    Overloaded = "overloaded", 429, "The server is at capacity (`server.max_waiting_requests` waiting, the \
        request's turn or the model's queue would end past its timeout, or the queue is full); retry after \
        `Retry-After` seconds (the estimated wait, at most the timeout).";
    HeadersTooLarge = "headers_too_large", 431, "The request's headers are more than 100, or more than 64 KiB \
        in all.";
    Cancelled = "cancelled", 499, "The client went away before the answer (logged only).";
    Internal = "internal", 500, "A failure of the server: the message gives an incident id, the server log has the details.";
    ModelError = "model_error", 500, "The model failed on this input.";
    IndexError = "index_error", 500, "The index failed to answer.";
    NotReady = "not_ready", 503, "The server is still opening its indexes; retry after `Retry-After` seconds.";
    Timeout = "timeout", 503, "The request ran longer than `server.request_timeout_ms` (the model's finished work \
        is kept for a retry; the message says what cuts the work).";
    ModelUnavailable = "model_unavailable", 503, "A model asked for by name outside a pipeline could not be loaded (the message says why).";
    StoreUnavailable = "store_unavailable", 503, "The database (`store.url`) did not answer: PostgreSQL is down or unreachable; retry after `Retry-After` seconds.";
    NoWriter = "no_writer", 503, "An upload to a replica is forwarded to the replica that writes the collections: none does at this moment (another takes over within a second of the writer's end), or it could not be reached; send it again.";
}

#[derive(Debug)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    /// Seconds for `Retry-After` (429 and 503).
    pub retry_after_s: u64,
}

/// The body of every error response.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorDetail {
    pub code: ErrorCode,
    /// What went wrong, for people.
    pub message: String,
}

/// The error bodies of the compatible APIs (`compat`): the same code and status as the native body, in the
/// shape their clients parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `ErrorBody`.
    Longrank,
    /// Cohere's (v1, v2; Jina's clients read it too): `CohereErrorBody`.
    Cohere,
    /// text-embeddings-inference's: `TeiErrorBody`.
    Tei,
}

/// Cohere's error body: `message`, and the code.
#[derive(Debug, Serialize, ToSchema)]
pub struct CohereErrorBody {
    pub message: String,
    pub code: ErrorCode,
}

/// text-embeddings-inference's error body: `error`, and the code as `error_type`.
#[derive(Debug, Serialize, ToSchema)]
pub struct TeiErrorBody {
    pub error: String,
    pub error_type: ErrorCode,
}

impl Dialect {
    /// The dialect of a route's errors, by its path.
    pub fn of_path(path: &str) -> Dialect {
        use super::compat::paths;
        match path {
            paths::COHERE_V1 | paths::COHERE_V2 => Dialect::Cohere,
            paths::TEI | paths::TEI_EMBED => Dialect::Tei,
            _ => Dialect::Longrank,
        }
    }

    fn schema_name(self) -> &'static str {
        match self {
            Dialect::Longrank => "ErrorBody",
            Dialect::Cohere => "CohereErrorBody",
            Dialect::Tei => "TeiErrorBody",
        }
    }

    fn body(self, code: ErrorCode, message: String) -> serde_json::Value {
        let body = match self {
            Dialect::Longrank => serde_json::to_value(ErrorBody { error: ErrorDetail { code, message } }),
            Dialect::Cohere => serde_json::to_value(CohereErrorBody { message, code }),
            Dialect::Tei => serde_json::to_value(TeiErrorBody { error: message, error_type: code }),
        };
        body.expect("error bodies serialize")
    }

    /// An error response rendered again in this dialect (any other response as it is).
    pub fn render(self, response: Response) -> Response {
        let Some(ErrorDetail { code, message }) = response.extensions().get::<ErrorDetail>().cloned() else {
            return response;
        };
        if self == Dialect::Longrank {
            return response;
        }
        let (mut parts, _) = response.into_parts();
        parts.headers.remove(header::CONTENT_LENGTH);
        Response::from_parts(parts, axum::body::Body::from(self.body(code, message).to_string()))
    }
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError { code, message: message.into(), retry_after_s: 1 }
    }

    pub fn not_found(what: &str) -> ApiError {
        ApiError::new(ErrorCode::NotFound, format!("no route for {what}"))
    }

    pub fn method_not_allowed() -> ApiError {
        ApiError::new(ErrorCode::MethodNotAllowed, "method not allowed on this route")
    }

    pub fn not_ready() -> ApiError {
        ApiError::new(ErrorCode::NotReady, "the server is still opening its indexes")
    }

    /// 429 `overloaded`, retry after `retry_after_s` seconds.
    pub fn overloaded(message: impl Into<String>, retry_after_s: u64) -> ApiError {
        ApiError { retry_after_s, ..ApiError::new(ErrorCode::Overloaded, message) }
    }

    pub fn timeout(ms: u64) -> ApiError {
        ApiError::new(
            ErrorCode::Timeout,
            format!(
                "request took longer than {ms} ms (server.request_timeout_ms); the model's finished work is kept, so \
                 a retry gets further. Less work per request: a smaller depth, a preselect (the segments the model \
                 reads), a bi-encoder's embeddings computed ahead (longrank embed)"
            ),
        )
    }

    /// The answer for engine work that failed with `e`. Work that stopped because its deadline passed (it can
    /// see the deadline before the timeout layer's timer fires) timed out: it is not a client that went away.
    pub fn of_work(e: RankError, expired: bool, timeout_ms: u64) -> ApiError {
        if expired && e.code() == ErrorCode::Cancelled {
            return ApiError::timeout(timeout_ms);
        }
        let mut error = ApiError::from(e);
        // A retry is worth more than the wait for the timeout: the estimate beyond it is not waited for.
        error.retry_after_s = error.retry_after_s.min(timeout_ms.div_ceil(1000).max(1));
        error
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorCode::Internal, message)
    }

    /// A body that could not be read or decoded: too large, or invalid.
    pub fn body(status: StatusCode, message: impl Into<String>) -> ApiError {
        let code =
            if status == StatusCode::PAYLOAD_TOO_LARGE { ErrorCode::BodyTooLarge } else { ErrorCode::InvalidBody };
        ApiError::new(code, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.code.status();
        let mut message = self.message;
        if self.code == ErrorCode::Internal {
            // What failed inside (a panic's message, a path of the data directory) goes to the log only; the
            // client gets an id to quote.
            let id = incident_id();
            tracing::error!(code = self.code.as_str(), incident = %id, "{message}");
            message = format!("internal error {id}: the server's log has the details");
        } else if status.is_server_error() && self.code != ErrorCode::NotReady && self.code != ErrorCode::Timeout {
            tracing::error!(code = self.code.as_str(), "{message}");
        }
        let detail = ErrorDetail { code: self.code, message };
        let mut response =
            (status, axum::Json(Dialect::Longrank.body(detail.code, detail.message.clone()))).into_response();
        // Kept for `Dialect::render`.
        response.extensions_mut().insert(detail);
        if matches!(status, StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS) {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(self.retry_after_s));
        }
        response
    }
}

/// A short id, unique within the process and unlikely across restarts, naming one internal error in the log.
fn incident_id() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    format!("{:08x}-{n}", (nanos >> 16) as u32)
}

impl RankError {
    fn code(&self) -> ErrorCode {
        use ErrorCode as C;
        match self {
            RankError::EmptyQuery => C::EmptyQuery,
            RankError::QueryTooLong { .. } => C::QueryTooLong,
            RankError::OutOfRange { .. } => C::OutOfRange,
            RankError::Topic { source, .. } => source.code(),
            RankError::InvalidTag(_) => C::InvalidTag,
            RankError::InvalidInstruction(_) => C::InvalidBody,
            RankError::InvalidSegments(_) => C::InvalidSegments,
            RankError::RerankingPipelineRequired { .. } => C::RerankingPipelineRequired,
            RankError::NotApplicable { .. } => C::NotApplicable,
            RankError::DocumentsOrDocids => C::DocumentsOrDocids,
            RankError::NoFirstStage => C::NoFirstStage,
            RankError::UnknownPipeline { .. } => C::UnknownPipeline,
            RankError::PipelineUnavailable { .. } => C::PipelineUnavailable,
            RankError::CollectionRequired { .. } => C::CollectionRequired,
            RankError::UnknownCollection { .. } => C::UnknownCollection,
            RankError::UnknownDocument { .. } => C::UnknownDocument,
            RankError::AmbiguousDocument { .. } => C::AmbiguousDocument,
            RankError::ModelRequired { .. } => C::ModelRequired,
            RankError::UnknownModel { .. } => C::UnknownModel,
            RankError::ModelUnavailable { .. } => C::ModelUnavailable,
            RankError::NotABiEncoder { .. } | RankError::DenseModelRequired { .. } => C::NotABiEncoder,
            RankError::NoVectors { .. } => C::NoVectors,
            RankError::InputTooLong { .. } => C::InputTooLong,
            RankError::Unresumable(_) => C::JobConflict,
            RankError::Model(ModelError::Overloaded { .. }) => C::Overloaded,
            RankError::Model(ModelError::Cancelled) | RankError::Index(IndexError::Cancelled) => C::Cancelled,
            RankError::Model(ModelError::QueryOverBudget { .. }) => C::QueryTooLong,
            RankError::Model(ModelError::OtherModelsIndex(_)) => C::OtherModelsIndex,
            RankError::Model(_) => C::ModelError,
            RankError::Index(_) => C::IndexError,
        }
    }
}

impl From<RankError> for ApiError {
    fn from(e: RankError) -> ApiError {
        let mut error = ApiError::new(e.code(), e.to_string());
        if let RankError::Model(ModelError::Overloaded { retry_after_s, .. }) = e {
            error.retry_after_s = retry_after_s;
        }
        error
    }
}

impl From<JobError> for ApiError {
    fn from(e: JobError) -> ApiError {
        match e {
            JobError::Rank(e) => e.into(),
            JobError::Input(e) => ApiError::new(ErrorCode::MalformedFile, e.to_string()),
            JobError::UnknownJob(_) => ApiError::new(ErrorCode::UnknownJob, e.to_string()),
            JobError::Conflict { .. } => ApiError::new(ErrorCode::JobConflict, e.to_string()),
            JobError::CollectionInUse { .. } => ApiError::new(ErrorCode::CollectionInUse, e.to_string()),
            JobError::KeyReused { .. } => ApiError::new(ErrorCode::IdempotencyKeyReused, e.to_string()),
            JobError::Store(e) => e.into(),
            JobError::Worker(_) => ApiError::internal(e.to_string()),
        }
    }
}

impl From<ClusterError> for ApiError {
    fn from(e: ClusterError) -> ApiError {
        match e {
            ClusterError::Settings(e) => ApiError::new(ErrorCode::OutOfRange, e.to_string()),
            ClusterError::Store(e) => e.into(),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        if !e.is_unavailable() {
            return ApiError::internal(e.to_string());
        }
        ApiError::new(ErrorCode::StoreUnavailable, format!("the database did not answer: {e}"))
    }
}

impl From<TaskError> for ApiError {
    fn from(e: TaskError) -> ApiError {
        // A model refused (an embedding task's): said as a search would say it.
        let e = match e {
            TaskError::Rank(e) => return e.into(),
            e => e,
        };
        let code = match &e {
            TaskError::Store(e) if e.is_unavailable() => ErrorCode::StoreUnavailable,
            TaskError::UnknownTask(_) => ErrorCode::UnknownTask,
            TaskError::NotCancellable { .. } => ErrorCode::TaskConflict,
            TaskError::ReadOnly => ErrorCode::ReadOnlyReplica,
            TaskError::NoWriter(_) => ErrorCode::NoWriter,
            TaskError::KeyReused { .. } => ErrorCode::IdempotencyKeyReused,
            TaskError::TooLarge { .. } => ErrorCode::UploadTooLarge,
            TaskError::Upload(_) | TaskError::NoDocuments(_) => ErrorCode::InvalidBody,
            TaskError::Index(IndexError::InvalidName(_)) => ErrorCode::InvalidCollectionName,
            TaskError::Index(IndexError::UnknownCollection(_)) => ErrorCode::UnknownCollection,
            TaskError::Index(_)
            | TaskError::Store(_)
            | TaskError::Io(_)
            | TaskError::Job(_)
            | TaskError::Rank(_)
            | TaskError::Unpublished(_) => return ApiError::internal(e.to_string()),
        };
        ApiError::new(code, e.to_string())
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> ApiError {
        let message = r.body_text();
        match r {
            JsonRejection::JsonSyntaxError(_) => ApiError::new(ErrorCode::MalformedJson, message),
            JsonRejection::MissingJsonContentType(_) => ApiError::new(ErrorCode::UnsupportedMediaType, message),
            other => ApiError::body(other.status(), message),
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> ApiError {
        ApiError::new(ErrorCode::InvalidQueryString, r.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> ApiError {
        ApiError::new(ErrorCode::InvalidPath, r.body_text())
    }
}

/// `axum::extract::Query` with rejections in our error shape.
#[derive(axum::extract::FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct ApiQuery<T>(pub T);

/// `axum::extract::Path` with rejections in our error shape.
#[derive(axum::extract::FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);

/// Codes any route can answer: the host check, the request head's size, readiness, the timeout, failures.
const EVERY_ROUTE: &[ErrorCode] = &[
    ErrorCode::ForbiddenHost,
    ErrorCode::UriTooLong,
    ErrorCode::HeadersTooLarge,
    ErrorCode::NotReady,
    ErrorCode::Timeout,
    ErrorCode::Internal,
];

/// Codes a route that needs a key can answer.
const KEYED: &[ErrorCode] = &[ErrorCode::MissingKey, ErrorCode::InvalidKey];

/// Declares a route's error responses for OpenAPI: the codes it can answer besides `EVERY_ROUTE` and those of
/// its access (keys), grouped by status, each status described by its codes.
macro_rules! route_errors {
    ($($(#[$meta:meta])* $name:ident($access:ident $(, $dialect:ident)?): [$($code:ident),* $(,)?];)*) => {
        $(
            $(#[$meta])*
            pub struct $name;

            impl utoipa::IntoResponses for $name {
                fn responses() -> BTreeMap<String, RefOr<utoipa::openapi::response::Response>> {
                    let dialect = [$(Dialect::$dialect,)? Dialect::Longrank][0];
                    error_responses(&[$(ErrorCode::$code),*], Access::$access, dialect)
                }
            }
        )*
    };
}

route_errors! {
    /// `/search` (POST and GET).
    SearchErrors(Read): [MalformedJson, InvalidBody, InvalidQueryString, DuplicateField, BodyTooLarge,
        UnsupportedMediaType, ForbiddenOrigin, EmptyQuery, QueryTooLong, OutOfRange, InvalidSegments, NotApplicable,
        CollectionRequired, UnknownCollection, UnknownPipeline, PipelineUnavailable, ModelRequired, UnknownModel,
        NotABiEncoder, NoVectors, OtherModelsIndex, Overloaded, ModelUnavailable, ModelError, IndexError];
    /// `/rerank`.
    RerankErrors(Read): [MalformedJson, InvalidBody, BodyTooLarge, UnsupportedMediaType, ForbiddenOrigin,
        EmptyQuery, QueryTooLong, OutOfRange, InvalidSegments, RerankingPipelineRequired, NotApplicable,
        DocumentsOrDocids, NoFirstStage, CollectionRequired, UnknownCollection, UnknownDocument, UnknownPipeline,
        PipelineUnavailable, ModelRequired, UnknownModel, NotABiEncoder, Overloaded, ModelUnavailable, ModelError,
        IndexError];
    /// `/v1/rerank` and `/v2/rerank` (Cohere's and Jina's APIs).
    CohereErrors(Read, Cohere): [MalformedJson, InvalidBody, BodyTooLarge, UnsupportedMediaType, ForbiddenOrigin,
        EmptyQuery, QueryTooLong, OutOfRange, PipelineUnavailable, ModelRequired, NotABiEncoder, Overloaded,
        ModelError];
    /// `/tei/rerank` (text-embeddings-inference's API).
    TeiErrors(Read, Tei): [MalformedJson, InvalidBody, BodyTooLarge, UnsupportedMediaType, ForbiddenOrigin,
        EmptyQuery, QueryTooLong, OutOfRange, PipelineUnavailable, ModelRequired, NotABiEncoder, Overloaded,
        ModelError];
    /// `/embed` (text-embeddings-inference's API).
    TeiEmbedErrors(Read, Tei): [MalformedJson, InvalidBody, BodyTooLarge, UnsupportedMediaType, ForbiddenOrigin,
        OutOfRange, InputTooLong, ModelRequired, UnknownModel, NotABiEncoder, Overloaded, ModelUnavailable, ModelError];
    /// `/v1/embeddings` (OpenAI's API, whose clients read longrank's own error body: `error.message`).
    EmbedErrors(Read): [MalformedJson, InvalidBody, BodyTooLarge, UnsupportedMediaType, ForbiddenOrigin,
        OutOfRange, InputTooLong, ModelRequired, UnknownModel, NotABiEncoder, Overloaded, ModelUnavailable, ModelError];
    /// `POST /batch`.
    SubmitErrors(Admin): [MalformedJson, InvalidBody, DuplicateField, BodyTooLarge, UnsupportedMediaType,
        ForbiddenOrigin, EmptyQuery, QueryTooLong, OutOfRange, InvalidTag, InvalidSegments, NotApplicable,
        RerankingPipelineRequired, CollectionRequired, UnknownCollection, UnknownPipeline, PipelineUnavailable,
        ModelRequired, UnknownModel, NotABiEncoder, MalformedFile, ModelUnavailable, InvalidQueryString, IndexError,
        InvalidIdempotencyKey, IdempotencyKeyReused, StoreUnavailable];
    /// Writing a collection: a task queued.
    TaskSubmitErrors(Admin): [InvalidPath, InvalidQueryString, ForbiddenOrigin, InvalidCollectionName, ReadOnlyReplica,
        InvalidIdempotencyKey, IdempotencyKeyReused, StoreUnavailable];
    /// Uploading documents: a task queued once the upload is stored.
    UploadErrors(Admin): [InvalidPath, InvalidQueryString, ForbiddenOrigin, InvalidCollectionName, InvalidBody,
        UploadTooLarge, ReadOnlyReplica, NoWriter, InvalidIdempotencyKey, IdempotencyKeyReused, StoreUnavailable];
    /// Deleting documents by id.
    DeleteDocumentsErrors(Admin): [InvalidPath, InvalidQueryString, ForbiddenOrigin, InvalidCollectionName,
        MalformedJson, InvalidBody, BodyTooLarge, UnsupportedMediaType, ReadOnlyReplica, InvalidIdempotencyKey,
        IdempotencyKeyReused, StoreUnavailable];
    /// Embedding a collection: a task queued.
    EmbedCollectionErrors(Admin): [InvalidPath, InvalidQueryString, ForbiddenOrigin, InvalidCollectionName,
        MalformedJson, InvalidBody, BodyTooLarge, UnsupportedMediaType, UnknownModel, ReadOnlyReplica,
        InvalidIdempotencyKey, IdempotencyKeyReused, StoreUnavailable];
    /// Reading a task, or the list.
    TaskErrors(Read): [InvalidPath, InvalidQueryString, UnknownTask, StoreUnavailable];
    /// Cancelling a task.
    CancelTaskErrors(Admin): [InvalidPath, ForbiddenOrigin, UnknownTask, TaskConflict, StoreUnavailable];
    /// Reading a job by id.
    JobErrors(Read): [InvalidPath, UnknownJob, JobConflict, StoreUnavailable];
    /// The list of jobs.
    ListErrors(Read): [InvalidQueryString, OutOfRange, StoreUnavailable];
    /// Cancelling or deleting a job.
    CancelErrors(Admin): [InvalidPath, ForbiddenOrigin, UnknownJob, StoreUnavailable];
    /// Two jobs compared.
    CompareErrors(Read): [InvalidQueryString, UnknownJob, JobConflict, MalformedFile, StoreUnavailable];
    /// `/documents/{docid}`.
    DocumentErrors(Read): [InvalidPath, InvalidQueryString, UnknownCollection, UnknownDocument, AmbiguousDocument,
        Overloaded, IndexError];
    /// Read-only routes that take no input.
    PlainErrors(Read): [IndexError];
    /// Read-only routes that take no input and run on the engine (`server.max_concurrent_work`).
    EngineErrors(Read): [Overloaded, IndexError];
    /// `GET /cluster`.
    ClusterErrors(Read): [StoreUnavailable];
    /// `PUT /cluster/settings`.
    ClusterSettingsErrors(Admin): [MalformedJson, InvalidBody, DuplicateField, BodyTooLarge, UnsupportedMediaType,
        ForbiddenOrigin, OutOfRange];
    /// `/health`: no key, no input.
    HealthErrors(Open): [];
}

fn error_responses(
    codes: &[ErrorCode],
    access: Access,
    dialect: Dialect,
) -> BTreeMap<String, RefOr<utoipa::openapi::response::Response>> {
    let keyed: &[ErrorCode] = match access {
        Access::Open => &[],
        Access::Read => KEYED,
        Access::Admin => {
            &[ErrorCode::MissingKey, ErrorCode::InvalidKey, ErrorCode::InsufficientKey, ErrorCode::AdminKeyRequired]
        }
    };
    let mut by_status: BTreeMap<u16, Vec<ErrorCode>> = BTreeMap::new();
    for &code in codes.iter().chain(keyed).chain(EVERY_ROUTE) {
        // 499 is only ever logged: the client is gone.
        if code != ErrorCode::Cancelled {
            by_status.entry(code.status().as_u16()).or_default().push(code);
        }
    }
    by_status
        .into_iter()
        .map(|(status, codes)| {
            let names: Vec<&str> = codes.iter().map(|c| c.as_str()).collect();
            let content = ContentBuilder::new()
                .schema(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(dialect.schema_name()))));
            let response = ResponseBuilder::new()
                .description(format!("`{}`", names.join("`, `")))
                .content("application/json", content.build());
            (status.to_string(), RefOr::T(response.build()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_stopped_by_its_deadline_is_a_timeout_and_by_its_client_a_cancel() {
        let cancelled = || RankError::Model(crate::model::ModelError::Cancelled);
        let expired = ApiError::of_work(cancelled(), true, 1000);
        assert_eq!((expired.code, expired.code.status().as_u16()), (ErrorCode::Timeout, 503));
        assert!(expired.message.contains("1000 ms"), "{}", expired.message);
        assert_eq!(ApiError::of_work(cancelled(), false, 1000).code, ErrorCode::Cancelled);
        assert_eq!(ApiError::of_work(RankError::EmptyQuery, true, 1000).code, ErrorCode::EmptyQuery);
    }

    #[test]
    fn every_code_is_in_the_http_pages_table_and_back() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/http.md")).unwrap();
        let table: Vec<&str> = readme
            .lines()
            .skip_while(|l| !l.starts_with("| code | status |"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .collect();
        let codes: Vec<String> = ErrorCode::ALL
            .iter()
            .map(|c| format!("| `{}` | {} | {} |", c.as_str(), c.status().as_u16(), c.description()))
            .collect();
        assert_eq!(
            table, codes,
            "docs/http.md's table of error codes: ErrorCode::ALL in order, statuses and descriptions"
        );
    }

    /// An internal error's body names an incident, never what failed inside (a panic, a path).
    #[test]
    fn internal_errors_answer_an_id_and_keep_the_details_for_the_log() {
        let response =
            ApiError::internal("worker panicked at /srv/data/collections/x: index out of bounds").into_response();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let body = runtime.block_on(axum::body::to_bytes(response.into_body(), 1 << 16)).unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.starts_with("internal error ") && message.ends_with("the server's log has the details"));
        assert!(!message.contains("/srv") && !message.contains("panicked"), "{message}");
        assert_eq!(body["error"]["code"], "internal");
    }

    /// The compatible APIs' errors: the same status, headers and code, in their clients' body.
    #[test]
    fn dialects_render_the_same_error_in_their_bodies() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let body = |response: Response| {
            let bytes = runtime.block_on(axum::body::to_bytes(response.into_body(), 1 << 16)).unwrap();
            serde_json::from_slice::<serde_json::Value>(&bytes).unwrap()
        };
        let error = || ApiError::overloaded("busy", 7).into_response();
        let native = body(error());
        for (dialect, expected) in [
            (Dialect::Longrank, native.clone()),
            (Dialect::Cohere, serde_json::json!({"message": "busy", "code": "overloaded"})),
            (Dialect::Tei, serde_json::json!({"error": "busy", "error_type": "overloaded"})),
        ] {
            let response = dialect.render(error());
            assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(response.headers()[header::RETRY_AFTER], "7");
            assert_eq!(body(response), expected, "{dialect:?}");
        }
        assert_eq!(Dialect::of_path("/v2/rerank"), Dialect::Cohere);
        assert_eq!(Dialect::of_path("/tei/rerank"), Dialect::Tei);
        assert_eq!(Dialect::of_path("/rerank"), Dialect::Longrank);
        let ok = Dialect::Tei.render(axum::Json(serde_json::json!([1])).into_response());
        assert_eq!(body(ok), serde_json::json!([1]), "other responses pass as they are");
    }

    #[test]
    fn codes_serialize_and_are_documented_as_their_text() {
        for code in ErrorCode::ALL {
            assert_eq!(serde_json::to_value(code).unwrap(), code.as_str());
        }
        let schema = serde_json::to_value(<ErrorCode as utoipa::PartialSchema>::schema()).unwrap();
        let codes: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(schema["enum"], serde_json::json!(codes));
    }
}
