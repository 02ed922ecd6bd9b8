//! The models the re-ranking pipelines can use, by name: `default` (`[model] path`) and the `[model.named]`
//! ones. Each is loaded once (the server loads all before it is ready; the CLI loads what it uses) and
//! served by its own inference thread. A model that cannot be loaded (offline without a cached copy, say)
//! stays unavailable with its reason, and the first-stage pipelines keep serving.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use serde::Serialize;
use utoipa::ToSchema;

use super::RankError;
use crate::config::ModelConfig;
use crate::index::Collection;
use crate::model::{self, IndexHeader, Kind, Neighbours, Quantize, Recipe, Reranker, ServeOptions, Served, VectorFile};

/// Open stores of model outputs by (collection's opening, model), with the collection's name.
type Stores = HashMap<(u64, String), (String, Arc<VectorFile>)>;

/// `model::outputs_hash` of a model's directory, computed on first use.
fn outputs_hash(model: &LoadedModel) -> Result<&str, RankError> {
    if let Some(hash) = model.outputs_hash.get() {
        return Ok(hash);
    }
    let hash = model::outputs_hash(&model.dir).map_err(RankError::Model)?;
    Ok(model.outputs_hash.get_or_init(|| hash))
}

/// A bi-encoder's embedding files in a collection: `embeddings/NAME.*`.
fn embeddings_name(model: &LoadedModel) -> Result<String, RankError> {
    Ok(format!("{}-{}", outputs_hash(model)?, model.dtype))
}

/// The name of `[model] path`.
pub const DEFAULT: &str = "default";

pub struct Models {
    slots: Vec<Slot>,
    config: ModelConfig,
    /// On-disk stores of model outputs, per (collection's opening, model), opened on first use, with the
    /// collection's name: a collection's later opening (each commit's) replaces its earlier ones' stores.
    stores: Mutex<Stores>,
}

struct Slot {
    name: String,
    source: String,
    kind: Kind,
    /// A decoder reranker's recipe, as configured (else detected from the source at load).
    recipe: Option<Recipe>,
    quantize: Quantize,
    /// Its longest input (its own, or `[model] max_length`).
    max_length: usize,
    state: OnceLock<Result<Arc<LoadedModel>, Unavailable>>,
}

/// Why a model could not be loaded: in one line, and in full.
#[derive(Clone)]
struct Unavailable {
    summary: &'static str,
    reason: String,
}

/// A model ready to score, and where it came from (for `/pipelines` and run provenance).
pub struct LoadedModel {
    pub name: String,
    pub source: String,
    /// The directory the weights were read from (a hub model's cache snapshot).
    pub dir: PathBuf,
    /// FNV-1a (64-bit, hex) over the weight files, in name order: which weights a run was made with.
    pub weights_hash: String,
    pub served: Served,
    /// Its longest input in tokens (its `max_length`, else `[model] max_length`).
    max_length: usize,
    dtype: String,
    /// `model::outputs_hash`, on first use (the names of its stores of outputs, per collection).
    outputs_hash: OnceLock<String>,
}

impl LoadedModel {
    pub fn kind(&self) -> &'static str {
        self.served.model().kind()
    }
}

/// What `/pipelines` says about a model.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelStatus {
    pub name: String,
    /// Directory or hub id.
    pub source: String,
    /// `ready`, `unavailable` (see `reason`) or `not_loaded`.
    pub state: &'static str,
    /// `cross-encoder` or `bi-encoder`, once loaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// A decoder reranker's recipe, once loaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recipe: Option<Recipe>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Why it is unavailable, in one line (`reason` has the details).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "is not in the hub cache and could not be fetched: start with --model DIR")]
    pub summary: Option<&'static str>,
    /// Inputs waiting for the model.
    pub queued: usize,
    /// What the model's inference thread has run (absent until loaded).
    #[serde(skip)]
    pub batches: Option<crate::model::BatchStats>,
}

