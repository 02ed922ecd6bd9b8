//! BERT-class models with candle: Hugging Face directories (`config.json`, `tokenizer.json`, `*.safetensors`
//! or `pytorch_model.bin`) loaded as cross-encoders (a `[CLS]` pooler and a classifier over
//! `[CLS] query [SEP] segment [SEP]`) or as sentence-transformers bi-encoders (mean or CLS pooling, optional
//! normalization). Inputs are truncated here, never by the tokenizer file: the shipped MiniLM's tokenizer.json
//! truncates and pads to 128 on its own, which the loader switches off.

mod tokenize;

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, IndexOp, Module, Tensor, D};
use candle_nn::{Linear, VarBuilder};
use candle_transformers::models::bert::{BertModel, Config};
use serde::Deserialize;

pub use tokenize::Encoded;
use tokenize::WordPieces;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{}: {message}", path.display())]
    Load { path: PathBuf, message: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("inference: {0}")]
    Candle(#[from] candle_core::Error),
}

fn load_err(path: &Path, message: impl ToString) -> ModelError {
    ModelError::Load { path: path.to_path_buf(), message: message.to_string() }
}

/// The encoder and tokenizer every model kind shares.
struct Backbone {
    bert: BertModel,
    pieces: WordPieces,
    device: Device,
    hidden_size: usize,
}

impl Backbone {
    /// Loads the BERT weights (with or without a `bert.` prefix) and returns the variables for the heads.
    fn load(dir: &Path, device: &Device) -> Result<(Backbone, VarBuilder<'static>), ModelError> {
        let config_path = dir.join("config.json");
        let config: Config =
            serde_json::from_slice(&std::fs::read(&config_path).map_err(|e| load_err(&config_path, e))?)
                .map_err(|e| load_err(&config_path, format!("not a BERT config: {e}")))?;
        let vb = weights(dir, device)?;
        let bert =
            BertModel::load(vb.clone(), &config).map_err(|e| load_err(dir, format!("loading BERT weights: {e}")))?;
        let pieces = WordPieces::load(&dir.join("tokenizer.json"), config.max_position_embeddings)?;
        Ok((Backbone { bert, pieces, device: device.clone(), hidden_size: config.hidden_size }, vb))
    }

    /// Final hidden states `[batch, len, hidden]` of right-padded inputs, and the attention mask `[batch, len]`.
    fn forward(&self, batch: &[Encoded]) -> Result<(Tensor, Tensor), ModelError> {
        let len = batch.iter().map(|e| e.ids.len()).max().unwrap_or(0);
        let (mut ids, mut types, mut mask) = (Vec::new(), Vec::new(), Vec::new());
        for e in batch {
            let pad = len - e.ids.len();
            ids.extend(e.ids.iter().copied().chain(std::iter::repeat_n(self.pieces.pad_id, pad)));
            types.extend(e.type_ids.iter().copied().chain(std::iter::repeat_n(0, pad)));
            mask.extend(std::iter::repeat_n(1u32, e.ids.len()).chain(std::iter::repeat_n(0, pad)));
        }
        let shape = (batch.len(), len);
        let ids = Tensor::from_vec(ids, shape, &self.device)?;
        let types = Tensor::from_vec(types, shape, &self.device)?;
        let mask = Tensor::from_vec(mask, shape, &self.device)?;
        let hidden = self.bert.forward(&ids, &types, Some(&mask))?;
        Ok((hidden, mask))
    }
}

/// The weight files of a directory: every `*.safetensors` (sharded checkpoints too) in name order, else
/// `pytorch_model.bin`.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| load_err(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() && dir.join("pytorch_model.bin").exists() {
        files.push(dir.join("pytorch_model.bin"));
    }
    Ok(files)
}

