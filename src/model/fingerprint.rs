//! Fingerprints of what a model's outputs depend on: its weights (a run's provenance), and everything its stored
//! outputs depend on (the names of a collection's stores of them).

use std::path::{Path, PathBuf};

use super::cobert;
use super::encoder::SentenceLayout;
use super::error::{load_err, ModelError};
use super::load::weight_files;

/// A stable fingerprint of the weights: 64-bit FNV-1a over the weight files' bytes, in hex.
pub fn weights_hash(dir: &Path) -> Result<String, ModelError> {
    files_hash(&weight_files(dir)?)
}

/// A fingerprint of all that a model's stored outputs (a cross-encoder's first-queue outputs, a bi-encoder's
/// embeddings) depend on besides the options: the weights of the model it runs (Co-BERT's heads left out; for
/// a Co-BERT trained end to end, its first-round cross-encoder), its configuration, its tokenizer and, for a
/// sentence-transformers model, its modules (pooling, normalization, longest input). A Co-BERT checkpoint
/// trained on a frozen backbone shares it with that backbone's own directory.
pub fn outputs_hash(dir: &Path) -> Result<String, ModelError> {
    let first_round = dir.join(cobert::FIRST_ROUND_DIR);
    let dir = if first_round.is_dir() { &first_round } else { dir };
    let mut files = weight_files(dir)?;
    files.retain(|f| !f.ends_with(cobert::WEIGHTS_FILE));
    let mut described: Vec<PathBuf> = ["config.json", "tokenizer.json", "vocab.txt"].map(|f| dir.join(f)).into();
    if dir.join("modules.json").exists() {
        described.extend(["modules.json", "sentence_bert_config.json", "tokenizer_config.json"].map(|f| dir.join(f)));
        let modules = SentenceLayout::module_dirs(dir)?;
        described.extend(modules.into_iter().map(|m| dir.join(m).join("config.json")));
    }
    files.extend(described.into_iter().filter(|f| f.exists()));
    files_hash(&files)
}

/// 64-bit FNV-1a over the files' bytes, in order, in hex.
fn files_hash(files: &[PathBuf]) -> Result<String, ModelError> {
    let mut hash = crate::hash::Fnv::default();
    for file in files {
        hash.write(&std::fs::read(file).map_err(|e| load_err(file, e))?);
    }
    Ok(hash.hex())
}