impl Models {
    pub fn new(config: &ModelConfig) -> Models {
        let slot = |name: String, source: String, kind, recipe, quantize, max_length: Option<usize>| Slot {
            name,
            source,
            kind,
            recipe,
            quantize,
            max_length: max_length.unwrap_or(config.max_length),
            state: OnceLock::new(),
        };
        let default = (!config.path.is_empty())
            .then(|| slot(DEFAULT.to_string(), config.path.clone(), config.kind, config.recipe, config.quantize, None));
        let named = config
            .named
            .iter()
            .map(|(n, m)| slot(n.clone(), m.source().to_string(), m.kind(), m.recipe(), m.quantize(), m.max_length()));
        let slots = default.into_iter().chain(named).collect();
        Models { slots, config: config.clone(), stores: Mutex::default() }
    }

    pub fn names(&self) -> Vec<String> {
        self.slots.iter().map(|s| s.name.clone()).collect()
    }

    /// Checks a model name a request gives (none: the default).
    pub fn check(&self, name: Option<&str>) -> Result<String, RankError> {
        let name = name.unwrap_or(DEFAULT);
        if self.slots.iter().any(|s| s.name == name) {
            return Ok(name.to_string());
        }
        Err(RankError::UnknownModel { name: name.to_string(), available: self.names() })
    }

    /// The named model, loaded on first use; a failure to load is kept and reported on every use.
    /// `what` uses it: a pipeline's name, or "embeddings".
    pub fn get(&self, name: &str, what: &'static str) -> Result<Arc<LoadedModel>, RankError> {
        let Some(slot) = self.slots.iter().find(|s| s.name == name) else {
            return Err(if self.slots.is_empty() {
                RankError::ModelRequired { what }
            } else {
                RankError::UnknownModel { name: name.to_string(), available: self.names() }
            });
        };
        self.state(slot).map_err(|u| RankError::ModelUnavailable { name: name.to_string(), reason: u.reason })
    }

    fn state(&self, slot: &Slot) -> Result<Arc<LoadedModel>, Unavailable> {
        let load =
            || self.load(slot).map(Arc::new).map_err(|e| Unavailable { summary: e.summary(), reason: e.to_string() });
        slot.state.get_or_init(load).clone()
    }

    /// Loads every model; returns the failures (name, reason).
    pub fn load_all(&self) -> Vec<(String, String)> {
        self.slots.iter().filter_map(|slot| self.state(slot).err().map(|u| (slot.name.clone(), u.reason))).collect()
    }

    fn load(&self, slot: &Slot) -> Result<LoadedModel, model::ModelError> {
        tracing::info!("loading model {} from {}", slot.name, slot.source);
        let dir = model::resolve(&slot.source, self.config.offline)?;
        let device = model::device(&self.config.device)?;
        let dtype = model::dtype(&self.config.dtype, &device)?;
        let mut reranker = Reranker::load(&dir, &device, dtype, slot.kind, slot.recipe)?;
        if slot.quantize == Quantize::Int8 {
            reranker.quantize()?;
        }
        let weights_hash = model::weights_hash(&dir)?;
        let c = &self.config;
        let options = ServeOptions {
            max_length: slot.max_length,
            max_query_tokens: c.max_query_tokens,
            max_batch_tokens: c.max_batch_tokens,
            max_queued_inputs: c.max_queued_inputs,
            cache_entries: c.cache_entries,
        };
        Ok(LoadedModel {
            max_length: slot.max_length,
            served: Served::start(&slot.name, reranker, options),
            name: slot.name.clone(),
            source: slot.source.clone(),
            dir,
            weights_hash,
            // Also names the embedding files, which int8 layers must not share with float ones.
            dtype: format!("{dtype:?}").to_lowercase() + if slot.quantize == Quantize::Int8 { "-int8" } else { "" },
            outputs_hash: OnceLock::new(),
        })
    }

    /// The weights hashes of the models loaded.
    pub fn weights_hashes(&self) -> Vec<String> {
        let loaded = self.slots.iter().filter_map(|slot| slot.state.get()?.as_ref().ok());
        loaded.map(|m| m.weights_hash.clone()).collect()
    }

