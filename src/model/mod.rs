//! BERT-class models with candle: Hugging Face directories (`config.json`, `tokenizer.json`, `*.safetensors`
//! or `pytorch_model.bin`) loaded as cross-encoders (a `[CLS]` pooler and a classifier over
//! `[CLS] query [SEP] segment [SEP]`) or as sentence-transformers bi-encoders (mean or CLS pooling, optional
//! normalization). Inputs are truncated here, never by the tokenizer file: the shipped MiniLM's tokenizer.json
//! truncates and pads to 128 on its own, which the loader switches off.

mod bert;
mod blas;
pub mod cobert;
mod hub;
mod int8;
mod kernels;
mod queue;
mod served;
mod tokenize;
mod trainable;
mod vectors;

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, IndexOp, Module, Tensor, D};
use candle_nn::{Linear, VarBuilder};
use candle_transformers::models::bert::Config;

use bert::Bert;
use serde::Deserialize;

pub use hub::resolve;
pub use queue::{Cancel, JobTiming};
pub use served::{Scores, ServeOptions, Served};
pub use tokenize::Encoded;
use tokenize::WordPieces;
pub(crate) use trainable::replace_dir;
pub use trainable::{CoBertInit, TrainableCrossEncoder};
pub use vectors::VectorFile;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{}: {message}", path.display())]
    Load { path: PathBuf, message: String },
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
    #[error("{0}")]
    Unsupported(String),
}

/// Makes this thread, and every thread it starts from now on (they inherit it), treat subnormal floats as zero
/// and flush subnormal results to zero, as onnxruntime's threads do by default: a product that meets
/// subnormal operands (late in training, gradients underflow) takes a microcode assist per operation.
pub fn flush_subnormals() {
    #[cfg(target_arch = "x86_64")]
    #[allow(deprecated)] // `_mm_setcsr` is deprecated in favour of inline assembly, with the same effect.
    // SAFETY: sets only the FTZ (bit 15) and DAZ (bit 6) flags of this thread's MXCSR.
    unsafe {
        use std::arch::x86_64::{_mm_getcsr, _mm_setcsr};
        _mm_setcsr(_mm_getcsr() | 0x8040);
    }
}

fn load_err(path: &Path, message: impl ToString) -> ModelError {
    ModelError::Load { path: path.to_path_buf(), message: message.to_string() }
}

/// The encoder and tokenizer every model kind shares.
struct Backbone {
    bert: Bert,
    pieces: WordPieces,
    device: Device,
    hidden_size: usize,
    config: Config,
}

impl Backbone {
    /// Loads the BERT weights (with or without a `bert.` prefix) and returns the variables for the heads.
    fn load(dir: &Path, device: &Device, dtype: DType) -> Result<(Backbone, VarBuilder<'static>), ModelError> {
        let (config, pieces) = read_config(dir)?;
        let vb = weights(dir, device, dtype)?;
        Ok((Backbone::new(vb.clone(), &config, pieces, dir)?, vb))
    }

    fn new(vb: VarBuilder, config: &Config, pieces: WordPieces, origin: &Path) -> Result<Backbone, ModelError> {
        let device = vb.device().clone();
        let bert = Bert::load(vb, config).map_err(|e| load_err(origin, format!("loading BERT weights: {e}")))?;
        Ok(Backbone { bert, pieces, device, hidden_size: config.hidden_size, config: config.clone() })
    }

    /// Final hidden states `[batch, len, hidden]` of right-padded inputs, and the attention mask `[batch, len]`.
    fn forward(&self, batch: &[Encoded]) -> Result<(Tensor, Tensor), ModelError> {
        let inputs = Inputs::new(batch, self.pieces.pad_id, &self.device)?;
        let hidden = self.bert.forward(&inputs.ids, &inputs.types, inputs.padded.then_some(&inputs.mask))?;
        Ok((hidden, inputs.mask))
    }
}

