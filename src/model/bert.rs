//! Our BERT encoder for inference: the arithmetic of Hugging Face's `BertModel` (and candle-transformers'),
//! with fewer passes over memory. The query, key and value projections are one matrix product (the attention
//! scale folded into the query weights at load time); the mask is added only when the batch has padding;
//! softmax is our row kernel with a vectorized exp; the intermediate bias and the exact GELU are one pass on every core
//! with a polynomial erf. Weights load from the same checkpoints (`bert.`-prefixed or not), and those of the
//! families that differ from BERT only around these layers (`family`: RoBERTa and XLM-R, ELECTRA, DistilBERT).
//!
//! `Bert::quantize` turns the encoder's linear layers into int8 ones: on CPUs with AVX-512 VNNI our kernel
//! (one scale per weight row and per activation row, `int8.rs`); elsewhere GGML's Q8_0 blocks (32 weights
//! share a scale; each activation row is quantized the same way on the fly).
//!
//! For training, `Bert::trainable` builds the same model from differentiable operations only: candle-nn's
//! fused LayerNorm and softmax have no backward pass (LayerNorm's output is silently detached), so our fused
//! kernels with backward passes (`kernels.rs`) take their place, and the folded query scale would go stale
//! once the weights are updated.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Module, Tensor};
use candle_nn::{Embedding, LayerNorm, Linear, VarBuilder};
use candle_transformers::models::bert::{Config, HiddenAct};

use super::cpu::blas::{self, BlasLinear};
use super::cpu::disentangled::Disentangled;
use super::cpu::int8::{self, Int8Linear};
use super::cpu::kernels;
use super::dropout::{drop_probabilities, Dropout, Site};
use super::family::Family;
use super::relative::{self, Buckets, Tables};

pub struct Bert {
    word: Embedding,
    position: Embedding,
    /// The first position id (RoBERTa's start past the padding id).
    position_offset: u32,
    /// None for families without token types (DistilBERT).
    token_type: Option<Embedding>,
    norm: LayerNorm,
    /// ELECTRA's projection of embeddings narrower than the encoder, and its bias (through our products, so that
    /// a batch's rows are each their own product: candle's sums in an order that follows the batch's shape).
    project: Option<(Dense, Tensor)>,
    encoder: Encoder,
}

/// The final states a pass computes: every position's, or the first's alone (`[CLS]`, all that a head pooling
/// it reads). For the first alone, the last layer still projects every position's keys and values, but only
/// the first position attends, and the rest of the layer (output projection, feed-forward, norms) runs on that
/// one row, and its queries are projected there alone: its values are those of the full pass, for about 14 % less
/// arithmetic in a six-layer encoder at 128 tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Positions {
    All,
    First,
}

/// A stack of transformer layers over input vectors: BERT's encoder, or (Co-BERT) a few layers over other
/// representations.
pub struct Encoder {
    layers: Vec<Layer>,
    heads: usize,
    head_dim: usize,
    act: HiddenAct,
    eps: f64,
    differentiable: bool,
    /// DeBERTa's relative positions (each layer's `Tables`).
    buckets: Option<Buckets>,
    /// In training, DeBERTa's relative embeddings, projected by each layer on every pass (their variables
    /// change between passes); inference projects them once at load.
    relative: Option<RelativePositions>,
    /// A trainable model's (none in inference, nor in Co-BERT's heads).
    pub(super) dropout: Dropout,
}

/// A linear layer's product `x · Wᵀ`, without its bias (each layer adds that in the pass that follows): float
/// weights (candle's product), the same through BLAS (inference, when one is installed), or int8 blocks.
pub(super) enum Dense {
    /// A `Linear` without bias.
    Float(Linear),
    Blas(BlasLinear),
    /// int8 weights per output row, on CPUs with AVX-512 VNNI (`int8.rs`).
    Int8(Int8Linear),
    /// candle's Q8_0 elsewhere: `pad` zero columns make the inputs a whole number of 256-wide blocks (its
    /// tiled kernel takes only those, and otherwise falls back to dot products many times slower).
    Q8 {
        weight: QMatMul,
        pad: usize,
    },
}