/// A stable fingerprint of the weights: 64-bit FNV-1a over the weight files' bytes, in hex.
pub fn weights_hash(dir: &Path) -> Result<String, ModelError> {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for file in weight_files(dir)? {
        let bytes = std::fs::read(&file).map_err(|e| load_err(&file, e))?;
        for b in bytes {
            hash = (hash ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    Ok(format!("{hash:016x}"))
}

fn weights(dir: &Path, device: &Device) -> Result<VarBuilder<'static>, ModelError> {
    let files: Vec<PathBuf> =
        weight_files(dir)?.into_iter().filter(|p| p.extension().is_some_and(|x| x == "safetensors")).collect();
    if !files.is_empty() {
        // SAFETY: the files are memory-mapped read-only; a file changed while mapped is the caller's problem,
        // as with every mmap-based loader.
        return unsafe { VarBuilder::from_mmaped_safetensors(&files, DType::F32, device) }
            .map_err(|e| load_err(dir, e));
    }
    let bin = dir.join("pytorch_model.bin");
    if bin.exists() {
        return VarBuilder::from_pth(&bin, DType::F32, device).map_err(|e| load_err(&bin, e));
    }
    Err(load_err(dir, "no *.safetensors or pytorch_model.bin"))
}

/// A sequence classifier scoring (query, segment) pairs: the `[CLS]` state through the pooler (dense + tanh)
/// and the classifier; with two labels, label 1's logit.
pub struct CrossEncoder {
    backbone: Backbone,
    pooler: Linear,
    classifier: Linear,
    label: usize,
}

impl CrossEncoder {
    pub fn load(dir: &Path, device: &Device) -> Result<CrossEncoder, ModelError> {
        let (backbone, vb) = Backbone::load(dir, device)?;
        let h = backbone.hidden_size;
        let linear = |names: &[&str], out: usize| -> Result<Linear, ModelError> {
            names
                .iter()
                .find_map(|n| candle_nn::linear(h, out, vb.pp(*n)).ok())
                .ok_or_else(|| load_err(dir, format!("no weights for {}", names.join(" or "))))
        };
        let pooler = linear(&["bert.pooler.dense", "pooler.dense"], h)?;
        let labels = [2usize, 1].into_iter().find(|n| vb.pp("classifier").get((*n, h), "weight").is_ok());
        let labels = labels.ok_or_else(|| load_err(dir, "no classifier with 1 or 2 labels (classifier.weight)"))?;
        let classifier = linear(&["classifier"], labels)?;
        Ok(CrossEncoder { backbone, pooler, classifier, label: labels - 1 })
    }

    /// Encodes a pair: `[CLS] query [SEP] segment [SEP]`, the query cut to `max_query_tokens`, the segment cut
    /// so the whole fits `max_len`.
    pub fn encode(
        &self,
        query: &str,
        segment: &str,
        max_len: usize,
        max_query_tokens: usize,
    ) -> Result<Encoded, ModelError> {
        self.backbone.pieces.pair(query, segment, max_len, max_query_tokens)
    }

    /// Logits of a batch of encoded pairs.
    pub fn score(&self, batch: &[Encoded]) -> Result<Vec<f32>, ModelError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let (hidden, _) = self.backbone.forward(batch)?;
        let cls = hidden.i((.., 0))?;
        let pooled = self.pooler.forward(&cls)?.tanh()?;
        let logits = self.classifier.forward(&pooled)?;
        Ok(logits.i((.., self.label))?.to_vec1::<f32>()?)
    }

    /// Token counts as this model's tokenizer sees them (for the segmenter's budget).
    pub fn count_tokens(&self, text: &str) -> Result<usize, ModelError> {
        self.backbone.pieces.count(text)
    }
}

/// How a sentence-transformers model pools token states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    Mean,
    Cls,
}

/// A sentence-transformers bi-encoder: texts to (optionally normalized) embeddings.
pub struct BiEncoder {
    backbone: Backbone,
    pooling: Pooling,
    normalize: bool,
    max_seq_length: usize,
    /// Segment embeddings by text: they do not depend on the query, so repeated queries embed only the query.
    cache: std::sync::Mutex<std::collections::HashMap<u64, std::sync::Arc<[f32]>>>,
}