/// FLOPs of one BERT encoder pass over `len` positions (multiply-adds counted as two): per layer the four
/// attention projections (8·L·h²), the feed-forward (4·L·h·i) and the attention products (4·L²·h).
pub fn encoder_flops(config: &Config, layers: usize, len: usize) -> f64 {
    let (l, h, i) = (len as f64, config.hidden_size as f64, config.intermediate_size as f64);
    layers as f64 * (8.0 * l * h * h + 4.0 * l * h * i + 4.0 * l * l * h)
}

/// A batch of encoded inputs as tensors, right-padded to the longest.
struct Inputs {
    ids: Tensor,
    types: Tensor,
    mask: Tensor,
    /// Whether any input is shorter than the longest (without padding the mask changes nothing, so the
    /// encoder skips it).
    padded: bool,
}

impl Inputs {
    fn new(batch: &[Encoded], pad_id: u32, device: &Device) -> Result<Inputs, ModelError> {
        let len = batch.iter().map(|e| e.ids.len()).max().unwrap_or(0);
        let (mut ids, mut types, mut mask) = (Vec::new(), Vec::new(), Vec::new());
        for e in batch {
            let pad = len - e.ids.len();
            ids.extend(e.ids.iter().copied().chain(std::iter::repeat_n(pad_id, pad)));
            types.extend(e.type_ids.iter().copied().chain(std::iter::repeat_n(0, pad)));
            mask.extend(std::iter::repeat_n(1u32, e.ids.len()).chain(std::iter::repeat_n(0, pad)));
        }
        let shape = (batch.len(), len);
        Ok(Inputs {
            ids: Tensor::from_vec(ids, shape, device)?,
            types: Tensor::from_vec(types, shape, device)?,
            mask: Tensor::from_vec(mask, shape, device)?,
            padded: batch.iter().any(|e| e.ids.len() != len),
        })
    }
}

/// A directory's BERT configuration and tokenizer.
fn read_config(dir: &Path) -> Result<(Config, WordPieces), ModelError> {
    let config_path = dir.join("config.json");
    let config: Config = serde_json::from_slice(&std::fs::read(&config_path).map_err(|e| load_err(&config_path, e))?)
        .map_err(|e| load_err(&config_path, format!("not a BERT config: {e}")))?;
    let pieces = WordPieces::load(&dir.join("tokenizer.json"), config.max_position_embeddings)?;
    Ok((config, pieces))
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
    files_hash(&weight_files(dir)?)
}

/// A fingerprint of what the outputs of a cross-encoder's first queue depend on besides the options: the
/// weights of the model it runs (Co-BERT's heads left out; for a Co-BERT trained end to end, its first-round
/// cross-encoder), its configuration and its tokenizer. A Co-BERT checkpoint trained on a frozen backbone
/// shares it with that backbone's own directory.
pub fn pairs_hash(dir: &Path) -> Result<String, ModelError> {
    let first_round = dir.join(cobert::FIRST_ROUND_DIR);
    let dir = if first_round.is_dir() { &first_round } else { dir };
    let mut files = weight_files(dir)?;
    files.retain(|f| !f.ends_with(cobert::WEIGHTS_FILE));
    files
        .extend(["config.json", "tokenizer.json", "vocab.txt"].map(|f| dir.join(f)).into_iter().filter(|f| f.exists()));
    files_hash(&files)
}

/// 64-bit FNV-1a over the files' bytes, in order, in hex.
fn files_hash(files: &[PathBuf]) -> Result<String, ModelError> {
    let mut hash = Fnv::default();
    for file in files {
        hash.write(&std::fs::read(file).map_err(|e| load_err(file, e))?);
    }
    Ok(format!("{:016x}", hash.0))
}

/// 64-bit FNV-1a: stable across processes and Rust versions (cache keys that persist on disk use it).
pub(crate) struct Fnv(pub u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    pub(crate) fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// A device by name: `cpu`, `cuda` or `cuda:N` (the latter with the `cuda` feature).
pub fn device(name: &str) -> Result<Device, ModelError> {
    let unsupported = |m: String| ModelError::Unsupported(m);
    match name {
        "cpu" => Ok(Device::Cpu),
        _ => {
            let ordinal = match name.strip_prefix("cuda") {
                Some("") => 0,
                Some(n) => n
                    .strip_prefix(':')
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| unsupported(format!("device {name:?}: expected cpu, cuda or cuda:N")))?,
                None => return Err(unsupported(format!("device {name:?}: expected cpu, cuda or cuda:N"))),
            };
            if cfg!(feature = "cuda") {
                Ok(Device::new_cuda(ordinal)?)
            } else {
                let _ = ordinal;
                Err(unsupported(format!("device {name:?}: this build has no CUDA (cargo build --features cuda)")))
            }
        }
    }
}