/// Input widths of the int8 tiled kernel are multiples of this.
const INT8_BLOCK: usize = 256;

impl Dense {
    /// The product of `x` (`[batch, len, inputs]`), whose sequences hold `lengths` real positions each.
    pub(super) fn forward(&self, x: &Tensor, lengths: &[usize]) -> candle_core::Result<Tensor> {
        match self {
            Dense::Float(linear) => linear.forward(x),
            Dense::Blas(linear) => linear.forward(x, lengths),
            Dense::Int8(linear) => linear.forward(x),
            Dense::Q8 { weight, pad: 0 } => weight.forward(x),
            Dense::Q8 { weight, pad } => weight.forward(&x.pad_with_zeros(candle_core::D::Minus1, 0, *pad)?),
        }
    }

    /// The product by `weight` (`[outputs, inputs]`): through BLAS in inference when one is loaded and the
    /// weights are f32 on the CPU.
    pub(super) fn new(weight: Tensor, differentiable: bool) -> candle_core::Result<Dense> {
        if !differentiable && blas::available_for(&weight) {
            Ok(Dense::Blas(BlasLinear::new(&weight)?))
        } else {
            Ok(Dense::Float(Linear::new(weight, None)))
        }
    }

    /// The float weight (training's layers are built as `Float` and never quantized).
    fn float(&self) -> candle_core::Result<&Tensor> {
        match self {
            Dense::Float(linear) => Ok(linear.weight()),
            Dense::Blas(_) | Dense::Int8(_) | Dense::Q8 { .. } => candle_core::bail!("an inference layer in training"),
        }
    }

    /// Makes each of `layers` int8, on the CPU only (an architecture's projections).
    pub(super) fn quantize_all<'a>(
        layers: impl IntoIterator<Item = &'a mut Dense>,
        device: &candle_core::Device,
    ) -> candle_core::Result<()> {
        if !device.is_cpu() {
            candle_core::bail!("int8 layers run on the CPU only");
        }
        layers.into_iter().try_for_each(|dense| dense.quantize(device))
    }

    /// Makes the layer int8 (the VNNI kernel's per-row scales on a CPU that has it, else candle's Q8_0 blocks).
    fn quantize(&mut self, device: &candle_core::Device) -> candle_core::Result<()> {
        let weight = match self {
            Dense::Float(linear) => linear.weight().clone(),
            Dense::Blas(linear) => linear.weight(device)?,
            Dense::Int8(_) | Dense::Q8 { .. } => return Ok(()),
        };
        if device.is_cpu() && int8::available() {
            *self = Dense::Int8(Int8Linear::new(&weight)?);
            return Ok(());
        }
        let inputs = weight.dim(1)?;
        let pad = inputs.next_multiple_of(INT8_BLOCK) - inputs;
        let weight = QMatMul::from_qtensor(QTensor::quantize(&weight.pad_with_zeros(1, 0, pad)?, GgmlDType::Q8_0)?)?;
        *self = Dense::Q8 { weight, pad };
        Ok(())
    }
}

/// The query, key and value projections as one `[3h, h]` product.
enum Qkv {
    /// Concatenated at load time, the attention scale folded into the query rows (inference). The bias stays
    /// apart: `blas::attention` applies it without a pass over the projection.
    Fused { dense: Dense, bias: Tensor },
    /// The variables as they are, concatenated and scaled on every pass (training).
    Parts { weights: [Tensor; 3], biases: [Tensor; 3], scale: f64 },
}

impl Qkv {
    /// The projection; with `first`, the queries are read at each sequence's first position alone.
    fn forward(&self, x: &Tensor, lengths: &[usize], first: bool) -> candle_core::Result<Tensor> {
        match self {
            Qkv::Fused { dense: Dense::Blas(linear), .. } if first => {
                linear.forward_first_alone(x, lengths, linear.outputs() / 3)
            }
            Qkv::Fused { dense, .. } => dense.forward(x, lengths),
            Qkv::Parts { weights: [wq, wk, wv], biases: [bq, bk, bv], scale } => {
                let weight = Tensor::cat(&[&(wq * *scale)?, wk, wv], 0)?;
                let bias = Tensor::cat(&[&(bq * *scale)?, bk, bv], 0)?;
                affine(x, &weight, Some(&bias))
            }
        }
    }

