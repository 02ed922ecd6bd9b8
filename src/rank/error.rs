//! What the pipeline refuses or fails on: one variant per distinct cause, so that the HTTP layer gives each
//! its own code (`server::error`) and the CLI its own message.

use crate::index::IndexError;
use crate::model::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum RankError {
    #[error("query is empty")]
    EmptyQuery,
    #[error("query is {len} characters long; the limit is {max}")]
    QueryTooLong { len: usize, max: usize },
    #[error("{field} must be {}, got {value}", range(*min, *max))]
    OutOfRange { field: &'static str, value: f64, min: f64, max: f64 },
    #[error("topic {qid}: {source}")]
    Topic { qid: String, source: Box<RankError> },
    #[error("instruction: {0}")]
    InvalidInstruction(String),
    #[error("run tag {0:?} must be one word")]
    InvalidTag(String),
    #[error("segments: {0}")]
    InvalidSegments(String),
    #[error("{what} needs a re-ranking pipeline (firstp, maxp, sump, avgp, cobert), not {pipeline}")]
    RerankingPipelineRequired { what: &'static str, pipeline: &'static str },
    #[error("{field} does not apply to {what}")]
    NotApplicable { field: &'static str, what: String },
    #[error("give either documents (texts) or docids (stored documents), not both or neither")]
    DocumentsOrDocids,
    #[error("interpolate mixes in first-stage scores, which documents given as text lack")]
    NoFirstStage,
    #[error("unknown pipeline {name:?}; available: {}", available.join(", "))]
    UnknownPipeline { name: String, available: Vec<String> },
    #[error("pipeline {pipeline} is unavailable with model {model:?}: {reason}")]
    PipelineUnavailable { pipeline: &'static str, model: String, reason: String },
    #[error("no collection given and no default: name one of {}", available.join(", "))]
    CollectionRequired { available: Vec<String> },
    #[error("unknown collection {name:?}; available: {}", available.join(", "))]
    UnknownCollection { name: String, available: Vec<String> },
    #[error("no document {docid:?}{}", collection.as_ref().map(|c| format!(" in collection {c:?}")).unwrap_or_default())]
    UnknownDocument { docid: String, collection: Option<String> },
    #[error("document {docid:?} exists in several collections ({}); name one with ?collection=", collections.join(", "))]
    AmbiguousDocument { docid: String, collections: Vec<String> },
    /// `what`: a pipeline's name, or "embeddings".
    #[error("{what} needs a model, and none is configured (set [model] path or --model)")]
    ModelRequired { what: &'static str },
    #[error("unknown model {name:?}; available: {}", available.join(", "))]
    UnknownModel { name: String, available: Vec<String> },
    #[error("model {name:?} is unavailable: {reason}")]
    ModelUnavailable { name: String, reason: String },
    #[error("model {name:?} is a {kind}; only a bi-encoder computes embeddings")]
    NotABiEncoder { name: String, kind: &'static str },
    #[error(
        "the dense and hybrid first stages need a bi-encoder: {}; name one with dense_model",
        tried.iter().map(|(name, kind)| format!("model {name:?} is a {kind}")).collect::<Vec<_>>().join(", ")
    )]
    DenseModelRequired { tried: Vec<(String, &'static str)> },
    #[error(
        "collection {collection:?}: {missing} of its {segments} segments have no stored embedding of model \
         {model:?}, and the dense and hybrid first stages search stored embeddings: run `longrank embed \
         --collection {collection} --name {model}`"
    )]
    NoVectors { collection: String, model: String, missing: usize, segments: usize },
    #[error(
        "input {index} is {tokens} word pieces long; model {model:?} reads at most {max} (set truncate to cut it)"
    )]
    InputTooLong { index: usize, tokens: usize, max: usize, model: String },
    #[error("the job cannot resume as it was submitted: {0}")]
    Unresumable(String),
    #[error("model: {0}")]
    Model(ModelError),
    #[error(transparent)]
    Index(#[from] IndexError),
}

/// "between 1 and 100", or "at least 0" without an upper bound.
fn range(min: f64, max: f64) -> String {
    if max.is_finite() {
        format!("between {min} and {max}")
    } else {
        format!("at least {min}")
    }
}
