//! `POST /search` and `GET /search`.

use axum::extract::State;
use axum::Json;
use utoipa::openapi::path::{Parameter, ParameterIn};
use utoipa::IntoParams;

use crate::rank::{SearchRequest, SearchResponse};
use crate::server::decode::{self, ApiJson, Fields};
use crate::server::error::{ApiError, ApiQuery, SearchErrors};
use crate::server::AppState;

/// Rank documents of a collection for a query.
#[utoipa::path(post, path = "/search", tag = "search", request_body = SearchRequest,
    responses((status = 200, body = SearchResponse), SearchErrors))]
pub async fn post_search(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<SearchRequest>,
) -> Result<Json<SearchResponse>, ApiError> {
    state.search(request).await.map(Json)
}

/// `GET /search` names the query `q`.
const RENAME: &[(&str, &str)] = &[("q", "query")];

/// The query-string form of a search: `SearchRequest`'s scalar fields, `q` for `query`.
pub struct SearchQuery;

impl IntoParams for SearchQuery {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        let to_parameter: Vec<(&str, &str)> = RENAME.iter().map(|(param, field)| (*field, *param)).collect();
        Fields::of::<SearchRequest>().query_parameters(&to_parameter)
    }
}

/// Rank documents of a collection for a query given in the URL.
#[utoipa::path(get, path = "/search", tag = "search", params(SearchQuery),
    responses((status = 200, body = SearchResponse), SearchErrors))]
pub async fn get_search(
    State(state): State<AppState>,
    ApiQuery(pairs): ApiQuery<Vec<(String, String)>>,
) -> Result<Json<SearchResponse>, ApiError> {
    let request = decode::from_query::<SearchRequest>(pairs, RENAME)?;
    state.search(request).await.map(Json)
}
