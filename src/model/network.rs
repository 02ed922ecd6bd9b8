//! The backbone trait: one architecture's layers, token ids in and final states out, one file each (`bert`,
//! `modernbert`, `deberta`, `decoder`), as text-embeddings-inference keeps its candle models, and the inputs they
//! read. A new architecture is a file implementing `Network` and a line in `encoder::load_network` (and its
//! `model_type` in `family`); the heads, the templates and everything that serves a model stay as they are.

use candle_core::{Device, Tensor};
use candle_transformers::models::bert::Config;

use super::bert::{Bert, Positions};
use super::error::ModelError;
use super::family::Family;
use super::modernbert::ModernBert;
use super::tokenize::Encoded;

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

    /// Makes the linear layers int8.
    fn quantize(&mut self) -> Result<(), ModelError>;
}

/// FLOPs of one encoder pass over `len` positions (multiply-adds counted as two): per layer the four attention
/// projections (8·L·h²), the feed-forward (4·L·h·i; ModernBERT's gated one 6·L·h·i) and the attention products
/// (4·L²·h, counted whole for ModernBERT's local layers too: an upper bound there).
pub fn encoder_flops(config: &Config, layers: usize, len: usize) -> f64 {
    let (l, h, i) = (len as f64, config.hidden_size as f64, config.intermediate_size as f64);
    let feed_forward = if Family::from_config(config) == Family::ModernBert { 6.0 } else { 4.0 };
    layers as f64 * (8.0 * l * h * h + feed_forward * l * h * i + 4.0 * l * l * h)
}

/// A batch of encoded inputs as tensors, right-padded to the longest.
pub(super) struct Inputs {
    pub(super) ids: Tensor,
    pub(super) types: Tensor,
    pub(super) mask: Tensor,
    /// Each input's real positions (before its padding).
    pub(super) lengths: Vec<usize>,
    /// Each input's `Encoded::shared_prefix`.
    pub(super) shared_prefixes: Vec<usize>,
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
            lengths: batch.iter().map(|e| e.ids.len()).collect(),
            shared_prefixes: batch.iter().map(|e| e.shared_prefix).collect(),
            padded: batch.iter().any(|e| e.ids.len() != len),
        })
    }
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

/// ModernBERT's attention products are candle's, which sum in batch-shaped products: alone on the CPU.
impl Network for ModernBert {
    fn forward(&self, inputs: &Inputs, _: Positions) -> candle_core::Result<Tensor> {
        ModernBert::forward(self, &inputs.ids, &inputs.lengths)
    }

    fn computes_alone(&self, device: &Device) -> bool {
        device.is_cpu()
    }

    fn quantize(&mut self) -> Result<(), ModelError> {
        ModernBert::quantize(self)
    }
}