    /// The bias that `forward` left out.
    fn bias(&self) -> Option<&Tensor> {
        match self {
            Qkv::Fused { bias, .. } => Some(bias),
            Qkv::Parts { .. } => None,
        }
    }
}

/// The projections after attention are kept without their biases, each added in the pass that follows (the
/// GELU's, or residual + LayerNorm's) instead of in a pass of its own.
struct Layer {
    qkv: Qkv,
    out: (Dense, Tensor),
    norm1: LayerNorm,
    inter: (Dense, Tensor),
    output: (Dense, Tensor),
    norm2: LayerNorm,
    /// DeBERTa's: the relative embeddings through this layer's projections.
    relative: Option<Tables>,
}

impl Bert {
    /// The inference model from a checkpoint.
    pub fn load(vb: VarBuilder, config: &Config) -> candle_core::Result<Bert> {
        Bert::build(encoder_root(vb, config), config, false)
    }

    /// The training model: every operation differentiable; `vb` is the encoder's root (`bert.`).
    pub fn trainable(vb: VarBuilder, config: &Config, dropout: Dropout) -> candle_core::Result<Bert> {
        let mut bert = Bert::build(vb, config, true)?;
        bert.encoder.dropout = dropout;
        Ok(bert)
    }

    fn build(vb: VarBuilder, config: &Config, differentiable: bool) -> candle_core::Result<Bert> {
        let h = config.hidden_size;
        let family = Family::from_config(config);
        // ELECTRA's embeddings may be narrower than the encoder: their width is the word embeddings'.
        let width = match family {
            Family::Electra => vb.get_unchecked("embeddings.word_embeddings.weight")?.dim(1)?,
            _ => h,
        };
        let embedding = |rows: usize, name: &str| candle_nn::embedding(rows, width, vb.pp("embeddings").pp(name));
        let token_type = match config.type_vocab_size {
            0 => None,
            types => Some(embedding(types, "token_type_embeddings")?),
        };
        let project = (width != h)
            .then(|| -> candle_core::Result<(Dense, Tensor)> {
                let vb = vb.pp("embeddings_project");
                Ok((Dense::new(vb.get((h, width), "weight")?, differentiable)?, vb.get(h, "bias")?))
            })
            .transpose()?;
        Ok(Bert {
            word: embedding(config.vocab_size, "word_embeddings")?,
            position: embedding(config.max_position_embeddings, "position_embeddings")?,
            position_offset: family.position_offset(config) as u32,
            token_type,
            norm: candle_nn::layer_norm(width, config.layer_norm_eps, vb.pp("embeddings.LayerNorm"))?,
            project,
            encoder: Encoder::load(vb.pp("encoder"), config, config.num_hidden_layers, differentiable)?,
        })
    }

    /// Makes every linear layer of the encoder int8 (inference models only).
    pub fn quantize(&mut self) -> candle_core::Result<()> {
        self.encoder.quantize(self.word.embeddings().device())
    }

    /// Whether inputs must be computed one at a time for their states not to depend on what they are batched
    /// with: on the CPU without BLAS. The BLAS path (attention per sequence, products split by rows, each row
    /// summed in one order) is exact in any batch; candle's own products sum in an order that follows the
    /// batch's shape (their blocking follows the dimensions), so the last bits differ. A GPU keeps its batches:
    /// there speed is the point, and scores agree to its dtype's precision.
    pub fn computes_alone(&self) -> bool {
        let embeddings = self.word.embeddings();
        embeddings.device().is_cpu() && !blas::available_for(embeddings)
    }

