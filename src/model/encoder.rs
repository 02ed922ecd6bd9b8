//! The encoders: the BERT backbone every model kind shares (weights and tokenizer), a cross-encoder scoring
//! (query, segment) pairs and a sentence-transformers bi-encoder embedding texts.

use std::path::Path;

use candle_core::{DType, Device, IndexOp, Module, Tensor, D};
use candle_nn::{Linear, VarBuilder};
use candle_transformers::models::bert::Config;
use serde::Deserialize;

use super::bert::Bert;
use super::family::{Activation, Family};
use super::load::{load_err, read_config, read_json, weights};
use super::tokenize::{Encoded, Pieces};
use super::ModelError;

/// The encoder and tokenizer every model kind shares.
pub(super) struct Backbone {
    pub(super) bert: Bert,
    pub(super) pieces: Pieces,
    pub(super) device: Device,
    pub(super) hidden_size: usize,
    pub(super) config: Config,
}

impl Backbone {
    /// Loads the BERT weights (with or without a `bert.` prefix) and returns the variables for the heads.
    pub(super) fn load(
        dir: &Path,
        device: &Device,
        dtype: DType,
    ) -> Result<(Backbone, VarBuilder<'static>), ModelError> {
        let (config, pieces) = read_config(dir)?;
        let vb = weights(dir, device, dtype)?;
        Ok((Backbone::new(vb.clone(), &config, pieces, dir)?, vb))
    }

    pub(super) fn new(vb: VarBuilder, config: &Config, pieces: Pieces, origin: &Path) -> Result<Backbone, ModelError> {
        let device = vb.device().clone();
        let bert = Bert::load(vb, config).map_err(|e| load_err(origin, format!("loading BERT weights: {e}")))?;
        Ok(Backbone { bert, pieces, device, hidden_size: config.hidden_size, config: config.clone() })
    }

