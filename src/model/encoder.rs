//! The encoders: the BERT backbone every model kind shares (weights and tokenizer), a cross-encoder scoring
//! (query, segment) pairs and a sentence-transformers bi-encoder embedding texts.

use std::path::Path;

use candle_core::{DType, Device, IndexOp, Tensor, D};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::Config;
use serde::Deserialize;

use super::bert::{Bert, Positions};
use super::deberta::Deberta;
use super::decoder::Decoder;
use super::error::load_err;
use super::family::Family;
use super::head::Head;
use super::load::{read_config, read_json, weights};
use super::modernbert::ModernBert;
use super::network::{Inputs, Network};
use super::recipe::{Prompt, Recipe, RECIPES};
use super::tokenize::{Encoded, Pieces};
use super::ModelError;

/// The network and tokenizer every model kind shares.
pub(super) struct Backbone {
    pub(super) network: Box<dyn Network>,
    pub(super) pieces: Pieces,
    pub(super) device: Device,
    pub(super) hidden_size: usize,
    pub(super) config: Config,
}

impl Backbone {
    /// Loads the network's weights (with or without their family's prefix) and returns the variables for the
    /// heads.
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
        let network = load_network(Family::from_config(config), vb, config, origin)?;
        Ok(Backbone { network, pieces, device, hidden_size: config.hidden_size, config: config.clone() })
    }

    /// Final hidden states `[batch, len, hidden]` of right-padded inputs, and the attention mask `[batch, len]`.
    /// With `Positions::First`, our BERT encoder computes the first position's states alone (`[batch, 1,
    /// hidden]`); the other networks compute every position's.
    pub(super) fn forward(&self, batch: &[Encoded], positions: Positions) -> Result<(Tensor, Tensor), ModelError> {
        let inputs = Inputs::new(batch, self.pieces.pad_id, &self.device)?;
        Ok((self.network.forward(&inputs, positions)?, inputs.mask))
    }

    /// Whether inputs must be computed one at a time for their outputs not to depend on their batch.
    pub(super) fn computes_alone(&self) -> bool {
        self.network.computes_alone(&self.device)
    }

    /// FLOPs of one pass over `len` positions.
    pub(super) fn flops(&self, len: usize) -> f64 {
        self.network.flops(&self.config, len)
    }

    /// Makes the network's linear layers int8 (our BERT encoder's: the families it runs).
    pub(super) fn quantize(&mut self) -> Result<(), ModelError> {
        self.network.quantize()
    }
}

/// The network of `family` over the weights under `vb`; `origin` (the model's directory) names it in errors and
/// holds the configuration files an architecture reads beyond `config`.
fn load_network(
    family: Family,
    vb: VarBuilder,
    config: &Config,
    origin: &Path,
) -> Result<Box<dyn Network>, ModelError> {
    Ok(match family {
        Family::ModernBert => Box::new(ModernBert::load(vb, origin)?),
        Family::Deberta => Box::new(Deberta::load(vb, config, origin)?),
        Family::Qwen2 | Family::Qwen3 | Family::Gemma => Box::new(Decoder::load(vb, family, origin)?),
        Family::Bert | Family::Roberta | Family::Electra | Family::DistilBert => {
            Box::new(Bert::load(vb, config).map_err(|e| load_err(origin, format!("loading {family:?} weights: {e}")))?)
        }
    })
}

/// A reranker scoring (query, segment) pairs: a sequence classifier (the final states through its family's
/// head, `head`), or a causal decoder answering through its recipe (`recipe`: the template builds the input, the
/// head reads the answer at the last token).
pub struct CrossEncoder {
    pub(super) backbone: Backbone,
    pub(super) head: Head,
    pub(super) prompt: Option<Prompt>,
}

impl CrossEncoder {
    /// The model in `dir`; a decoder's recipe is `recipe`, else detected (`Recipe::detect`).
    pub fn load(dir: &Path, device: &Device, dtype: DType, recipe: Option<Recipe>) -> Result<CrossEncoder, ModelError> {
        let (config, pieces) = read_config(dir)?;
        CrossEncoder::new(weights(dir, device, dtype)?, &config, pieces, dir, recipe)
    }