    /// Final hidden states `[batch, len, hidden]` (`[batch, 1, hidden]` for the first position alone); `mask`
    /// (`[batch, len]`, 1 for tokens, 0 for padding) is needed only when the batch has padding.
    pub fn forward(
        &self,
        ids: &Tensor,
        types: &Tensor,
        mask: Option<&Tensor>,
        positions: Positions,
    ) -> candle_core::Result<Tensor> {
        let len = ids.dim(1)? as u32;
        // Right-padded inputs: the real positions count from the offset (padding positions are masked).
        let position_ids = Tensor::arange(self.position_offset, self.position_offset + len, ids.device())?;
        let x = token_embeddings(&self.word, self.token_type.as_ref(), ids, types)?;
        let x = self.encoder.normalize(&self.norm, &x.broadcast_add(&self.position.forward(&position_ids)?)?)?;
        let x = self.encoder.dropout.apply(Site::Embeddings, &x)?;
        let x = match &self.project {
            Some((dense, bias)) => dense.forward(&x, &vec![len as usize; x.dim(0)?])?.broadcast_add(bias)?,
            None => x,
        };
        self.encoder.forward(&x, mask, positions)
    }
}

/// DeBERTa's relative positions for `Encoder::disentangled`: the buckets of distances, and the relative
/// embeddings (normalized) that the layers project.
pub(super) struct RelativePositions {
    pub(super) buckets: Buckets,
    /// The relative embeddings' rows that distances reach, and the LayerNorm they go through (if any).
    pub(super) rows: Tensor,
    pub(super) norm: Option<LayerNorm>,
}

/// Word embeddings of `ids`, plus their token types' where the model has them.
pub(super) fn token_embeddings(
    word: &Embedding,
    token_type: Option<&Embedding>,
    ids: &Tensor,
    types: &Tensor,
) -> candle_core::Result<Tensor> {
    let x = word.forward(ids)?;
    match token_type {
        Some(token_type) => x + token_type.forward(types)?,
        None => Ok(x),
    }
}

impl Encoder {
    /// `count` layers `layer.0` … under `vb` (an encoder root), shaped by `config`.
    pub fn load(vb: VarBuilder, config: &Config, count: usize, differentiable: bool) -> candle_core::Result<Encoder> {
        Encoder::build(vb, config, count, differentiable, None)
    }

    /// DeBERTa's encoder (inference): BERT's layers whose attention scores add content to position and position
    /// to content (`relative`), scaled by 1/√(3 · head_dim) as transformers scales all three.
    pub(super) fn disentangled(
        vb: VarBuilder,
        config: &Config,
        positions: RelativePositions,
        differentiable: bool,
    ) -> candle_core::Result<Encoder> {
        Encoder::build(vb, config, config.num_hidden_layers, differentiable, Some(positions))
    }