/// The weights' dtype: `f32`, `f16`, `bf16`, or `auto` (f16 on a GPU, f32 on the CPU, where candle's
/// half-precision kernels are slow).
pub fn dtype(name: &str, device: &Device) -> Result<DType, ModelError> {
    match name {
        "auto" if device.is_cuda() => Ok(DType::F16),
        "auto" | "f32" => Ok(DType::F32),
        "f16" => Ok(DType::F16),
        "bf16" => Ok(DType::BF16),
        _ => Err(ModelError::Unsupported(format!("dtype {name:?}: expected auto, f32, f16 or bf16"))),
    }
}

fn weights(dir: &Path, device: &Device, dtype: DType) -> Result<VarBuilder<'static>, ModelError> {
    let files: Vec<PathBuf> =
        weight_files(dir)?.into_iter().filter(|p| p.extension().is_some_and(|x| x == "safetensors")).collect();
    if !files.is_empty() {
        // SAFETY: the files are memory-mapped read-only; a file changed while mapped is the caller's problem,
        // as with every mmap-based loader.
        return unsafe { VarBuilder::from_mmaped_safetensors(&files, dtype, device) }.map_err(|e| load_err(dir, e));
    }
    let bin = dir.join("pytorch_model.bin");
    if bin.exists() {
        return VarBuilder::from_pth(&bin, dtype, device).map_err(|e| load_err(&bin, e));
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
    pub fn load(dir: &Path, device: &Device, dtype: DType) -> Result<CrossEncoder, ModelError> {
        let (config, pieces) = read_config(dir)?;
        CrossEncoder::new(weights(dir, device, dtype)?, &config, pieces, dir)
    }

    /// The model over the variables of `vb`; `origin` names where they came from in errors.
    fn new(vb: VarBuilder, config: &Config, pieces: WordPieces, origin: &Path) -> Result<CrossEncoder, ModelError> {
        let backbone = Backbone::new(vb.clone(), config, pieces, origin)?;
        let h = backbone.hidden_size;
        let linear = |names: &[&str], out: usize| -> Result<Linear, ModelError> {
            names
                .iter()
                .find_map(|n| candle_nn::linear(h, out, vb.pp(*n)).ok())
                .ok_or_else(|| load_err(origin, format!("no weights for {}", names.join(" or "))))
        };
        let pooler = linear(&["bert.pooler.dense", "pooler.dense"], h)?;
        let labels = [2usize, 1].into_iter().find(|n| vb.pp("classifier").get((*n, h), "weight").is_ok());
        let labels = labels.ok_or_else(|| load_err(origin, "no classifier with 1 or 2 labels (classifier.weight)"))?;
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
        Ok(self.score_with_states(batch)?.0)
    }

    /// Logits and final `[CLS]` states `[batch, hidden]` of a batch of encoded pairs.
    pub fn score_with_states(&self, batch: &[Encoded]) -> Result<(Vec<f32>, Tensor), ModelError> {
        if batch.is_empty() {
            return Ok((Vec::new(), Tensor::zeros((0, self.backbone.hidden_size), DType::F32, &self.backbone.device)?));
        }
        let (hidden, _) = self.backbone.forward(batch)?;
        let cls = hidden.i((.., 0))?;
        let pooled = self.pooler.forward(&cls)?.tanh()?;
        let logits = self.classifier.forward(&pooled)?;
        Ok((logits.i((.., self.label))?.to_dtype(DType::F32)?.to_vec1::<f32>()?, cls))
    }

    /// Makes the encoder's linear layers int8.
    pub fn quantize(&mut self) -> Result<(), ModelError> {
        Ok(self.backbone.bert.quantize()?)
    }

    /// Per pair, the logit followed by the final `[CLS]` state.
    pub fn outputs_with_states(&self, batch: &[Encoded]) -> Result<Vec<Vec<f32>>, ModelError> {
        let (logits, states) = self.score_with_states(batch)?;
        let states = states.to_dtype(DType::F32)?.to_vec2::<f32>()?;
        Ok(logits.into_iter().zip(states).map(|(l, s)| std::iter::once(l).chain(s).collect()).collect())
    }

    pub fn device(&self) -> &Device {
        &self.backbone.device
    }

    pub fn dtype(&self) -> DType {
        self.pooler.weight().dtype()
    }

    /// FLOPs of scoring one pair of `len` word pieces: the encoder, the pooler and the classifier.
    pub fn pair_flops(&self, len: usize) -> f64 {
        let config = &self.backbone.config;
        let h = config.hidden_size as f64;
        encoder_flops(config, config.num_hidden_layers, len) + 2.0 * h * h + 2.0 * h * (self.label + 1) as f64
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
}

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
    pub fn load(dir: &Path, device: &Device, dtype: DType) -> Result<BiEncoder, ModelError> {
        let (backbone, _) = Backbone::load(dir, device, dtype)?;
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
        Ok(BiEncoder { backbone, pooling, normalize, max_seq_length })
    }

    pub fn encode(&self, text: &str) -> Result<Encoded, ModelError> {
        self.backbone.pieces.single(text, self.max_seq_length)
    }

    pub fn count_tokens(&self, text: &str) -> Result<usize, ModelError> {
        self.backbone.pieces.count(text)
    }

    /// Embedding dimensions.
    pub fn dims(&self) -> usize {
        self.backbone.hidden_size
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
                let mask = mask.to_dtype(hidden.dtype())?.unsqueeze(D::Minus1)?;
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
        Ok(pooled.to_dtype(DType::F32)?.to_vec2::<f32>()?)
    }
}