    /// The model over the variables of `vb`; `origin` names where they came from in errors.
    pub(super) fn new(
        vb: VarBuilder,
        config: &Config,
        pieces: Pieces,
        origin: &Path,
        recipe: Option<Recipe>,
    ) -> Result<CrossEncoder, ModelError> {
        let family = Family::from_config(config);
        if !family.is_decoder() {
            if let Some(recipe) = recipe {
                return Err(load_err(origin, format!("the {recipe:?} recipe reads causal decoders, not {family:?}")));
            }
            let head = Head::load(&vb, config, origin)?;
            return Ok(CrossEncoder { backbone: Backbone::new(vb, config, pieces, origin)?, head, prompt: None });
        }
        let path = origin.join("config.json");
        let architectures = match path.exists() {
            true => read_json::<Architectures>(&path)?.architectures,
            false => Vec::new(),
        };
        let recipe = recipe.or_else(|| Recipe::detect(&origin.to_string_lossy(), &architectures)).ok_or_else(|| {
            let message = format!(
                "a causal language model ({family:?}) reranks through a recipe, and none was set or detected from \
                 the hub id: set recipe to one of {RECIPES}"
            );
            load_err(origin, message)
        })?;
        if recipe.family() != family {
            let message = format!("the {recipe:?} recipe reads {:?} models, and this is {family:?}", recipe.family());
            return Err(load_err(origin, message));
        }
        let prompt =
            Prompt::new(recipe, &pieces, pieces.pad_id).map_err(|e| load_err(&origin.join("tokenizer.json"), e))?;
        let answer = prompt.answer(&vb, config.hidden_size).map_err(|e| load_err(origin, e))?;
        let head = Head::answer(answer)?;
        Ok(CrossEncoder { backbone: Backbone::new(vb, config, pieces, origin)?, head, prompt: Some(prompt) })
    }

    /// Encodes a pair by the tokenizer's template (BERT's `[CLS] query [SEP] segment [SEP]`), the query cut to
    /// `max_query_tokens`, the segment cut so the whole fits `max_len`; a decoder's by its recipe, with its
    /// default instruction.
    pub fn encode(
        &self,
        query: &str,
        segment: &str,
        max_len: usize,
        max_query_tokens: usize,
    ) -> Result<Encoded, ModelError> {
        self.encode_with(None, query, segment, max_len, max_query_tokens)
    }

    /// `encode` with an instruction for a decoder's recipe (`Recipe::default_instruction` when none); an
    /// encoder has no place for one and refuses it.
    pub fn encode_with(
        &self,
        instruction: Option<&str>,
        query: &str,
        segment: &str,
        max_len: usize,
        max_query_tokens: usize,
    ) -> Result<Encoded, ModelError> {
        let pieces = &self.backbone.pieces;
        match &self.prompt {
            Some(prompt) => {
                prompt.encode(pieces, (instruction, query, segment), (max_len.min(pieces.max_len), max_query_tokens))
            }
            None if instruction.is_some() => {
                Err(ModelError::Unsupported("an instruction is read by decoder rerankers only".into()))
            }
            None => pieces.pair(query, segment, max_len, max_query_tokens),
        }
    }

    /// The most word pieces a segment may have so that it is never cut.
    pub(super) fn segment_budget(&self, max_len: usize, max_query_tokens: usize) -> usize {
        let pieces = &self.backbone.pieces;
        match &self.prompt {
            Some(prompt) => max_len.min(pieces.max_len).saturating_sub(prompt.fixed + max_query_tokens).max(1),
            None => pieces.segment_budget(max_len, max_query_tokens),
        }
    }

    /// The recipe a decoder reranker reads with.
    pub fn recipe(&self) -> Option<Recipe> {
        self.prompt.as_ref().map(|p| p.recipe)
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
        let (hidden, mask) = self.backbone.forward(batch, self.head.positions())?;
        let cls = hidden.i((.., 0))?;
        let logits = if self.backbone.device.is_cpu() {
            // Row by row, so that a pair's logit has the same bits whatever it is batched with (candle's
            // product over several rows sums in another order than over one).
            let row = |i| self.head.forward(&hidden.narrow(0, i, 1)?, &mask.narrow(0, i, 1)?);
            Tensor::cat(&(0..batch.len()).map(row).collect::<candle_core::Result<Vec<_>>>()?, 0)?
        } else {
            self.head.forward(&hidden, &mask)?
        };
        Ok((logits.to_dtype(DType::F32)?.to_vec1::<f32>()?, cls))
    }

    /// Makes the encoder's linear layers int8.
    pub fn quantize(&mut self) -> Result<(), ModelError> {
        self.backbone.quantize()
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
        self.head.dtype()
    }

    /// FLOPs of scoring one pair of `len` word pieces: the encoder and the head's two layers.
    pub fn pair_flops(&self, len: usize) -> f64 {
        self.backbone.flops(len) + self.head.flops(self.backbone.hidden_size)
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

    /// The final states pooling reads: the first position's alone for CLS pooling.
    pub(super) fn positions(&self) -> Positions {
        match self.pooling {
            Pooling::Cls => Positions::First,
            Pooling::Mean => Positions::All,
        }
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

/// `config.json`'s architectures (a converted checkpoint's tell its recipe).
#[derive(Deserialize)]
struct Architectures {
    #[serde(default)]
    architectures: Vec<String>,
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

    /// A text's input length in word pieces, special tokens included, and the most the model reads (`encode`
    /// cuts the rest).
    pub fn input_len(&self, text: &str) -> Result<(usize, usize), ModelError> {
        self.backbone.pieces.single_len(text, self.layout.max_seq_length)
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
        let (hidden, mask) = self.backbone.forward(batch, self.layout.positions())?;
        Ok(self.layout.pool(&hidden, &mask)?.to_dtype(DType::F32)?.to_vec2::<f32>()?)
    }
}