    fn build(
        vb: VarBuilder,
        config: &Config,
        count: usize,
        differentiable: bool,
        relative: Option<RelativePositions>,
    ) -> candle_core::Result<Encoder> {
        let h = config.hidden_size;
        let (heads, head_dim) = (config.num_attention_heads, h / config.num_attention_heads);
        let norm = |vb: VarBuilder| candle_nn::layer_norm(h, config.layer_norm_eps, vb);
        let terms = if relative.is_some() { 3.0 } else { 1.0 };
        let scale = 1.0 / (head_dim as f64 * terms).sqrt();
        let layers = (0..count)
            .map(|i| {
                let vb = vb.pp(format!("layer.{i}"));
                let attention = vb.pp("attention.self");
                let part = |name: &str| -> candle_core::Result<(Tensor, Tensor)> {
                    let vb = attention.pp(name);
                    Ok((vb.get((h, h), "weight")?, vb.get(h, "bias")?))
                };
                let (q, k, v) = (part("query")?, part("key")?, part("value")?);
                let (qkv, tables) = if differentiable {
                    (Qkv::Parts { weights: [q.0, k.0, v.0], biases: [q.1, k.1, v.1], scale }, None)
                } else {
                    let weight = Tensor::cat(&[&(q.0 * scale)?, &k.0, &v.0], 0)?;
                    let bias = Tensor::cat(&[&(q.1 * scale)?, &k.1, &v.1], 0)?;
                    // The relative embeddings through the same projections as the contents.
                    let tables = relative.as_ref().map(|r| {
                        let embeddings = match &r.norm {
                            Some(norm) => norm.forward(&r.rows)?,
                            None => r.rows.clone(),
                        };
                        Tables::new(&embeddings.matmul(&weight.t()?)?.broadcast_add(&bias)?, heads)
                    });
                    (Qkv::Fused { dense: Dense::new(weight, false)?, bias }, tables.transpose()?)
                };
                // A projection without its bias, and the bias.
                let split = |name: &str, (outputs, inputs): (usize, usize)| -> candle_core::Result<(Dense, Tensor)> {
                    let vb = vb.pp(name);
                    Ok((Dense::new(vb.get((outputs, inputs), "weight")?, differentiable)?, vb.get(outputs, "bias")?))
                };
                let inner = config.intermediate_size;
                Ok(Layer {
                    qkv,
                    out: split("attention.output.dense", (h, h))?,
                    norm1: norm(vb.pp("attention.output.LayerNorm"))?,
                    inter: split("intermediate.dense", (inner, h))?,
                    output: split("output.dense", (h, inner))?,
                    norm2: norm(vb.pp("output.LayerNorm"))?,
                    relative: tables,
                })
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Encoder {
            layers,
            heads,
            head_dim,
            act: config.hidden_act,
            eps: config.layer_norm_eps,
            differentiable,
            buckets: relative.as_ref().map(|r| r.buckets),
            relative: relative.filter(|_| differentiable),
            dropout: Dropout::default(),
        })
    }

    /// DeBERTa's relative positions on each side of a token (none for other encoders).
    pub(super) fn span(&self) -> usize {
        self.buckets.map_or(0, |b| b.span)
    }

    /// Makes every linear layer int8 (inference encoders only, on the CPU).
    pub(super) fn quantize(&mut self, device: &candle_core::Device) -> candle_core::Result<()> {
        if self.differentiable {
            candle_core::bail!("a training model stays in floating point");
        }
        if !device.is_cpu() {
            candle_core::bail!("int8 layers run on the CPU only");
        }
        for layer in &mut self.layers {
            if let Qkv::Fused { dense, .. } = &mut layer.qkv {
                dense.quantize(device)?;
            }
            for dense in [&mut layer.out.0, &mut layer.inter.0, &mut layer.output.0] {
                dense.quantize(device)?;
            }
        }
        Ok(())
    }

    /// The final states of `x` (`[batch, len, hidden]`), of `positions` (`[batch, 1, hidden]` for the first
    /// alone); `mask` (`[batch, len]`, 1 for positions, 0 for padding) only when the batch has padding.
    pub fn forward(&self, x: &Tensor, mask: Option<&Tensor>, positions: Positions) -> candle_core::Result<Tensor> {
        let (batch, len, _) = x.dims3()?;
        // Padding keys get the most negative value, so softmax gives them no weight: `[batch, 1, 1, len]`.
        let additive = match mask {
            Some(mask) => {
                let mask = mask.to_dtype(x.dtype())?;
                let min = Tensor::new(f32::MIN, x.device())?.to_dtype(x.dtype())?;
                Some((mask.ones_like()? - mask)?.broadcast_mul(&min)?.reshape((batch, 1, 1, len))?)
            }
            None => None,
        };
        // The same mask as `[batch, len]` rows for the fused attention op, built once for every layer.
        let rows = match &additive {
            Some(additive) => additive.reshape((batch, len))?,
            None => Tensor::zeros((batch, len), x.dtype(), x.device())?,
        };
        let lengths = match mask {
            Some(mask) => {
                mask.to_dtype(DType::F32)?.sum(1)?.to_vec1::<f32>()?.into_iter().map(|l| l as usize).collect()
            }
            None => vec![len; batch],
        };
        // DeBERTa's distances' rows and the keys each sequence has, once for every layer; in training its
        // relative embeddings, normalized on this pass.
        let relative = self.buckets.map(|b| Disentangled { rows: b.rows(len), lengths: lengths.clone() });
        let embeddings = match &self.relative {
            Some(r) => Some(match &r.norm {
                Some(norm) => self.normalize(norm, &r.rows)?,
                None => r.rows.clone(),
            }),
            None => None,
        };
        let mut x = x.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            let first = positions == Positions::First && i + 1 == self.layers.len();
            let masks = (additive.as_ref(), &rows, relative.as_ref(), embeddings.as_ref());
            x = self.layer(layer, &x, masks, &lengths, first)?;
        }
        Ok(x)
    }

