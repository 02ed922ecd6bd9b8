//! The OpenAPI description, generated from the handlers and types themselves.

use utoipa::OpenApi;

use super::routes::{batch, collections, compat, documents, pipelines, rerank, search, system, tasks};

#[derive(OpenApi)]
#[openapi(
    info(title = "longrank", description = "Search and re-ranking server for long documents."),
    paths(
        search::post_search,
        search::get_search,
        documents::get_document,
        collections::list_collections,
        collections::create,
        collections::delete,
        collections::add_documents,
        collections::delete_document,
        collections::delete_documents,
        tasks::list,
        tasks::get,
        tasks::cancel,
        pipelines::list_pipelines,
        rerank::rerank,
        compat::cohere_v2,
        compat::v1,
        compat::tei,
        batch::submit,
        batch::list,
        batch::get,
        batch::run_file,
        batch::cancel,
        batch::compare,
        system::health,
        system::metrics,
    ),
    components(schemas(
        super::error::ErrorBody,
        super::error::CohereErrorBody,
        super::error::TeiErrorBody,
        super::error::ErrorCode,
        crate::rank::Pipeline,
        crate::corpus::Format,
        crate::index::OnError,
        crate::store::TaskStatus
    )),
    tags(
        (name = "search", description = "Ranking"),
        (name = "documents", description = "Stored documents"),
        (name = "collections", description = "Indexed collections, and the tasks that write them"),
        (name = "batch", description = "Batch runs over TREC topic files, with trec_eval metrics"),
        (name = "system", description = "Health and metrics"),
        (name = "compatible", description = "Other servers' rerank APIs: Cohere v2 and v1, Jina, text-embeddings-inference"),
    )
)]
pub struct ApiDoc;