/// Cached segment embeddings (about 1.5 KB each at 384 dimensions).
const MAX_CACHED_EMBEDDINGS: usize = 100_000;

#[derive(Deserialize)]
struct PoolingConfig {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
}

#[derive(Deserialize)]
struct StModule {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    path: String,
}

impl BiEncoder {
    pub fn load(dir: &Path, device: &Device) -> Result<BiEncoder, ModelError> {
        let (backbone, _) = Backbone::load(dir, device)?;
        let modules_path = dir.join("modules.json");
        let modules: Vec<StModule> = read_json(&modules_path)?;
        let pooling_dir = modules.iter().find(|m| m.kind.ends_with(".Pooling")).map(|m| dir.join(&m.path));
        let pooling_dir = pooling_dir.ok_or_else(|| load_err(&modules_path, "no Pooling module"))?;
        let pooling: PoolingConfig = read_json(&pooling_dir.join("config.json"))?;
        let pooling = match (pooling.pooling_mode_mean_tokens, pooling.pooling_mode_cls_token) {
            (true, _) => Pooling::Mean,
            (false, true) => Pooling::Cls,
            _ => return Err(load_err(&pooling_dir, "only mean or CLS pooling is supported")),
        };
        let normalize = modules.iter().any(|m| m.kind.ends_with(".Normalize"));
        #[derive(Deserialize)]
        struct StConfig {
            max_seq_length: usize,
        }
        let st_path = dir.join("sentence_bert_config.json");
        let max_seq_length =
            if st_path.exists() { read_json::<StConfig>(&st_path)?.max_seq_length } else { backbone.pieces.max_len };
        Ok(BiEncoder { backbone, pooling, normalize, max_seq_length, cache: Default::default() })
    }

    pub fn encode(&self, text: &str) -> Result<Encoded, ModelError> {
        self.backbone.pieces.single(text, self.max_seq_length)
    }

    pub fn count_tokens(&self, text: &str) -> Result<usize, ModelError> {
        self.backbone.pieces.count(text)
    }

    /// Embeddings of texts, from the cache where they were computed before.
    pub fn embed_cached(&self, texts: &[&str], batch_size: usize) -> Result<Vec<std::sync::Arc<[f32]>>, ModelError> {
        use std::hash::{Hash, Hasher};
        let keys: Vec<u64> = texts
            .iter()
            .map(|t| {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                t.hash(&mut h);
                h.finish()
            })
            .collect();
        let mut found: Vec<Option<std::sync::Arc<[f32]>>> = {
            let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            keys.iter().map(|k| cache.get(k).cloned()).collect()
        };
        let missing: Vec<usize> = (0..texts.len()).filter(|&i| found[i].is_none()).collect();
        let inputs: Vec<Encoded> = missing.iter().map(|&i| self.encode(texts[i])).collect::<Result<_, _>>()?;
        let computed = in_length_batches(&inputs, batch_size, |batch| self.embed(batch))?;
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() + computed.len() > MAX_CACHED_EMBEDDINGS {
            cache.clear();
        }
        for (&i, embedding) in missing.iter().zip(computed) {
            let embedding: std::sync::Arc<[f32]> = embedding.into();
            cache.insert(keys[i], embedding.clone());
            found[i] = Some(embedding);
        }
        Ok(found.into_iter().map(|e| e.expect("every text embedded")).collect())
    }

    /// Embeddings of a batch of encoded texts.
    pub fn embed(&self, batch: &[Encoded]) -> Result<Vec<Vec<f32>>, ModelError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let (hidden, mask) = self.backbone.forward(batch)?;
        let pooled = match self.pooling {
            Pooling::Cls => hidden.i((.., 0))?,
            Pooling::Mean => {
                let mask = mask.to_dtype(DType::F32)?.unsqueeze(D::Minus1)?;
                let summed = hidden.broadcast_mul(&mask)?.sum(1)?;
                summed.broadcast_div(&mask.sum(1)?)?
            }
        };
        let pooled = if self.normalize {
            let norm = pooled.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12, f32::MAX)?;
            pooled.broadcast_div(&norm)?
        } else {
            pooled
        };
        Ok(pooled.to_vec2::<f32>()?)
    }
}