    fn layer(
        &self,
        layer: &Layer,
        x: &Tensor,
        (additive, rows, relative, embeddings): (Option<&Tensor>, &Tensor, Option<&Disentangled>, Option<&Tensor>),
        lengths: &[usize],
        first: bool,
    ) -> candle_core::Result<Tensor> {
        let (batch, len, hidden) = x.dims3()?;
        let qkv = layer.qkv.forward(x, lengths, first)?;
        // From here on, with `first`, the first position's row alone.
        let (x, lengths) = match first {
            true => (&x.narrow(1, 0, len.min(1))?.contiguous()?, &vec![len.min(1); batch][..]),
            false => (x, lengths),
        };
        let projected = match (&layer.qkv, embeddings) {
            (Qkv::Parts { weights, biases, scale }, Some(embeddings)) => {
                let part = |i: usize| embeddings.matmul(&weights[i].t()?)?.broadcast_add(&biases[i]);
                Some(Tables::new(&Tensor::cat(&[&(part(0)? * *scale)?, &part(1)?, &part(2)?], 1)?, self.heads)?)
            }
            _ => None,
        };
        if let (Some(tables), Some(relative)) = (layer.relative.as_ref().or(projected.as_ref()), relative) {
            let (q, k, v) = self.heads_of(layer, qkv, first)?;
            let context = relative::attention(&q, &k, &v, tables, relative, self.dropout.attention())?;
            return self.feed_forward(layer, x, &context, lengths);
        }
        // With BLAS loaded, one fused op (with its backward pass in training); else candle's chain. Either drops
        // the same probabilities in training.
        let (bias, dropout) = (layer.qkv.bias(), self.dropout.attention());
        let heads = blas::Heads::plain(self.heads);
        if let Some(context) = blas::attention(&qkv, rows, bias, &heads, self.differentiable, first, dropout)? {
            return self.feed_forward(layer, x, &context, lengths);
        }
        let (q, k, v) = self.heads_of(layer, qkv, first)?;
        let scores = q.matmul(&k.t()?)?;
        let scores = match additive {
            Some(additive) => scores.broadcast_add(additive)?,
            None => scores,
        };
        let probs = drop_probabilities(dropout, kernels::softmax(&scores)?, (0, 0))?;
        let context = probs.matmul(&v)?.transpose(1, 2)?.contiguous()?.reshape((batch, q.dim(2)?, hidden))?;
        self.feed_forward(layer, x, &context, lengths)
    }

