//! Where a model's files come from: a local directory, or a Hugging Face hub id fetched into the hub cache
//! (`HF_HOME`, default `~/.cache/huggingface`; `HF_ENDPOINT` points at another hub). Offline
//! (`HF_HUB_OFFLINE=1` or `offline = true`), only the cache is read.

use std::path::{Path, PathBuf};

use hf_hub::api::sync::ApiBuilder;
use hf_hub::Cache;

use super::{load_err, ModelError};

/// The files a model directory needs, besides its weights. Bi-encoders add their sentence-transformers files.
const REQUIRED: [&str; 2] = ["config.json", "tokenizer.json"];
const OPTIONAL: [&str; 3] = ["modules.json", "sentence_bert_config.json", "1_Pooling/config.json"];

/// A local directory, or the snapshot directory of a hub model (downloaded first when missing).
pub fn resolve(source: &str, offline: bool) -> Result<PathBuf, ModelError> {
    let path = Path::new(source);
    if path.is_dir() {
        return Ok(path.to_path_buf());
    }
    let (id, revision) = match source.split_once('@') {
        Some((id, revision)) => (id, revision),
        None => (source, "main"),
    };
    if !is_hub_id(id) {
        return Err(load_err(path, "no such directory, and not a hub id (owner/name)"));
    }
    let offline = offline || std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| !v.is_empty() && v != "0");
    let not_fetched = |message: String| ModelError::NotFetched { id: source.to_string(), message };
    if offline {
        return from_cache(id, revision)
            .ok_or_else(|| not_fetched(format!("offline (HF_HUB_OFFLINE) and not in the hub cache: {FIXES}")));
    }
    download(id, revision).map_err(|e| not_fetched(format!("fetching from the hub: {e}; {FIXES}")))
}

/// What a user can do when a hub model cannot be had.
const FIXES: &str = "fetch it once online (HF_HUB_OFFLINE unset, or HF_ENDPOINT naming a reachable mirror), or point \
                     --model (LONGRANK_MODEL_PATH, [model] path) at a local model directory";

/// `name` or `owner/name`, in the hub's characters.
fn is_hub_id(id: &str) -> bool {
    let parts: Vec<&str> = id.split('/').collect();
    parts.len() <= 2
        && parts.iter().all(|p| {
            !p.is_empty()
                && !p.starts_with('.')
                && p.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        })
}

fn repo(id: &str, revision: &str) -> hf_hub::Repo {
    hf_hub::Repo::with_revision(id.to_string(), hf_hub::RepoType::Model, revision.to_string())
}

/// The cached snapshot holding config.json, when the weights are there too.
fn from_cache(id: &str, revision: &str) -> Option<PathBuf> {
    let cached = Cache::from_env().repo(repo(id, revision));
    let config = cached.get("config.json")?;
    let dir = config.parent()?.to_path_buf();
    let complete = REQUIRED.iter().all(|f| dir.join(f).exists()) && !super::load::weight_files(&dir).ok()?.is_empty();
    complete.then_some(dir)
}

fn download(id: &str, revision: &str) -> Result<PathBuf, Box<dyn std::error::Error + Send + Sync>> {
    if let Some(dir) = from_cache(id, revision) {
        return Ok(dir);
    }
    let api = ApiBuilder::from_env().with_progress(std::io::IsTerminal::is_terminal(&std::io::stderr())).build()?;
    let remote = api.repo(repo(id, revision));
    let listed: Vec<String> = remote.info()?.siblings.into_iter().map(|s| s.rfilename).collect();
    let has = |f: &str| listed.iter().any(|l| l == f);
    let mut files: Vec<&str> = REQUIRED.iter().chain(&OPTIONAL).copied().filter(|f| has(f)).collect();
    if let Some(missing) = REQUIRED.iter().find(|f| !has(f)) {
        return Err(format!("the repository has no {missing}").into());
    }
    // Weights: the root's safetensors (sharded ones too), else the PyTorch pickle.
    let safetensors: Vec<&str> =
        listed.iter().map(String::as_str).filter(|f| !f.contains('/') && f.ends_with(".safetensors")).collect();
    match (safetensors.is_empty(), has("pytorch_model.bin")) {
        (false, _) => files.extend(safetensors),
        (true, true) => files.push("pytorch_model.bin"),
        (true, false) => return Err("the repository has no *.safetensors or pytorch_model.bin".into()),
    }
    let mut dir = None;
    for file in files {
        let local = remote.get(file)?;
        if file == "config.json" {
            dir = local.parent().map(Path::to_path_buf);
        }
    }
    Ok(dir.expect("config.json was fetched"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_ids_and_paths() {
        assert!(is_hub_id("cross-encoder/ms-marco-MiniLM-L-6-v2"));
        assert!(is_hub_id("bert-base-uncased"));
        assert!(!is_hub_id("/abs/path"));
        assert!(!is_hub_id("a/b/c"));
        assert!(!is_hub_id("../model"));
        let err = resolve("./no/such/dir", true).unwrap_err().to_string();
        assert!(err.contains("not a hub id"), "{err}");
    }
}
