//! Our BERT encoder for inference: the arithmetic of Hugging Face's `BertModel` (and candle-transformers'),
//! with fewer passes over memory. The query, key and value projections are one matrix product (the attention
//! scale folded into the query weights at load time); the mask is added only when the batch has padding;
//! softmax is candle-nn's fused row kernel; the intermediate bias and the exact GELU are one pass on every core
//! with a polynomial erf. Weights load from the same checkpoints (`bert.`-prefixed or not).
//!
//! For training, `Bert::trainable` builds the same model from differentiable operations only: candle-nn's
//! fused LayerNorm and softmax, and the fused GELU, have no backward pass (LayerNorm's output is silently
//! detached), and the folded query scale would go stale once the weights are updated.

use candle_core::{CpuStorage, CustomOp2, DType, Layout, Module, Shape, Tensor, D};
use candle_nn::{Embedding, LayerNorm, Linear, VarBuilder};
use candle_transformers::models::bert::{Config, HiddenAct};

pub struct Bert {
    word: Embedding,
    position: Embedding,
    token_type: Embedding,
    norm: LayerNorm,
    layers: Vec<Layer>,
    heads: usize,
    head_dim: usize,
    act: HiddenAct,
    eps: f64,
    differentiable: bool,
}

/// The query, key and value projections as one `[3h, h]` product.
enum Qkv {
    /// Concatenated at load time, the attention scale folded into the query rows (inference).
    Fused(Linear),
    /// The variables as they are, concatenated and scaled on every pass (training).
    Parts { weights: [Tensor; 3], biases: [Tensor; 3], scale: f64 },
}

impl Qkv {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Qkv::Fused(linear) => linear.forward(x),
            Qkv::Parts { weights: [wq, wk, wv], biases: [bq, bk, bv], scale } => {
                let weight = Tensor::cat(&[&(wq * *scale)?, wk, wv], 0)?;
                let bias = Tensor::cat(&[&(bq * *scale)?, bk, bv], 0)?;
                Linear::new(weight, Some(bias)).forward(x)
            }
        }
    }
}

struct Layer {
    qkv: Qkv,
    out: Linear,
    norm1: LayerNorm,
    /// The intermediate projection's weight and bias, kept apart so the bias joins the GELU's pass.
    inter: (Tensor, Tensor),
    output: Linear,
    norm2: LayerNorm,
}

impl Bert {
    /// The inference model from a checkpoint.
    pub fn load(vb: VarBuilder, config: &Config) -> candle_core::Result<Bert> {
        Bert::build(encoder_root(vb, config), config, false)
    }

    /// The training model: every operation differentiable; `vb` is the encoder's root (`bert.`).
    pub fn trainable(vb: VarBuilder, config: &Config) -> candle_core::Result<Bert> {
        Bert::build(vb, config, true)
    }

