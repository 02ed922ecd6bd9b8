//! The web page in `static/`, compiled into the binary so the server runs from any directory.

use axum::http::header;
use axum::response::IntoResponse;

use crate::server::error::{ApiError, ApiPath};

const FILES: [(&str, &str, &str); 7] = [
    ("index.html", "text/html; charset=utf-8", include_str!("../../../static/index.html")),
    ("common.js", "text/javascript; charset=utf-8", include_str!("../../../static/common.js")),
    ("search.js", "text/javascript; charset=utf-8", include_str!("../../../static/search.js")),
    ("batch.js", "text/javascript; charset=utf-8", include_str!("../../../static/batch.js")),
    ("collections.js", "text/javascript; charset=utf-8", include_str!("../../../static/collections.js")),
    ("app.js", "text/javascript; charset=utf-8", include_str!("../../../static/app.js")),
    ("style.css", "text/css; charset=utf-8", include_str!("../../../static/style.css")),
];

pub async fn index() -> impl IntoResponse {
    asset("index.html").expect("index.html is embedded")
}

pub async fn static_file(ApiPath(name): ApiPath<String>) -> Result<impl IntoResponse, ApiError> {
    asset(&name).ok_or_else(|| ApiError::not_found(&format!("/static/{name}")))
}

fn asset(name: &str) -> Option<impl IntoResponse> {
    let (_, mime, body) = FILES.iter().find(|(n, _, _)| *n == name)?;
    Some(([(header::CONTENT_TYPE, *mime), (header::CACHE_CONTROL, "no-cache")], *body))
}
