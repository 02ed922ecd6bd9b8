//! The OpenAPI description, generated from the handlers and types themselves.

use serde_json::{json, Value};
use utoipa::OpenApi;

use crate::config::Limits;

use super::routes::{batch, cluster, collections, compat, documents, pipelines, rerank, search, system, tasks};

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
        collections::embed,
        tasks::list,
        tasks::get,
        tasks::cancel,
        pipelines::list_pipelines,
        rerank::rerank,
        compat::cohere_v2,
        compat::v1,
        compat::tei,
        compat::tei_embed,
        compat::openai_embeddings,
        batch::submit,
        batch::list,
        batch::get,
        batch::run_file,
        batch::cancel,
        batch::compare,
        system::health,
        system::metrics,
        cluster::get,
        cluster::put_settings,
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
        (name = "system", description = "Health, metrics, and the replicas sharing the store"),
        (name = "compatible", description = "Other servers' rerank and embedding APIs: Cohere v2 and v1, Jina, text-embeddings-inference, OpenAI's embeddings"),
    )
)]
pub struct ApiDoc;

/// The document this server serves: `ApiDoc` with the bounds the server enforces stated on the fields and
/// parameters they bound (`[limits]` of its configuration, and the fixed ones), so that clients and fuzzers
/// know what is accepted. A bound that ties two fields (windows' `stride <= words`) is in the fields'
/// descriptions.
pub fn document(limits: &Limits) -> Value {
    let mut document = serde_json::to_value(ApiDoc::openapi()).expect("the document serializes");
    for (place, field, bounds) in bounds(limits) {
        state(&mut document, place, field, &bounds);
    }
    let schemas = &mut document["components"]["schemas"];
    // Unknown fields are refused (`decode`), flattened ones included: `additionalProperties` cannot say so
    // across `allOf` parts.
    for (_, schema) in schemas.as_object_mut().into_iter().flatten().filter(|(name, _)| name.ends_with("Request")) {
        if schema.get("allOf").is_some() {
            schema["unevaluatedProperties"] = json!(false);
        }
    }
    // `rm3` only with `bm25+rm3`.
    let rm3 = json!({"rm3": {"required": ["pipeline"], "properties": {"pipeline": {"const": "bm25+rm3"}}}});
    schemas["RankParams"]["dependentSchemas"] = rm3;
    // `/rerank` has no first stage: its body takes `RankParams` without those fields, and documents or docids.
    let mut params = schemas["RankParams"].clone();
    for field in crate::rank::FIRST_STAGE_FIELDS {
        params["properties"].as_object_mut().map(|p| p.remove(field));
    }
    params.as_object_mut().map(|p| p.remove("dependentSchemas"));
    let rerank = &mut schemas["RerankRequest"];
    for part in rerank["allOf"].as_array_mut().into_iter().flatten() {
        if part["$ref"] == "#/components/schemas/RankParams" {
            *part = params.clone();
        }
    }
    rerank["oneOf"] = json!([{"required": ["documents"]}, {"required": ["docids"]}]);
    // A run to re-rank needs a re-ranking pipeline.
    let reranking: Vec<&str> =
        crate::rank::Pipeline::ALL.iter().filter(|p| p.needs_model()).map(|p| p.name()).collect();
    let pipeline = json!({"required": ["pipeline"], "properties": {"pipeline": {"enum": reranking}}});
    schemas["BatchRequest"]["dependentSchemas"] = json!({ "rerank": pipeline });
    document
}