    fn build(vb: VarBuilder, config: &Config, differentiable: bool) -> candle_core::Result<Bert> {
        let h = config.hidden_size;
        let (heads, head_dim) = (config.num_attention_heads, h / config.num_attention_heads);
        let embedding = |rows: usize, name: &str| candle_nn::embedding(rows, h, vb.pp("embeddings").pp(name));
        let norm = |vb: VarBuilder| candle_nn::layer_norm(h, config.layer_norm_eps, vb);
        let scale = 1.0 / (head_dim as f64).sqrt();
        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                let vb = vb.pp(format!("encoder.layer.{i}"));
                let attention = vb.pp("attention.self");
                let part = |name: &str| -> candle_core::Result<(Tensor, Tensor)> {
                    let vb = attention.pp(name);
                    Ok((vb.get((h, h), "weight")?, vb.get(h, "bias")?))
                };
                let (q, k, v) = (part("query")?, part("key")?, part("value")?);
                let qkv = if differentiable {
                    Qkv::Parts { weights: [q.0, k.0, v.0], biases: [q.1, k.1, v.1], scale }
                } else {
                    let weight = Tensor::cat(&[&(q.0 * scale)?, &k.0, &v.0], 0)?;
                    Qkv::Fused(Linear::new(weight, Some(Tensor::cat(&[&(q.1 * scale)?, &k.1, &v.1], 0)?)))
                };
                Ok(Layer {
                    qkv,
                    out: candle_nn::linear(h, h, vb.pp("attention.output.dense"))?,
                    norm1: norm(vb.pp("attention.output.LayerNorm"))?,
                    inter: {
                        let vb = vb.pp("intermediate.dense");
                        (vb.get((config.intermediate_size, h), "weight")?, vb.get(config.intermediate_size, "bias")?)
                    },
                    output: candle_nn::linear(config.intermediate_size, h, vb.pp("output.dense"))?,
                    norm2: norm(vb.pp("output.LayerNorm"))?,
                })
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Bert {
            word: embedding(config.vocab_size, "word_embeddings")?,
            position: embedding(config.max_position_embeddings, "position_embeddings")?,
            token_type: embedding(config.type_vocab_size, "token_type_embeddings")?,
            norm: norm(vb.pp("embeddings.LayerNorm"))?,
            layers,
            heads,
            head_dim,
            act: config.hidden_act,
            eps: config.layer_norm_eps,
            differentiable,
        })
    }

    /// Final hidden states `[batch, len, hidden]`; `mask` (`[batch, len]`, 1 for tokens, 0 for padding) is
    /// needed only when the batch has padding.
    pub fn forward(&self, ids: &Tensor, types: &Tensor, mask: Option<&Tensor>) -> candle_core::Result<Tensor> {
        let (batch, len) = ids.dims2()?;
        let positions = Tensor::arange(0u32, len as u32, ids.device())?;
        let x = (self.word.forward(ids)? + self.token_type.forward(types)?)?
            .broadcast_add(&self.position.forward(&positions)?)?;
        let mut x = self.normalize(&self.norm, &x)?;
        // Padding keys get the most negative value, so softmax gives them no weight: `[batch, 1, 1, len]`.
        let additive = match mask {
            Some(mask) => {
                let mask = mask.to_dtype(x.dtype())?;
                let min = Tensor::new(f32::MIN, x.device())?.to_dtype(x.dtype())?;
                Some((mask.ones_like()? - mask)?.broadcast_mul(&min)?.reshape((batch, 1, 1, len))?)
            }
            None => None,
        };
        for layer in &self.layers {
            x = self.layer(layer, &x, additive.as_ref())?;
        }
        Ok(x)
    }

    fn layer(&self, layer: &Layer, x: &Tensor, additive: Option<&Tensor>) -> candle_core::Result<Tensor> {
        let (batch, len, hidden) = x.dims3()?;
        let qkv =
            layer.qkv.forward(x)?.reshape((batch, len, 3, self.heads, self.head_dim))?.permute((2, 0, 3, 1, 4))?;
        let (q, k, v) = (qkv.get(0)?.contiguous()?, qkv.get(1)?.contiguous()?, qkv.get(2)?.contiguous()?);
        let scores = q.matmul(&k.t()?)?;
        let scores = match additive {
            Some(additive) => scores.broadcast_add(additive)?,
            None => scores,
        };
        let probs = if self.differentiable {
            candle_nn::ops::softmax(&scores, D::Minus1)?
        } else {
            candle_nn::ops::softmax_last_dim(&scores)?
        };
        let context = probs.matmul(&v)?.transpose(1, 2)?.contiguous()?.reshape((batch, len, hidden))?;
        let x = self.normalize(&layer.norm1, &(layer.out.forward(&context)? + x)?)?;
        let (weight, bias) = &layer.inter;
        let inner = x.matmul(&weight.broadcast_left(batch)?.t()?)?;
        let inner = match self.act {
            HiddenAct::Gelu if !self.differentiable => bias_gelu_erf(&inner, bias)?,
            HiddenAct::Gelu => inner.broadcast_add(bias)?.gelu_erf()?,
            HiddenAct::GeluApproximate => inner.broadcast_add(bias)?.gelu()?,
            HiddenAct::Relu => inner.broadcast_add(bias)?.relu()?,
        };
        self.normalize(&layer.norm2, &(layer.output.forward(&inner)? + x)?)
    }

    fn normalize(&self, norm: &LayerNorm, x: &Tensor) -> candle_core::Result<Tensor> {
        match (self.differentiable, norm.bias()) {
            (true, Some(bias)) => candle_nn::ops::layer_norm_slow(x, norm.weight(), bias, self.eps as f32),
            _ => norm.forward(x),
        }
    }
}

