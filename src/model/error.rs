//! The model layer's one error type, and the constructor of its load errors (a file or directory and why).

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{}: {message}", path.display())]
    Load { path: PathBuf, message: String },
    /// A hub id neither in the hub cache nor fetched (offline, or the hub unreachable).
    #[error("{id}: {message}")]
    NotFetched { id: String, message: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("inference: {0}")]
    Candle(#[from] candle_core::Error),
    #[error("inference: {0}")]
    Inference(String),
    #[error("{queued} inputs are waiting for the model; retry in {retry_after_s} s")]
    Overloaded { queued: usize, retry_after_s: u64 },
    #[error("cancelled")]
    Cancelled,
    #[error(
        "the query takes {tokens} tokens with its instruction and labels, over this model's budget of {budget} \
         (max_query_tokens): a decoder reranker never cuts the query; shorten it or raise max_query_tokens"
    )]
    QueryOverBudget { tokens: usize, budget: usize },
    #[error("{0}")]
    Unsupported(String),
    /// A vector index beside a model's embeddings that holds another model's (`Neighbours`): the message says
    /// whose (one string: the error type stays small, as it travels in every model result).
    #[error("{0}")]
    OtherModelsIndex(String),
}

impl ModelError {
    /// Why a model is unavailable, in one line for a status line (the error itself has the details).
    pub fn summary(&self) -> &'static str {
        match self {
            ModelError::NotFetched { .. } => "is not in the hub cache and could not be fetched: start with --model DIR",
            _ => "could not be loaded",
        }
    }
}

/// A load error naming `path`.
pub(crate) fn load_err(path: &Path, message: impl ToString) -> ModelError {
    ModelError::Load { path: path.to_path_buf(), message: message.to_string() }
}
