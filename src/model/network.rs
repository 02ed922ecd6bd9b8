//! The backbone trait: one architecture's layers, token ids in and final states out, one file each (`bert`,
//! `modernbert`, `deberta`, `decoder`), as text-embeddings-inference keeps its candle models. A new architecture
//! is a file implementing `Network` and a line in `load` (and its `model_type` in `family`); the heads, the
//! templates and everything that serves a model stay as they are.

use std::path::Path;

use candle_core::{Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::Config;

use super::bert::{Bert, Positions};
use super::deberta::Deberta;
use super::decoder::Decoder;
use super::encoder::{encoder_flops, Inputs};
use super::family::Family;
use super::load::load_err;
use super::modernbert::ModernBert;
use super::ModelError;

pub(super) trait Network: Send + Sync {
    /// Final states `[batch, len, hidden]` of right-padded inputs (`[batch, 1, hidden]` where an encoder computes
    /// the first position alone for `Positions::First`).
    fn forward(&self, inputs: &Inputs, positions: Positions) -> candle_core::Result<Tensor>;

    /// Whether inputs must be computed one at a time on `device` for their outputs not to depend on their batch.
    fn computes_alone(&self, device: &Device) -> bool;

    /// FLOPs of one pass over `len` positions (multiply-adds counted as two): an encoder's by default.
    fn flops(&self, config: &Config, len: usize) -> f64 {
        encoder_flops(config, config.num_hidden_layers, len)
    }

    /// Makes the linear layers int8, where the architecture has such layers of ours.
    fn quantize(&mut self) -> Result<(), ModelError> {
        Err(ModelError::Unsupported("int8 takes BERT-family encoders only".into()))
    }
}

/// The network of `family` over the weights under `vb`; `origin` (the model's directory) names it in errors and
/// holds the configuration files an architecture reads beyond `config`.
pub(super) fn load(
    family: Family,
    vb: VarBuilder,
    config: &Config,
    origin: &Path,
) -> Result<Box<dyn Network>, ModelError> {
    Ok(match family {
        Family::ModernBert => Box::new(ModernBert::load(vb, origin)?),
        Family::Deberta => Box::new(Deberta::load(vb, origin)?),
        Family::Qwen2 | Family::Qwen3 | Family::Gemma => Box::new(Decoder::load(vb, family, origin)?),
        Family::Bert | Family::Roberta | Family::Electra | Family::DistilBert => {
            Box::new(Bert::load(vb, config).map_err(|e| load_err(origin, format!("loading {family:?} weights: {e}")))?)
        }
    })
}

impl Network for Bert {
    fn forward(&self, inputs: &Inputs, positions: Positions) -> candle_core::Result<Tensor> {
        Bert::forward(self, &inputs.ids, &inputs.types, inputs.padded.then_some(&inputs.mask), positions)
    }

    fn computes_alone(&self, _: &Device) -> bool {
        Bert::computes_alone(self)
    }

    fn quantize(&mut self) -> Result<(), ModelError> {
        Ok(Bert::quantize(self)?)
    }
}

/// candle's ModernBERT and DeBERTa sum in batch-shaped products everywhere: alone on the CPU.
impl Network for ModernBert {
    fn forward(&self, inputs: &Inputs, _: Positions) -> candle_core::Result<Tensor> {
        ModernBert::forward(self, &inputs.ids, &inputs.mask)
    }

    fn computes_alone(&self, device: &Device) -> bool {
        device.is_cpu()
    }
}

impl Network for Deberta {
    fn forward(&self, inputs: &Inputs, _: Positions) -> candle_core::Result<Tensor> {
        Deberta::forward(self, &inputs.ids, &inputs.types, &inputs.mask)
    }

    fn computes_alone(&self, device: &Device) -> bool {
        device.is_cpu()
    }
}
