//! ModernBERT (rotary positions, local attention in every layer but each `global_attn_every_n_layers`-th,
//! GeGLU, inputs up to 8,192 tokens): our forward over transformers' weights and layout, and what its
//! configuration says of its sequence-classification head (`head` builds and configures it). Local layers
//! compute attention within their window only: queries in blocks, each against the keys its window reaches
//! (about L x (block + window) scores a head, not L x L), so that 8,192 tokens cost what their arithmetic does.
//! On the CPU in f32 attention is one op a layer (`blas::attention`: rotation, window, softmax and products
//! reading the projection in place), elsewhere candle's chain a block at a time; the projections through our
//! products (`Dense`). Options the forward does not compute (biases) are refused
//! rather than ignored. Configuration names are candle-transformers' (its `Config` parses them).

use std::path::Path;
use std::sync::Arc;

use candle_core::{Module, Tensor};
use candle_nn::{Embedding, LayerNorm, VarBuilder};
use candle_transformers::models::modernbert;
use serde::Deserialize;

use super::bert::Dense;
use super::cpu::blas::{self, Heads, Rotary};
use super::cpu::kernels::{self, Band};
use super::dropout::{drop_probabilities, Dropout, Site};
use super::error::load_err;
use super::load::read_json;
use super::ModelError;

/// The backbone over a checkpoint's root (a sequence classifier's `model.*`, or a bare model's names).
pub struct ModernBert {
    embed: Embedding,
    embed_norm: LayerNorm,
    layers: Vec<Layer>,
    final_norm: LayerNorm,
    heads: usize,
    head_dim: usize,
    /// How far a local layer's query reads on each side (`local_attention / 2`, as transformers masks it).
    window: usize,
    global_theta: f64,
    local_theta: f64,
    /// In training: every operation differentiable, the queries scaled on every pass (their projection is a
    /// variable that changes between passes; inference folds the scale into it at load).
    differentiable: bool,
    /// A trainable model's (none in inference).
    dropout: Dropout,
}

struct Layer {
    /// None in the first layer (transformers' identity there).
    attn_norm: Option<LayerNorm>,
    /// Queries (1/√head_dim folded in, in inference), keys and values as one product.
    qkv: Dense,
    out: Dense,
    mlp_norm: LayerNorm,
    /// The GeGLU's input and gate projections as one product.
    wi: Dense,
    wo: Dense,
    local: bool,
}

/// Query positions per attention block: a local layer's block reads at most `QUERY_BLOCK + 2 · window` keys.
const QUERY_BLOCK: usize = 128;

/// What `config.json` says beyond candle's configuration: the options candle's backbone does not read and
/// longrank refuses rather than ignores (the head's are `head`'s).
#[derive(Deserialize)]
struct Options {
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
    #[serde(default)]
    norm_bias: bool,
    #[serde(default = "gelu")]
    hidden_activation: String,
}

fn gelu() -> String {
    "gelu".into()
}

fn options(dir: &Path) -> Result<Options, ModelError> {
    let path = dir.join("config.json");
    let options: Options = read_json(&path)?;
    for (name, set) in [("attention_bias", options.attention_bias), ("mlp_bias", options.mlp_bias)] {
        if set {
            return Err(load_err(&path, format!("ModernBERT with {name} = true is not supported")));
        }
    }
    if options.norm_bias || options.hidden_activation != "gelu" {
        return Err(load_err(&path, "ModernBERT with norm_bias or an activation other than gelu is not supported"));
    }
    Ok(options)
}

impl ModernBert {
    /// The backbone of the checkpoint whose variables `vb` holds and whose configuration is in `dir`.
    pub fn load(vb: VarBuilder, dir: &Path) -> Result<ModernBert, ModelError> {
        // A sequence classifier's backbone is under `model.`; a bare model's checkpoint names it without.
        let classifier = vb.contains_tensor("model.embeddings.tok_embeddings.weight");
        ModernBert::build(vb, dir, classifier, false)
    }

    /// The training model (every operation differentiable) over variables named as a sequence classifier's
    /// (`model.*`).
    pub fn trainable(vb: VarBuilder, dir: &Path, dropout: Dropout) -> Result<ModernBert, ModelError> {
        Ok(ModernBert { dropout, ..ModernBert::build(vb, dir, true, true)? })
    }

