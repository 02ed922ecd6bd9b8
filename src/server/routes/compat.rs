//! `POST /v2/rerank`, `POST /v1/rerank` and `POST /tei/rerank`: other servers' rerank APIs; `POST /embed` and
//! `POST /v1/embeddings`: their embedding APIs (`server::compat`).

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;

use crate::server::compat::{
    CohereV2Request, CohereV2Response, OpenAiEmbeddingsRequest, OpenAiEmbeddingsResponse, TeiEmbedRequest, TeiRequest,
    TeiResult, V1Request, V1Response,
};
use crate::server::decode::ApiJson;
use crate::server::error::{ApiError, CohereErrors, EmbedErrors, TeiEmbedErrors, TeiErrors};
use crate::server::middleware::REQUEST_ID;
use crate::server::AppState;

/// Cohere's rerank API v2 (`cohere.ClientV2(base_url=...).rerank`): each document segmented and scored MaxP
/// by a longrank model; `relevance_score` is the MaxP score's sigmoid.
#[utoipa::path(post, path = "/v2/rerank", tag = "compatible", request_body = CohereV2Request,
    responses((status = 200, body = CohereV2Response), CohereErrors))]
pub async fn cohere_v2(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<CohereV2Request>,
) -> Result<Json<CohereV2Response>, ApiError> {
    let (request, translation) = request.translate(&state.engine().models().names());
    let response = state.rerank(request).await?;
    Ok(Json(translation.cohere_v2(request_id(&headers), response)))
}

/// Cohere's v1 and Jina's rerank API: as `/v2/rerank`, documents as texts or `{"text": ...}`.
#[utoipa::path(post, path = "/v1/rerank", tag = "compatible", request_body = V1Request,
    responses((status = 200, body = V1Response), CohereErrors))]
pub async fn v1(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<V1Request>,
) -> Result<Json<V1Response>, ApiError> {
    let (request, translation) = request.translate(&state.engine().models().names());
    let response = state.rerank(request).await?;
    Ok(Json(translation.v1(request_id(&headers), response)))
}

/// text-embeddings-inference's `/rerank` with the default model: MaxP over every segment (FirstP with
/// `truncate`); `score` is the sigmoid unless `raw_scores`.
#[utoipa::path(post, path = "/tei/rerank", tag = "compatible", request_body = TeiRequest,
    responses((status = 200, body = Vec<TeiResult>), TeiErrors))]
pub async fn tei(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<TeiRequest>,
) -> Result<Json<Vec<TeiResult>>, ApiError> {
    let raw_scores = request.raw_scores;
    let (request, translation) = request.translate(&state.engine().models().names());
    let response = state.rerank(request).await?;
    Ok(Json(translation.tei(response, raw_scores)))
}

/// text-embeddings-inference's `/embed`: one embedding per input, by a served bi-encoder.
#[utoipa::path(post, path = "/embed", tag = "compatible", request_body = TeiEmbedRequest,
    responses((status = 200, body = Vec<Vec<f32>>), TeiEmbedErrors))]
pub async fn tei_embed(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<TeiEmbedRequest>,
) -> Result<Json<Vec<Vec<f32>>>, ApiError> {
    Ok(Json(state.embed(request.into()).await?.vectors))
}

/// OpenAI's embeddings API (`openai.OpenAI(base_url=...).embeddings.create`), by a served bi-encoder.
#[utoipa::path(post, path = "/v1/embeddings", tag = "compatible", request_body = OpenAiEmbeddingsRequest,
    responses((status = 200, body = OpenAiEmbeddingsResponse), EmbedErrors))]
pub async fn openai_embeddings(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<OpenAiEmbeddingsRequest>,
) -> Result<Json<OpenAiEmbeddingsResponse>, ApiError> {
    let (request, format) = request.translate();
    Ok(Json(OpenAiEmbeddingsResponse::new(state.embed(request).await?, format)))
}

/// The request's id (`observe` gives every request one), as the response's `id`.
fn request_id(headers: &HeaderMap) -> String {
    headers.get(REQUEST_ID).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string()
}