/// A loaded model of either kind, scoring (query, segment) pairs: a cross-encoder's logit, or the cosine
/// of a bi-encoder's query and segment embeddings.
// One per loaded model: the variants' sizes do not matter, and boxing one would cost every match a deref.
#[allow(clippy::large_enum_variant)]
pub enum Reranker {
    Cross(CrossEncoder),
    Bi(BiEncoder),
    CoBert(cobert::CoBert),
}

/// What a model directory holds: detected (`auto`: sentence-transformers' `modules.json` means a bi-encoder) or
/// set in configuration.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    #[default]
    Auto,
    CrossEncoder,
    BiEncoder,
}

/// How a model's encoder multiplies: in its dtype, or with int8 linear layers (GGML's Q8_0 blocks; CPU).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Quantize {
    #[default]
    None,
    Int8,
}

impl Reranker {
    /// Makes the encoders' linear layers int8 (Co-BERT's heads stay as they are: a few small layers).
    pub fn quantize(&mut self) -> Result<(), ModelError> {
        match self {
            Reranker::Cross(m) => m.quantize(),
            Reranker::Bi(m) => Ok(m.backbone.bert.quantize()?),
            Reranker::CoBert(m) => {
                m.cross.quantize()?;
                m.own.as_mut().map_or(Ok(()), CrossEncoder::quantize)
            }
        }
    }

    /// Loads a directory as the given kind.
    pub fn load(dir: &Path, device: &Device, dtype: DType, kind: Kind) -> Result<Reranker, ModelError> {
        let bi = match kind {
            Kind::Auto => dir.join("modules.json").exists(),
            Kind::CrossEncoder => false,
            Kind::BiEncoder => true,
        };
        if kind == Kind::Auto && dir.join(cobert::CONFIG_FILE).exists() {
            return Ok(Reranker::CoBert(cobert::CoBert::load(dir, device, dtype)?));
        }
        if bi {
            Ok(Reranker::Bi(BiEncoder::load(dir, device, dtype)?))
        } else {
            Ok(Reranker::Cross(CrossEncoder::load(dir, device, dtype)?))
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Reranker::Cross(_) => "cross-encoder",
            Reranker::Bi(_) => "bi-encoder",
            Reranker::CoBert(_) => "co-bert",
        }
    }