    /// Queries, keys and values `[batch, heads, len, head_dim]` of a projection `qkv` without its bias (the
    /// queries at the first position alone with `first`).
    fn heads_of(&self, layer: &Layer, qkv: Tensor, first: bool) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
        let (batch, len, _) = qkv.dims3()?;
        let qkv = match layer.qkv.bias() {
            Some(bias) => qkv.broadcast_add(bias)?,
            None => qkv,
        };
        let qkv = qkv.reshape((batch, len, 3, self.heads, self.head_dim))?.permute((2, 0, 3, 1, 4))?;
        let (q, k, v) = (qkv.get(0)?, qkv.get(1)?.contiguous()?, qkv.get(2)?.contiguous()?);
        let q = if first { q.narrow(2, 0, len.min(1))? } else { q }.contiguous()?;
        Ok((q, k, v))
    }

    /// The rest of a layer after attention: output projection, residual and LayerNorm, then the feed-forward
    /// block with its own.
    fn feed_forward(
        &self,
        layer: &Layer,
        x: &Tensor,
        context: &Tensor,
        lengths: &[usize],
    ) -> candle_core::Result<Tensor> {
        let out = self.linear(context, &layer.out.0, lengths)?;
        let x = self.add_norm(&layer.norm1, out, (&layer.out.1, Site::AttentionOutput), x)?;
        let (weight, bias) = &layer.inter;
        let inner = match (self.act, weight) {
            (HiddenAct::Gelu, Dense::Blas(linear)) => linear.forward_bias_gelu(&x, lengths, bias)?,
            (act, _) => {
                let inner = self.linear(&x, weight, lengths)?;
                match act {
                    HiddenAct::Gelu if self.differentiable => kernels::bias_gelu(&inner, bias)?,
                    HiddenAct::Gelu => kernels::bias_gelu_in_place(inner, bias)?,
                    HiddenAct::GeluApproximate => inner.broadcast_add(bias)?.gelu()?,
                    HiddenAct::Relu => inner.broadcast_add(bias)?.relu()?,
                }
            }
        };
        self.add_norm(
            &layer.norm2,
            self.linear(&inner, &layer.output.0, lengths)?,
            (&layer.output.1, Site::FeedForward),
            &x,
        )
    }

    /// `LayerNorm(y + bias + residual)` of a projection `y` without its bias (in training, `y + bias` dropped at
    /// `site`); in inference written over `y`, which the projection has just made.
    fn add_norm(
        &self,
        norm: &LayerNorm,
        y: Tensor,
        (bias, site): (&Tensor, Site),
        residual: &Tensor,
    ) -> candle_core::Result<Tensor> {
        if self.differentiable {
            self.normalize(norm, &(self.dropout.apply(site, &y.broadcast_add(bias)?)? + residual)?)
        } else {
            kernels::add_layer_norm_in_place(y, bias, residual, norm, self.eps)
        }
    }

    /// Inference keeps candle-nn's product with the weight broadcast over the batch (a few % faster here);
    /// training takes one product over all rows.
    fn linear(&self, x: &Tensor, dense: &Dense, lengths: &[usize]) -> candle_core::Result<Tensor> {
        if self.differentiable {
            affine(x, dense.float()?, None)
        } else {
            dense.forward(x, lengths)
        }
    }

    pub fn normalize(&self, norm: &LayerNorm, x: &Tensor) -> candle_core::Result<Tensor> {
        match (self.differentiable, norm.bias()) {
            (true, Some(bias)) => kernels::layer_norm(x, norm.weight(), bias, self.eps),
            _ => norm.forward(x),
        }
    }
}