/// Where a bounded field is declared.
#[derive(Clone, Copy)]
enum Place {
    /// Request bodies (`…Request`) and the parameter structs they flatten (`…Params`).
    Bodies,
    /// The schema of this name.
    Schema(&'static str),
    /// Query parameters.
    Query,
    /// Query parameters of one path (a name two paths use differently).
    QueryOf(&'static str),
    /// Path parameters.
    Path,
}

/// The bounded fields: where, which, and their bounds.
fn bounds(limits: &Limits) -> Vec<(Place, &'static str, Value)> {
    let count = |max: usize| json!({"minimum": 1, "maximum": max});
    let unit = json!({"minimum": 0, "maximum": 1});
    // A query has a character that is neither blank nor a control character (those are trimmed).
    let query = json!({"minLength": 1, "maxLength": limits.max_query_chars, "pattern": "[^\\s\\x00-\\x1f\\x7f-\\x9f]"});
    let candidates = json!({"minItems": 1, "maxItems": limits.max_depth});
    // A search's page ends within max_k, so its offset is below it (k is 1 or more).
    let offset = json!({"minimum": 0, "maximum": limits.max_k.saturating_sub(1)});
    let mut bounds = Vec::new();
    for place in [Place::Bodies, Place::Query] {
        bounds.extend([
            (place, "k", count(limits.max_k)),
            (place, "top_n", count(limits.max_k)),
            (place, "depth", count(limits.max_depth)),
            (place, "interpolate", unit.clone()),
            (place, "query", query.clone()),
            (place, "q", query.clone()),
        ]);
    }
    bounds.extend([
        (Place::Bodies, "documents", candidates.clone()),
        (Place::Bodies, "texts", candidates),
        (Place::Bodies, "max_tokens_per_doc", json!({"minimum": 1})),
        (Place::Bodies, "tag", json!({"pattern": "^\\S+$"})),
        (Place::Schema("Bm25Params"), "k1", json!({"minimum": 0, "maximum": crate::rank::MAX_K1})),
        (Place::Schema("Bm25Params"), "b", unit.clone()),
        (Place::Schema("Rm3Params"), "fb_docs", count(limits.max_fb_docs)),
        (Place::Schema("Rm3Params"), "fb_terms", count(limits.max_fb_terms)),
        (Place::Schema("Rm3Params"), "original_query_weight", unit),
        (Place::Schema("Preselect"), "per_doc", json!({"minimum": 1})),
        (Place::Schema("Preselect"), "budget", json!({"minimum": 1})),
        (Place::Schema("SegmentOptions"), "words", json!({"minimum": 1})),
        (Place::Schema("SegmentOptions"), "stride", json!({"minimum": 1})),
        (Place::Query, "limit", count(crate::server::routes::batch::MAX_PAGE)),
        (Place::QueryOf("/batch"), "offset", json!({"minimum": 0, "maximum": i64::MAX})),
        (Place::QueryOf("/search"), "offset", offset.clone()),
        (Place::Bodies, "offset", offset),
        (Place::Path, "name", json!({"pattern": crate::index::NAME_PATTERN})),
    ]);
    bounds
}

/// Merges `bounds` into every schema of `field` at `place`, through nullable alternatives (`oneOf` with null).
fn state(document: &mut Value, place: Place, field: &str, bounds: &Value) {
    let merge = |schema: &mut Value| {
        let target = match schema.get_mut("oneOf").and_then(Value::as_array_mut) {
            Some(alternatives) => alternatives.iter_mut().find(|a| a["type"] != "null"),
            None => Some(schema),
        };
        if let Some(Value::Object(target)) = target {
            target.extend(bounds.as_object().expect("bounds are an object").clone());
        }
    };
    let owned = |name: &str| match place {
        Place::Bodies => name.ends_with("Request") || name.ends_with("Params"),
        Place::Schema(owner) => name == owner,
        Place::Query | Place::QueryOf(_) | Place::Path => false,
    };
    if let Place::Query | Place::QueryOf(_) | Place::Path = place {
        let located = if let Place::Path = place { "path" } else { "query" };
        let paths = document["paths"].as_object_mut().into_iter().flatten();
        let paths = paths.filter(|(path, _)| !matches!(place, Place::QueryOf(only) if only != path.as_str()));
        let operations = paths.map(|(_, methods)| methods);
        for operation in operations.flat_map(|methods| methods.as_object_mut().into_iter().flat_map(|m| m.values_mut()))
        {
            let parameters = operation.get_mut("parameters").and_then(Value::as_array_mut);
            for parameter in parameters.into_iter().flatten() {
                if parameter["name"] == field && parameter["in"] == located {
                    merge(&mut parameter["schema"]);
                }
            }
        }
        return;
    }
    let schemas = document["components"]["schemas"].as_object_mut().into_iter().flatten();
    for (_, schema) in schemas.filter(|(name, _)| owned(name)) {
        // `flatten` makes inline `allOf` parts.
        let parts: Vec<&mut Value> = match schema.get("allOf").is_some() {
            true => schema["allOf"].as_array_mut().into_iter().flatten().collect(),
            false => vec![schema],
        };
        for part in parts {
            if let Some(property) = part.get_mut("properties").and_then(|p| p.get_mut(field)) {
                merge(property);
            }
        }
    }
}