    pub fn count_tokens(&self, text: &str) -> Result<usize, ModelError> {
        match self {
            Reranker::Cross(m) | Reranker::CoBert(cobert::CoBert { cross: m, .. }) => m.count_tokens(text),
            Reranker::Bi(m) => m.count_tokens(text),
        }
    }

    /// The most word pieces a segment may have so that it is never cut: what is left of the input after the
    /// query budget and the special tokens (cross-encoder), or the input less `[CLS]`/`[SEP]` (bi-encoder).
    pub fn segment_budget(&self, max_length: usize, max_query_tokens: usize) -> usize {
        match self {
            Reranker::Cross(m) | Reranker::CoBert(cobert::CoBert { cross: m, .. }) => {
                max_length.min(m.backbone.pieces.max_len).saturating_sub(max_query_tokens + 3)
            }
            Reranker::Bi(m) => m.max_seq_length.saturating_sub(2),
        }
        .max(1)
    }

    /// The length of `forward`'s outputs.
    pub fn output_width(&self) -> usize {
        match self {
            Reranker::Cross(_) | Reranker::CoBert(cobert::CoBert { own: Some(_), .. }) => 1,
            Reranker::Bi(m) => m.dims(),
            Reranker::CoBert(m) => 1 + m.backbone.hidden_size,
        }
    }

    /// One output per encoded input: `[logit]` (cross-encoder), the embedding (bi-encoder), or the logit
    /// and the `[CLS]` state (Co-BERT with one backbone, whose second round reads the first round's states).
    pub fn forward(&self, batch: &[Encoded]) -> Result<Vec<Vec<f32>>, ModelError> {
        match self {
            Reranker::Cross(m) | Reranker::CoBert(cobert::CoBert { cross: m, own: Some(_), .. }) => {
                Ok(m.score(batch)?.into_iter().map(|s| vec![s]).collect())
            }
            Reranker::Bi(m) => m.embed(batch),
            Reranker::CoBert(m) => m.cross.outputs_with_states(batch),
        }
    }
}

impl crate::segment::TokenCounter for Reranker {
    fn count(&self, text: &str) -> usize {
        count_or_words(self.count_tokens(text), text)
    }
}

impl crate::segment::TokenCounter for CrossEncoder {
    fn count(&self, text: &str) -> usize {
        count_or_words(self.count_tokens(text), text)
    }
}

impl crate::segment::TokenCounter for TrainableCrossEncoder {
    fn count(&self, text: &str) -> usize {
        count_or_words(self.count_tokens(text), text)
    }
}

/// A tokenizer error on valid UTF-8 would be a bug in the tokenizer file; words are a fair fallback.
fn count_or_words(count: Result<usize, ModelError>, text: &str) -> usize {
    count.unwrap_or_else(|_| text.split_whitespace().count())
}

pub(crate) fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b)).max(1e-12)
}

pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ModelError> {
    let bytes = std::fs::read(path).map_err(|e| load_err(path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| load_err(path, e))
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use std::hint::black_box;

    #[test]
    fn flushed_threads_and_the_threads_they_start_zero_subnormals() {
        // On a thread of its own, so that the test harness's threads keep their defaults.
        std::thread::spawn(|| {
            let (tiny, subnormal) = (black_box(1e-30f32), black_box(1e-40f32));
            assert!(black_box(tiny * 1e-10) > 0.0 && black_box(subnormal) * 1e10 > 0.0, "subnormals before");
            super::flush_subnormals();
            assert_eq!(black_box(tiny * 1e-10), 0.0, "subnormal results flushed to zero");
            assert_eq!(black_box(subnormal) * 1e10, 0.0, "subnormal operands read as zero");
            std::thread::spawn(move || assert_eq!(black_box(tiny * 1e-10), 0.0, "inherited by new threads"))
                .join()
                .unwrap();
        })
        .join()
        .unwrap();
    }
}