    pub fn status(&self) -> Vec<ModelStatus> {
        self.slots
            .iter()
            .map(|slot| {
                let (state, kind, queued, batches) = match slot.state.get() {
                    None => ("not_loaded", None, 0, None),
                    Some(Ok(m)) => ("ready", Some(m.kind()), m.served.queued(), Some(m.served.stats())),
                    Some(Err(_)) => ("unavailable", None, 0, None),
                };
                let unavailable = slot.state.get().and_then(|m| m.as_ref().err());
                let (reason, summary) = (unavailable.map(|u| u.reason.clone()), unavailable.map(|u| u.summary));
                let (name, source) = (slot.name.clone(), slot.source.clone());
                let recipe = slot.state.get().and_then(|m| m.as_ref().ok()?.served.model().recipe());
                ModelStatus { name, source, state, kind, recipe, reason, summary, queued, batches }
            })
            .collect()
    }

    /// A model's outputs kept on disk for a collection: a bi-encoder's segment embeddings
    /// (`COLLECTION/embeddings/MODEL-DTYPE.*`), or, with `store_scores`, a cross-encoder's (query, segment)
    /// outputs (`COLLECTION/scores/MODEL-DTYPE-LENGTH-QUERYLENGTH-WIDTH.*`); MODEL is the fingerprint of all
    /// they depend on besides those options (`model::outputs_hash`: weights, configuration, tokenizer, pooling),
    /// so that models differing in any of it never read each other's. None otherwise.
    pub fn store(&self, collection: &Collection, model: &LoadedModel) -> Result<Option<Arc<VectorFile>>, RankError> {
        self.open_store(collection, model, true)
    }

    /// Segments from which a dense first stage searches a collection's vector index rather than every segment.
    pub fn approximate_from(&self) -> usize {
        self.config.approximate_from
    }

    /// The bi-encoders whose vector index the collection in directory `collection` holds (`longrank embed` built one),
    /// loaded if they were not: those whose embeddings are kept current as documents arrive. An index of a model no
    /// longer served (or served with other weights) is left alone.
    pub fn indexed_bi_encoders(&self, collection: &Path) -> Vec<Arc<LoadedModel>> {
        let Ok(indexed) = Neighbours::indexed(&collection.join("embeddings")) else { return vec![] };
        let serves = |header: &IndexHeader| {
            let model = self.get(&self.check(Some(&header.model)).ok()?, "embeddings").ok()?;
            let bi = matches!(model.served.model(), Reranker::Bi(_));
            (bi && embeddings_name(&model).ok()? == header.vectors).then_some(model)
        };
        indexed.iter().filter_map(serves).collect()
    }

    /// `store`, for `longrank embed`, which fills it: without the advice to run `longrank embed`.
    pub fn store_to_fill(
        &self,
        collection: &Collection,
        model: &LoadedModel,
    ) -> Result<Option<Arc<VectorFile>>, RankError> {
        self.open_store(collection, model, false)
    }

    fn open_store(
        &self,
        collection: &Collection,
        model: &LoadedModel,
        advise: bool,
    ) -> Result<Option<Arc<VectorFile>>, RankError> {
        let reranker = model.served.model();
        let is_bi = matches!(reranker, Reranker::Bi(_));
        if !is_bi && !self.config.store_scores {
            return Ok(None);
        }
        let key = (collection.opening(), model.name.clone());
        let mut open = self.stores.lock();
        if let Some((_, file)) = open.get(&key) {
            return Ok(Some(file.clone()));
        }
        let width = reranker.output_width();
        let outputs = outputs_hash(model)?;
        let (dir, name, dims) = if is_bi {
            ("embeddings", embeddings_name(model)?, width)
        } else {
            let c = &self.config;
            let name = format!("{outputs}-{}-{}-{}-{width}", model.dtype, model.max_length, c.max_query_tokens);
            // Each stored output ends with its pair's length.
            ("scores", name, width + 1)
        };
        let file = VectorFile::open(&collection.path().join(dir), &name, dims).map_err(RankError::Model)?;
        if advise && is_bi && file.len() == 0 {
            // Said once per process and collection: the first searches are slow, and why.
            tracing::info!(
                "collection {}: no stored segment embeddings of model {} yet; each segment is embedded when a \
                 search first needs it (slow at first), or all at once ahead of queries with `longrank embed \
                 --collection {} --name {}`",
                collection.name(),
                model.name,
                collection.name(),
                model.name
            );
        }
        let file = Arc::new(file);
        open.retain(|(_, m), (c, _)| *m != model.name || c != collection.name());
        open.insert(key, (collection.name().to_string(), file.clone()));
        Ok(Some(file))
    }
}