/// How pairs are built and batched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScoreOptions {
    pub max_length: usize,
    pub max_query_tokens: usize,
    pub batch_size: usize,
}

/// A loaded model of either kind, scoring (query, segment) pairs: a cross-encoder's logit, or the cosine
/// of a bi-encoder's query and segment embeddings.
pub enum Reranker {
    Cross(CrossEncoder),
    Bi(BiEncoder),
}

impl Reranker {
    /// Loads a directory: sentence-transformers (`modules.json`) as a bi-encoder, anything else as a
    /// cross-encoder.
    pub fn load(dir: &Path, device: &Device) -> Result<Reranker, ModelError> {
        if dir.join("modules.json").exists() {
            Ok(Reranker::Bi(BiEncoder::load(dir, device)?))
        } else {
            Ok(Reranker::Cross(CrossEncoder::load(dir, device)?))
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Reranker::Cross(_) => "cross-encoder",
            Reranker::Bi(_) => "bi-encoder",
        }
    }

    pub fn count_tokens(&self, text: &str) -> Result<usize, ModelError> {
        match self {
            Reranker::Cross(m) => m.count_tokens(text),
            Reranker::Bi(m) => m.count_tokens(text),
        }
    }

    /// The most word pieces a segment may have so that it is never cut: what is left of the input after the
    /// query budget and the special tokens (cross-encoder), or the input less `[CLS]`/`[SEP]` (bi-encoder).
    pub fn segment_budget(&self, options: &ScoreOptions) -> usize {
        match self {
            Reranker::Cross(m) => {
                options.max_length.min(m.backbone.pieces.max_len).saturating_sub(options.max_query_tokens + 3)
            }
            Reranker::Bi(m) => m.max_seq_length.saturating_sub(2),
        }
        .max(1)
    }

    /// Scores every segment against the query.
    pub fn score(&self, query: &str, segments: &[&str], options: &ScoreOptions) -> Result<Vec<f32>, ModelError> {
        match self {
            Reranker::Cross(m) => {
                let inputs: Vec<Encoded> = segments
                    .iter()
                    .map(|s| m.encode(query, s, options.max_length, options.max_query_tokens))
                    .collect::<Result<_, _>>()?;
                in_length_batches(&inputs, options.batch_size, |batch| m.score(batch))
            }
            Reranker::Bi(m) => {
                let q = m.embed(&[m.encode(query)?])?.remove(0);
                let embeddings = m.embed_cached(segments, options.batch_size)?;
                Ok(embeddings.iter().map(|e| cosine(&q, e)).collect())
            }
        }
    }
}

/// Runs `f` over batches of inputs of similar length (less padding), returning results in input order.
fn in_length_batches<T: Clone + Default>(
    inputs: &[Encoded],
    batch_size: usize,
    mut f: impl FnMut(&[Encoded]) -> Result<Vec<T>, ModelError>,
) -> Result<Vec<T>, ModelError> {
    let mut order: Vec<usize> = (0..inputs.len()).collect();
    order.sort_by_key(|&i| inputs[i].ids.len());
    let mut out = vec![T::default(); inputs.len()];
    for chunk in order.chunks(batch_size.max(1)) {
        let batch: Vec<Encoded> = chunk.iter().map(|&i| inputs[i].clone()).collect();
        for (&i, value) in chunk.iter().zip(f(&batch)?) {
            out[i] = value;
        }
    }
    Ok(out)
}

impl crate::segment::TokenCounter for Reranker {
    fn count(&self, text: &str) -> usize {
        // A tokenizer error on valid UTF-8 would be a bug in the tokenizer file; words are a fair fallback.
        self.count_tokens(text).unwrap_or_else(|_| text.split_whitespace().count())
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b)).max(1e-12)
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ModelError> {
    let bytes = std::fs::read(path).map_err(|e| load_err(path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| load_err(path, e))
}