    fn build(vb: VarBuilder, dir: &Path, classifier: bool, differentiable: bool) -> Result<ModernBert, ModelError> {
        options(dir)?;
        let path = dir.join("config.json");
        let mut raw: serde_json::Map<String, serde_json::Value> = read_json(&path)?;
        // transformers names it `norm_eps`, candle `layer_norm_eps`; transformers 5 writes the rotary bases as
        // `rope_parameters` (full attention's, the sliding window's) where earlier versions wrote
        // `global_rope_theta` and `local_rope_theta`.
        if let Some(eps) = raw.get("norm_eps").cloned() {
            raw.entry("layer_norm_eps").or_insert(eps);
        }
        if !raw.contains_key("global_attn_every_n_layers") {
            let types: Vec<&str> = raw
                .get("layer_types")
                .and_then(serde_json::Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(serde_json::Value::as_str)
                .collect();
            let every = global_every(&types)
                .ok_or_else(|| load_err(&path, "layer_types is not one global layer every n others: not supported"))?;
            raw.insert("global_attn_every_n_layers".into(), every.into());
        }
        for (kind, name) in [("full_attention", "global_rope_theta"), ("sliding_attention", "local_rope_theta")] {
            let rope = raw.get("rope_parameters").and_then(|p| p.get(kind)).cloned();
            if let Some(rope) = rope {
                if rope.get("rope_type").and_then(serde_json::Value::as_str).is_some_and(|t| t != "default") {
                    return Err(load_err(
                        &path,
                        format!("ModernBERT's {kind} rope_type {} is not supported", rope["rope_type"]),
                    ));
                }
                if let Some(theta) = rope.get("rope_theta").cloned() {
                    raw.entry(name).or_insert(theta);
                }
            }
        }
        let c: modernbert::Config =
            serde_json::from_value(serde_json::Value::Object(raw)).map_err(|e| load_err(&path, e))?;
        let vb = if classifier { vb.pp("model") } else { vb };
        let (h, heads) = (c.hidden_size, c.num_attention_heads);
        let head_dim = h / heads;
        let norm = |vb: VarBuilder| candle_nn::layer_norm_no_bias(h, c.layer_norm_eps, vb);
        let build = || -> candle_core::Result<ModernBert> {
            let layers = (0..c.num_hidden_layers)
                .map(|i| {
                    let vb = vb.pp(format!("layers.{i}"));
                    let (attn, mlp) = (vb.pp("attn"), vb.pp("mlp"));
                    let qkv = attn.get((3 * h, h), "Wqkv.weight")?;
                    let scale = 1.0 / (head_dim as f64).sqrt();
                    let qkv = match differentiable {
                        true => qkv,
                        false => Tensor::cat(&[(qkv.narrow(0, 0, h)? * scale)?, qkv.narrow(0, h, 2 * h)?], 0)?,
                    };
                    let i_size = c.intermediate_size;
                    Ok(Layer {
                        attn_norm: vb
                            .contains_tensor("attn_norm.weight")
                            .then(|| norm(vb.pp("attn_norm")))
                            .transpose()?,
                        qkv: Dense::new(qkv, differentiable)?,
                        out: Dense::new(attn.get((h, h), "Wo.weight")?, differentiable)?,
                        mlp_norm: norm(vb.pp("mlp_norm"))?,
                        wi: Dense::new(mlp.get((2 * i_size, h), "Wi.weight")?, differentiable)?,
                        wo: Dense::new(mlp.get((h, i_size), "Wo.weight")?, differentiable)?,
                        local: i % c.global_attn_every_n_layers != 0,
                    })
                })
                .collect::<candle_core::Result<Vec<_>>>()?;
            Ok(ModernBert {
                embed: Embedding::new(vb.get((c.vocab_size, h), "embeddings.tok_embeddings.weight")?, h),
                embed_norm: norm(vb.pp("embeddings.norm"))?,
                layers,
                final_norm: norm(vb.pp("final_norm"))?,
                heads,
                head_dim,
                window: c.local_attention / 2,
                global_theta: c.global_rope_theta,
                local_theta: c.local_rope_theta,
                differentiable,
                dropout: Dropout::default(),
            })
        };
        build().map_err(|e| load_err(dir, e))
    }

    /// Final states `[batch, len, hidden]` of right-padded `ids` whose sequences have `lengths` real positions.
    pub fn forward(&self, ids: &Tensor, lengths: &[usize]) -> candle_core::Result<Tensor> {
        let (batch, len) = ids.dims2()?;
        let mut x = self.dropout.apply(Site::Embeddings, &self.embed_norm.forward(&self.embed.forward(ids)?)?)?;
        let table = |theta| -> candle_core::Result<Positions> {
            let (cos, sin) = super::rotary::tables(self.head_dim, theta, len, x.dtype(), x.device())?;
            let fused = blas::available_for(&x).then(|| Rotary::new(&cos, &sin).map(Arc::new)).transpose()?;
            Ok(Positions { cos, sin, fused })
        };
        let (global, local) = (table(self.global_theta)?, table(self.local_theta)?);
        // The fused op's mask: 0 at each sequence's positions, the most negative value at its padding.
        let mask: Vec<f32> =
            lengths.iter().flat_map(|n| (0..len).map(move |i| if i < *n { 0.0 } else { f32::MIN })).collect();
        let mask = Tensor::from_vec(mask, (batch, len), x.device())?;
        for layer in &self.layers {
            let normed = match &layer.attn_norm {
                Some(norm) => norm.forward(&x)?,
                None => x.clone(),
            };
            let positions = if layer.local { &local } else { &global };
            x = (&x + self.attention(layer, &normed, lengths, &mask, positions)?)?;
            let gated = kernels::gelu_gate(&layer.wi.forward(&layer.mlp_norm.forward(&x)?, lengths)?)?;
            let gated = self.dropout.apply(Site::FeedForward, &gated)?;
            x = (&x + layer.wo.forward(&gated, lengths)?)?;
        }
        self.final_norm.forward(&x)
    }

    /// Makes every projection int8 (`quantize = "int8"`).
    pub fn quantize(&mut self) -> Result<(), ModelError> {
        let device = self.embed.embeddings().device().clone();
        let layers = self.layers.iter_mut().flat_map(|l| [&mut l.qkv, &mut l.out, &mut l.wi, &mut l.wo]);
        Ok(Dense::quantize_all(layers, &device)?)
    }

    fn attention(
        &self,
        layer: &Layer,
        x: &Tensor,
        lengths: &[usize],
        mask: &Tensor,
        positions: &Positions,
    ) -> candle_core::Result<Tensor> {
        let (b, len, h) = x.dims3()?;
        let qkv = layer.qkv.forward(x, lengths)?;
        let qkv = match self.differentiable {
            true => {
                let scale = 1.0 / (self.head_dim as f64).sqrt();
                Tensor::cat(&[&(qkv.narrow(2, 0, h)? * scale)?, &qkv.narrow(2, h, 2 * h)?], 2)?
            }
            false => qkv,
        };
        let window = layer.local.then_some(self.window);
        let dropout = self.dropout.attention();
        // With BLAS loaded, one fused op (rotation, window and all); else candle's chain, a block at a time.
        let heads = Heads { count: self.heads, rotary: positions.fused.clone(), window };
        if positions.fused.is_some() {
            if let Some(context) = blas::attention(&qkv, mask, None, &heads, self.differentiable, false, dropout)? {
                return self.dropout.apply(Site::AttentionOutput, &layer.out.forward(&context, lengths)?);
            }
        }
        let qkv = qkv.reshape((b, len, 3, self.heads, self.head_dim))?;
        // `[batch, heads, len, head_dim]` each.
        let part = |i| qkv.narrow(2, i, 1)?.squeeze(2)?.transpose(1, 2)?.contiguous();
        let q = candle_nn::rotary_emb::rope(&part(0)?, &positions.cos, &positions.sin)?;
        let k = candle_nn::rotary_emb::rope(&part(1)?, &positions.cos, &positions.sin)?;
        let v = part(2)?;
        let mut contexts = Vec::with_capacity(len.div_ceil(QUERY_BLOCK));
        for start in (0..len).step_by(QUERY_BLOCK) {
            let rows = QUERY_BLOCK.min(len - start);
            let (first_key, end) = match window {
                Some(w) => (start.saturating_sub(w), (start + rows + w).min(len)),
                None => (0, len),
            };
            let (k, v) = (k.narrow(2, first_key, end - first_key)?, v.narrow(2, first_key, end - first_key)?);
            let scores = q.narrow(2, start, rows)?.contiguous()?.matmul(&k.t()?)?;
            let band = Band { first_query: start, first_key, window, lengths: lengths.to_vec() };
            let probs = drop_probabilities(dropout, kernels::band_softmax(&scores, &band)?, (start, first_key))?;
            contexts.push(probs.matmul(&v)?);
        }
        let context = Tensor::cat(&contexts, 2)?.transpose(1, 2)?.reshape((b, len, h))?;
        self.dropout.apply(Site::AttentionOutput, &layer.out.forward(&context, lengths)?)
    }
}

/// A layer kind's rotary tables: as tensors for candle's chain, and as the fused op takes them (with BLAS).
struct Positions {
    cos: Tensor,
    sin: Tensor,
    fused: Option<Arc<Rotary>>,
}

/// transformers 5 writes ModernBERT's layers as `layer_types`: the `n` of a global layer every `n` (the first
/// one global), when that is their pattern.
fn global_every(types: &[&str]) -> Option<usize> {
    let every = types.iter().skip(1).position(|t| *t == "full_attention").map_or(types.len(), |p| p + 1);
    let regular = types
        .iter()
        .enumerate()
        .all(|(i, t)| *t == if i % every == 0 { "full_attention" } else { "sliding_attention" });
    (regular && !types.is_empty()).then_some(every)
}

#[cfg(test)]
mod tests {
    #[test]
    fn layer_types_give_the_global_layers_period() {
        let (full, sliding) = ("full_attention", "sliding_attention");
        assert_eq!(super::global_every(&[full, sliding, sliding, full, sliding, sliding, full]), Some(3));
        assert_eq!(super::global_every(&[full, sliding, full]), Some(2));
        assert_eq!(super::global_every(&[full]), Some(1));
        assert_eq!(super::global_every(&[full, full]), Some(1));
        assert_eq!(super::global_every(&[full, sliding, full, full]), None);
        assert_eq!(super::global_every(&[sliding, full]), None);
        assert_eq!(super::global_every(&[]), None);
    }
}