/// Checkpoints name the encoder `bert.*`, `{model_type}.*` (sequence classifiers) or nothing (bare models).
pub fn encoder_root<'a>(vb: VarBuilder<'a>, config: &Config) -> VarBuilder<'a> {
    let prefixes = ["bert".to_string(), config.model_type.clone().unwrap_or_default(), String::new()];
    prefixes
        .iter()
        .map(|p| if p.is_empty() { vb.clone() } else { vb.pp(p) })
        .find(|vb| vb.contains_tensor("embeddings.word_embeddings.weight"))
        .unwrap_or(vb)
}

/// The exact GELU of `x + bias` (bias along the last dimension), `y · Φ(y)`: on the CPU in f32 in one pass on
/// every core with a polynomial erf (absolute error under 1.5e-7), elsewhere candle's own ops.
fn bias_gelu_erf(x: &Tensor, bias: &Tensor) -> candle_core::Result<Tensor> {
    if x.device().is_cpu() && x.dtype() == DType::F32 {
        x.apply_op2_no_bwd(bias, &BiasGelu)
    } else {
        x.broadcast_add(bias)?.gelu_erf()
    }
}

struct BiasGelu;

impl CustomOp2 for BiasGelu {
    fn name(&self) -> &'static str {
        "bias-gelu-erf"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
        bias_storage: &CpuStorage,
        bias_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (Some((start, end)), Some((bias_start, bias_end))) =
            (layout.contiguous_offsets(), bias_layout.contiguous_offsets())
        else {
            candle_core::bail!("bias-gelu-erf needs contiguous tensors");
        };
        let input = &storage.as_slice::<f32>()?[start..end];
        let bias = &bias_storage.as_slice::<f32>()?[bias_start..bias_end];
        if layout.shape().dims().last() != Some(&bias.len()) {
            candle_core::bail!("bias-gelu-erf: a bias of {} for rows of {:?}", bias.len(), layout.shape());
        }
        let mut output = vec![0f32; input.len()];
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        // Whole rows per thread, so each chunk starts at bias[0].
        let rows_per_chunk = (input.len() / bias.len()).div_ceil(threads).max(1);
        let chunk = rows_per_chunk * bias.len();
        std::thread::scope(|scope| {
            for (inp, out) in input.chunks(chunk).zip(output.chunks_mut(chunk)) {
                scope.spawn(move || {
                    for (row_in, row_out) in inp.chunks(bias.len()).zip(out.chunks_mut(bias.len())) {
                        for ((o, &v), &b) in row_out.iter_mut().zip(row_in).zip(bias) {
                            let y = v + b;
                            *o = 0.5 * y * (1.0 + erf(y * std::f32::consts::FRAC_1_SQRT_2));
                        }
                    }
                });
            }
        });
        Ok((CpuStorage::F32(output), layout.shape().clone()))
    }
}

/// erf by Abramowitz and Stegun 7.1.26 (absolute error under 1.5e-7), branch-free so it vectorizes.
fn erf(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = t * (0.254_829_6 + t * (-0.284_496_74 + t * (1.421_413_7 + t * (-1.453_152_1 + t * 1.061_405_4))));
    (1.0 - poly * (-a * a).exp()).copysign(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fused_bias_gelu_matches_candles_exact_one() {
        let values: Vec<f32> = (0..20_000).map(|i| (i as f32 - 10_000.0) / 1_000.0).collect();
        let device = candle_core::Device::Cpu;
        let x = Tensor::new(values.as_slice(), &device).unwrap().reshape((2, 100, 100)).unwrap();
        let bias: Vec<f32> = (0..100).map(|i| (i as f32 - 50.0) / 25.0).collect();
        let bias = Tensor::new(bias.as_slice(), &device).unwrap();
        let ours = bias_gelu_erf(&x, &bias).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let exact =
            x.broadcast_add(&bias).unwrap().gelu_erf().unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let worst = ours.iter().zip(&exact).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst < 2e-6, "largest difference {worst}");
    }
}