/// `x · Wᵀ + b` over the last dimension as one matrix product of all rows: the weight's gradient is then one
/// product too, where a weight broadcast over the batch (candle-nn's `Linear`) gets a gradient per batch
/// element, summed after.
fn affine(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> candle_core::Result<Tensor> {
    let mut dims = x.dims().to_vec();
    let inputs = dims.pop().unwrap_or(1);
    let rows = x.elem_count() / inputs.max(1);
    let x = x.reshape((rows, inputs))?;
    let y = match blas::matmul_t(&x, weight)? {
        Some(y) => y,
        None => x.matmul(&weight.t()?)?,
    };
    let y = match bias {
        Some(bias) => y.broadcast_add(bias)?,
        None => y,
    };
    dims.push(weight.dim(0)?);
    y.reshape(dims)
}

/// Checkpoints name the encoder after its family (`bert.*`, `roberta.*`, …: sequence classifiers) or not at all
/// (bare models); its weights are read under BERT's names.
pub fn encoder_root<'a>(vb: VarBuilder<'a>, config: &Config) -> VarBuilder<'a> {
    let family = Family::from_config(config);
    let vb = family.bert_names(vb);
    [family.prefix(), ""]
        .iter()
        .map(|p| if p.is_empty() { vb.clone() } else { vb.pp(p) })
        .find(|vb| vb.contains_tensor("embeddings.word_embeddings.weight"))
        .unwrap_or(vb)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use candle_nn::VarMap;

    /// The fused projection with the queries at the first position alone reads the keys and values at every
    /// position: the queries are the first third of its outputs, whatever the width of its inputs (here two of
    /// the packed kernel's panels of queries over inputs three panels wide).
    #[test]
    fn a_first_alone_projection_reads_keys_and_values_everywhere() {
        let (queries, inputs, len) = (96, 144, 5);
        let value = |i: usize| (((i * 7919) % 2003) as f32 - 1001.0) / 997.0;
        let weight =
            Tensor::from_vec((0..3 * queries * inputs).map(value).collect(), (3 * queries, inputs), &Device::Cpu);
        let dense = Dense::new(weight.unwrap(), false).unwrap();
        if !matches!(dense, Dense::Blas(_)) {
            return; // Only BLAS products read the first position alone (CI runs every test through them).
        }
        let qkv = Qkv::Fused { dense, bias: Tensor::zeros(3 * queries, DType::F32, &Device::Cpu).unwrap() };
        let x = Tensor::from_vec((0..len * inputs).map(|i| value(i + 11)).collect(), (1, len, inputs), &Device::Cpu);
        let x = x.unwrap();
        let all = qkv.forward(&x, &[len], false).unwrap().narrow(2, queries, 2 * queries).unwrap();
        let first = qkv.forward(&x, &[len], true).unwrap().narrow(2, queries, 2 * queries).unwrap();
        let diff = (all - first).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap();
        assert_eq!(diff.to_scalar::<f32>().unwrap(), 0.0);
    }

    /// A random BERT of two layers (queries two whole panels of the packed kernels, which the last layer skips
    /// past the first position; the intermediate layer's second panel part full), built a second time over
    /// the drawn values, since inference layers copy their fused weights.
    fn tiny() -> Bert {
        let config: Config = serde_json::from_value(serde_json::json!({
            "vocab_size": 30, "hidden_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 88, "hidden_act": "gelu", "max_position_embeddings": 16, "type_vocab_size": 2,
            "layer_norm_eps": 1e-12, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
            "initializer_range": 0.02, "pad_token_id": 0, "model_type": "bert"
        }))
        .unwrap();
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        Bert::load(vb.clone(), &config).unwrap();
        let mut data: Vec<(String, candle_core::Var)> = varmap.data().lock().unwrap().clone().into_iter().collect();
        data.sort_by(|a, b| a.0.cmp(&b.0));
        let mut rng = crate::rng::Rng::new(7);
        for (_, var) in &data {
            let values: Vec<f32> = (0..var.elem_count()).map(|_| (rng.normal() * 0.5) as f32).collect();
            var.set(&Tensor::from_vec(values, var.dims(), &Device::Cpu).unwrap()).unwrap();
        }
        Bert::load(vb, &config).unwrap()
    }

    /// The first position alone has the states of the whole pass's first row, in a batch with padding.
    #[test]
    fn the_first_position_alone_has_the_whole_passs_first_states() {
        let bert = tiny();
        let ids = Tensor::new(&[[2u32, 5, 9, 11, 3, 17, 4], [2, 21, 8, 3, 0, 0, 0]], &Device::Cpu).unwrap();
        let types = Tensor::new(&[[0u32, 0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 0, 0, 0]], &Device::Cpu).unwrap();
        let mask = Tensor::new(&[[1u32, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0]], &Device::Cpu).unwrap();
        let all = bert.forward(&ids, &types, Some(&mask), Positions::All).unwrap();
        let first = bert.forward(&ids, &types, Some(&mask), Positions::First).unwrap();
        assert_eq!(first.dims(), [2, 1, 96]);
        let want = all.narrow(1, 0, 1).unwrap();
        let worst = (first - want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(worst < 1e-5, "{worst}");
    }
}