    /// Final hidden states `[batch, len, hidden]` of right-padded inputs, and the attention mask `[batch, len]`.
    pub(super) fn forward(&self, batch: &[Encoded]) -> Result<(Tensor, Tensor), ModelError> {
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
pub(super) struct Inputs {
    pub(super) ids: Tensor,
    pub(super) types: Tensor,
    pub(super) mask: Tensor,
    /// Whether any input is shorter than the longest (without padding the mask changes nothing, so the
    /// encoder skips it).
    pub(super) padded: bool,
}

impl Inputs {
    pub(super) fn new(batch: &[Encoded], pad_id: u32, device: &Device) -> Result<Inputs, ModelError> {
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

/// A sequence classifier scoring (query, segment) pairs: the first token's final state through its family's
/// head (a dense layer, an activation: BERT's pooler and RoBERTa's head with tanh, ELECTRA's with GELU,
/// DistilBERT's pre-classifier with ReLU; then the output layer); with two labels, label 1's logit.
pub struct CrossEncoder {
    pub(super) backbone: Backbone,
    pub(super) dense: Linear,
    pub(super) activation: Activation,
    pub(super) classifier: Linear,
    pub(super) label: usize,
}

impl CrossEncoder {
    pub fn load(dir: &Path, device: &Device, dtype: DType) -> Result<CrossEncoder, ModelError> {
        let (config, pieces) = read_config(dir)?;
        CrossEncoder::new(weights(dir, device, dtype)?, &config, pieces, dir)
    }

    /// The model over the variables of `vb`; `origin` names where they came from in errors.
    pub(super) fn new(
        vb: VarBuilder,
        config: &Config,
        pieces: Pieces,
        origin: &Path,
    ) -> Result<CrossEncoder, ModelError> {
        let backbone = Backbone::new(vb.clone(), config, pieces, origin)?;
        let h = backbone.hidden_size;
        let linear = |names: &[&str], out: usize| -> Result<Linear, ModelError> {
            names
                .iter()
                .find_map(|n| candle_nn::linear(h, out, vb.pp(*n)).ok())
                .ok_or_else(|| load_err(origin, format!("no weights for {}", names.join(" or "))))
        };
        let (dense, activation, output) = Family::from_config(config).head();
        let dense = linear(dense, h)?;
        let labels = [2usize, 1].into_iter().find(|n| vb.pp(output).get((*n, h), "weight").is_ok());
        let labels =
            labels.ok_or_else(|| load_err(origin, format!("no {output} with 1 or 2 labels ({output}.weight)")))?;
        let classifier = linear(&[output], labels)?;
        Ok(CrossEncoder { backbone, dense, activation, classifier, label: labels - 1 })
    }

    /// Encodes a pair by the tokenizer's template (BERT's `[CLS] query [SEP] segment [SEP]`), the query cut to
    /// `max_query_tokens`, the segment cut so the whole fits `max_len`.
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
        let head = |cls: &Tensor| -> candle_core::Result<Tensor> {
            let dense = self.dense.forward(cls)?;
            let activated = match self.activation {
                Activation::Tanh => dense.tanh()?,
                Activation::Gelu => dense.gelu_erf()?,
                Activation::Relu => dense.relu()?,
            };
            self.classifier.forward(&activated)?.i((.., self.label))
        };
        let logits = if self.backbone.device.is_cpu() {
            // Row by row, so that a pair's logit has the same bits whatever it is batched with (candle's
            // product over several rows sums in another order than over one).
            let rows =
                (0..batch.len()).map(|i| head(&cls.narrow(0, i, 1)?)).collect::<candle_core::Result<Vec<_>>>()?;
            Tensor::cat(&rows, 0)?
        } else {
            head(&cls)?
        };
        Ok((logits.to_dtype(DType::F32)?.to_vec1::<f32>()?, cls))
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
        self.dense.weight().dtype()
    }

    /// FLOPs of scoring one pair of `len` word pieces: the encoder and the head's two layers.
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

/// How a sentence-transformers model turns token states into an embedding: its pooling, whether it
/// normalizes, and its longest input (`modules.json`, the Pooling module's config, `sentence_bert_config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SentenceLayout {
    pub pooling: Pooling,
    pub normalize: bool,
    pub max_seq_length: usize,
}

impl SentenceLayout {
    /// The layout of the model in `dir`; `max_len` (the tokenizer's) when it names no longest input.
    pub(super) fn read(dir: &Path, max_len: usize) -> Result<SentenceLayout, ModelError> {
        let modules_path = dir.join("modules.json");
        let modules: Vec<StModule> = read_json(&modules_path)?;
        let pooling_dir = modules.iter().find(|m| m.kind.ends_with(".Pooling")).map(|m| dir.join(&m.path));
        let pooling_dir = pooling_dir.ok_or_else(|| load_err(&modules_path, "no Pooling module"))?;
        let pooling: PoolingConfig = read_json(&pooling_dir.join("config.json"))?;
        let mode = pooling.pooling_mode.as_deref();
        let pooling = match (pooling.pooling_mode_mean_tokens || mode == Some("mean"), pooling.pooling_mode_cls_token) {
            (true, _) => Pooling::Mean,
            (false, true) => Pooling::Cls,
            _ if mode == Some("cls") => Pooling::Cls,
            _ => return Err(load_err(&pooling_dir, "only mean or CLS pooling is supported")),
        };
        let normalize = modules.iter().any(|m| m.kind.ends_with(".Normalize"));
        // The longest input: sentence_bert_config.json's (sentence-transformers before 6), else the tokenizer
        // configuration's (6 and later), else the model's.
        let mut max_seq_length = max_len;
        for (file, key) in
            [("sentence_bert_config.json", "max_seq_length"), ("tokenizer_config.json", "model_max_length")]
        {
            let path = dir.join(file);
            // A tokenizer without a limit says 1e30 or so: the model's own bounds it.
            let longest = match path.exists() {
                true => read_json::<serde_json::Value>(&path)?.get(key).and_then(serde_json::Value::as_f64),
                false => None,
            };
            if let Some(longest) = longest {
                max_seq_length = (longest as usize).min(max_len);
                break;
            }
        }
        Ok(SentenceLayout { pooling, normalize, max_seq_length })
    }

    /// The module directories `modules.json` names (the Pooling module's, …), relative to `dir`.
    pub(super) fn module_dirs(dir: &Path) -> Result<Vec<String>, ModelError> {
        let modules: Vec<StModule> = read_json(&dir.join("modules.json"))?;
        Ok(modules.into_iter().map(|m| m.path).filter(|p| !p.is_empty()).collect())
    }

    /// The embeddings `[batch, hidden]` of final hidden states `[batch, len, hidden]` under `mask` `[batch, len]`.
    pub(super) fn pool(&self, hidden: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
        let pooled = match self.pooling {
            Pooling::Cls => hidden.i((.., 0))?,
            Pooling::Mean => {
                let mask = mask.to_dtype(hidden.dtype())?.unsqueeze(D::Minus1)?;
                let summed = hidden.broadcast_mul(&mask)?.sum(1)?;
                summed.broadcast_div(&mask.sum(1)?)?
            }
        };
        if !self.normalize {
            return Ok(pooled);
        }
        let norm = pooled.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12, f32::MAX)?;
        pooled.broadcast_div(&norm)
    }
}

/// A sentence-transformers bi-encoder: texts to (optionally normalized) embeddings.
pub struct BiEncoder {
    pub(super) backbone: Backbone,
    pub(super) layout: SentenceLayout,
}

#[derive(Deserialize)]
struct PoolingConfig {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    /// sentence-transformers 6 and later: `mean`, `cls`, …
    #[serde(default)]
    pooling_mode: Option<String>,
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
        let layout = SentenceLayout::read(dir, backbone.pieces.max_len)?;
        Ok(BiEncoder { backbone, layout })
    }

    pub fn encode(&self, text: &str) -> Result<Encoded, ModelError> {
        self.backbone.pieces.single(text, self.layout.max_seq_length)
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
        Ok(self.layout.pool(&hidden, &mask)?.to_dtype(DType::F32)?.to_vec2::<f32>()?)
    }
}
