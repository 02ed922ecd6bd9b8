//! Causal decoders read as rerankers: Qwen2, Qwen3 and Gemma, our forward over transformers' weights and layout
//! (candle-transformers' are generation bodies: a KV cache behind `&mut self`, no padding mask). Pre-norm layers:
//! RMSNorm, grouped-query attention with rotary positions (Qwen3 normalizes each head's queries and keys; Qwen2
//! adds biases to the projections), a gated feed-forward (SiLU; Gemma's tanh GELU); Gemma scales the embeddings
//! by √hidden and its norms by 1 + weight. Inputs are right-padded: under the causal mask a real token never
//! reads the padding after it, so a pair's states are those it has alone, whatever its batch, and rotary
//! positions count from 0 as in the reference's left-padded batch (a shift that rotary attention cancels).

use std::path::Path;
use std::sync::{Arc, Mutex};

use candle_core::{Device, IndexOp, Module, Tensor, D};
use candle_nn::{Embedding, VarBuilder};
use serde::Deserialize;

use super::bert::{Dense, Positions};
use super::cpu::kernels;
use super::error::load_err;
use super::family::Family;
use super::load::read_json;
use super::network::{Inputs, Network};
use super::ModelError;

/// What `config.json` says of a decoder's layers.
#[derive(Deserialize)]
struct Config {
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: f64,
    rope_theta: Option<f64>,
    /// transformers 5 writes the rotary base here.
    rope_parameters: Option<serde_json::Value>,
    rope_scaling: Option<serde_json::Value>,
    hidden_act: Option<String>,
    /// Gemma's name for it.
    hidden_activation: Option<String>,
    #[serde(default)]
    use_sliding_window: bool,
    #[serde(default)]
    attention_bias: bool,
}

#[derive(Debug, Clone, Copy)]
enum Activation {
    Silu,
    /// GELU's tanh approximation (`gelu_pytorch_tanh`).
    GeluTanh,
    Gelu,
}

struct RmsNorm {
    /// The scale as the family applies it (Gemma's 1 + weight folded in at load).
    alpha: Tensor,
    eps: f32,
}

impl RmsNorm {
    fn load(vb: VarBuilder, width: usize, eps: f64, family: Family) -> candle_core::Result<RmsNorm> {
        let weight = vb.get(width, "weight")?;
        let alpha = match family {
            Family::Gemma => (weight + 1.0)?,
            _ => weight,
        };
        Ok(RmsNorm { alpha, eps: eps as f32 })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        candle_nn::ops::rms_norm(&x.contiguous()?, &self.alpha, self.eps)
    }
}

struct Layer {
    input_norm: RmsNorm,
    /// The query, key and value projections as one product, and their biases (Qwen2's).
    qkv: Dense,
    qkv_bias: Option<Tensor>,
    /// Qwen3's per-head norms of queries and keys.
    head_norms: Option<(RmsNorm, RmsNorm)>,
    out: Dense,
    post_norm: RmsNorm,
    /// The gate and up projections as one product.
    gate_up: Dense,
    down: Dense,
}

pub struct Decoder {
    embed: Embedding,
    /// Gemma's √hidden.
    embed_scale: Option<f64>,
    layers: Vec<Layer>,
    norm: RmsNorm,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    hidden: usize,
    intermediate: usize,
    rope_theta: f64,
    activation: Activation,
    /// The shared prefixes computed last (newest last), by their token ids.
    prefixes: Mutex<Vec<(Vec<u32>, Arc<Prefix>)>>,
}

/// A prompt's shared prefix (`Encoded::shared_prefix`: the query side, the same for every segment of a query)
/// through every layer: each layer's keys and values `[1, kv_heads, p, head_dim]`, normalized and rotated.
type Prefix = Vec<(Tensor, Tensor)>;

/// Shared prefixes kept (a few queries' worth: the 0.6B model's prefix of 60 tokens takes 14 MB).
const PREFIXES_KEPT: usize = 4;

impl Decoder {
    /// The decoder under `vb` (a causal LM's or a converted sequence classifier's root, `model.*`, or a bare
    /// model's) of the configuration in `dir`; options it does not compute (rotary scaling, sliding windows) are
    /// refused rather than ignored.
    pub fn load(vb: VarBuilder, family: Family, dir: &Path) -> Result<Decoder, ModelError> {
        let path = dir.join("config.json");
        let c: Config = read_json(&path)?;
        let refuse = |what: &str| Err(load_err(&path, format!("a {family:?} decoder with {what} is not supported")));
        let rope = c.rope_parameters.as_ref().or(c.rope_scaling.as_ref());
        if rope.and_then(|r| r.get("rope_type").or_else(|| r.get("type"))).is_some_and(|t| t != "default") {
            return refuse("a rope_type other than default");
        }
        if c.use_sliding_window {
            return refuse("use_sliding_window");
        }
        if c.attention_bias {
            return refuse("attention_bias");
        }
        // transformers reads Gemma's `hidden_activation` (unset: the tanh approximation, whatever `hidden_act`
        // says), Qwen's `hidden_act`.
        let activation = match family {
            Family::Gemma => c.hidden_activation.as_deref().unwrap_or("gelu_pytorch_tanh"),
            _ => c.hidden_act.as_deref().unwrap_or("silu"),
        };
        let activation = match activation {
            "silu" => Activation::Silu,
            "gelu_pytorch_tanh" => Activation::GeluTanh,
            "gelu" => Activation::Gelu,
            other => return refuse(&format!("the activation {other:?}")),
        };
        let rope_theta =
            c.rope_theta.or_else(|| c.rope_parameters.as_ref()?.get("rope_theta")?.as_f64()).unwrap_or(10_000.0);
        let (h, heads) = (c.hidden_size, c.num_attention_heads);
        let kv_heads = c.num_key_value_heads.unwrap_or(heads);
        let head_dim = c.head_dim.unwrap_or(h / heads);
        let vb = match vb.contains_tensor("model.embed_tokens.weight") {
            true => vb.pp("model"),
            false => vb,
        };
        let build = || -> candle_core::Result<Decoder> {
            let embed = vb.get_unchecked("embed_tokens.weight")?;
            if embed.dim(1)? != h {
                candle_core::bail!("embed_tokens.weight is {:?} wide, not hidden_size {h}", embed.dim(1)?);
            }
            let embed = Embedding::new(embed, h);
            let (q, kv) = (heads * head_dim, kv_heads * head_dim);
            let layers = (0..c.num_hidden_layers)
                .map(|i| {
                    let vb = vb.pp(format!("layers.{i}"));
                    let (attn, mlp) = (vb.pp("self_attn"), vb.pp("mlp"));
                    // Attention's 1/√head_dim is folded into the queries: into Qwen3's query norm (which would
                    // undo it in the projection), else into the query rows and bias.
                    let scale = 1.0 / (head_dim as f64).sqrt();
                    let query_scale = if family == Family::Qwen3 { 1.0 } else { scale };
                    let qkv = Tensor::cat(
                        &[
                            (attn.get((q, h), "q_proj.weight")? * query_scale)?,
                            attn.get((kv, h), "k_proj.weight")?,
                            attn.get((kv, h), "v_proj.weight")?,
                        ],
                        0,
                    )?;
                    let qkv_bias = (family == Family::Qwen2)
                        .then(|| {
                            let bias = [
                                (attn.get(q, "q_proj.bias")? * query_scale)?,
                                attn.get(kv, "k_proj.bias")?,
                                attn.get(kv, "v_proj.bias")?,
                            ];
                            Tensor::cat(&bias, 0)
                        })
                        .transpose()?;
                    let head_norms = (family == Family::Qwen3)
                        .then(|| {
                            let norm = |name| RmsNorm::load(attn.pp(name), head_dim, c.rms_norm_eps, family);
                            let mut q_norm = norm("q_norm")?;
                            q_norm.alpha = (q_norm.alpha * scale)?;
                            Ok::<_, candle_core::Error>((q_norm, norm("k_norm")?))
                        })
                        .transpose()?;
                    let i = c.intermediate_size;
                    let gate_up =
                        Tensor::cat(&[mlp.get((i, h), "gate_proj.weight")?, mlp.get((i, h), "up_proj.weight")?], 0)?;
                    Ok(Layer {
                        input_norm: RmsNorm::load(vb.pp("input_layernorm"), h, c.rms_norm_eps, family)?,
                        qkv: Dense::new(qkv, false)?,
                        qkv_bias,
                        head_norms,
                        out: Dense::new(attn.get((h, q), "o_proj.weight")?, false)?,
                        post_norm: RmsNorm::load(vb.pp("post_attention_layernorm"), h, c.rms_norm_eps, family)?,
                        gate_up: Dense::new(gate_up, false)?,
                        down: Dense::new(mlp.get((h, i), "down_proj.weight")?, false)?,
                    })
                })
                .collect::<candle_core::Result<Vec<_>>>()?;
            Ok(Decoder {
                embed,
                embed_scale: (family == Family::Gemma).then(|| (h as f64).sqrt()),
                layers,
                norm: RmsNorm::load(vb.pp("norm"), h, c.rms_norm_eps, family)?,
                heads,
                kv_heads,
                head_dim,
                hidden: h,
                intermediate: c.intermediate_size,
                rope_theta,
                activation,
                prefixes: Mutex::new(Vec::new()),
            })
        };
        build().map_err(|e| load_err(dir, format!("loading {family:?} weights: {e}")))
    }

    /// Attention's output for `x`, whose positions follow `past`'s keys and values (a shared prefix's; its
    /// rows are positions `past..` of `rotary`), and the keys and values of every position so far.
    fn attention(
        &self,
        layer: &Layer,
        x: &Tensor,
        lengths: &[usize],
        rotary: &(Tensor, Tensor),
        past: Option<&(Tensor, Tensor)>,
    ) -> candle_core::Result<(Tensor, (Tensor, Tensor))> {
        let (b, len, _) = x.dims3()?;
        let offset = past.map_or(Ok(0), |(k, _)| k.dim(2))?;
        let (d, q_width, kv_width) = (self.head_dim, self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let mut qkv = layer.qkv.forward(x, lengths)?;
        if let Some(bias) = &layer.qkv_bias {
            qkv = qkv.broadcast_add(bias)?;
        }
        let q = qkv.narrow(D::Minus1, 0, q_width)?.reshape((b, len, self.heads, d))?;
        let k = qkv.narrow(D::Minus1, q_width, kv_width)?.reshape((b, len, self.kv_heads, d))?;
        let v = qkv.narrow(D::Minus1, q_width + kv_width, kv_width)?.reshape((b, len, self.kv_heads, d))?;
        let (q, k) = match &layer.head_norms {
            Some((q_norm, k_norm)) => (q_norm.forward(&q)?, k_norm.forward(&k)?),
            None => (q, k),
        };
        let (cos, sin) = (rotary.0.narrow(0, offset, len)?, rotary.1.narrow(0, offset, len)?);
        let q = candle_nn::rotary_emb::rope(&q.transpose(1, 2)?.contiguous()?, &cos, &sin)?;
        let k = candle_nn::rotary_emb::rope(&k.transpose(1, 2)?.contiguous()?, &cos, &sin)?;
        let v = v.transpose(1, 2)?.contiguous()?;
        let (k, v) = match past {
            Some((past_k, past_v)) => (Tensor::cat(&[past_k, &k], 2)?, Tensor::cat(&[past_v, &v], 2)?),
            None => (k, v),
        };
        // Each key and value head serves `group` query heads, next to each other: the query heads of one key
        // head are taken as one matrix of `group` blocks of rows, so keys and values are never repeated.
        let group = self.heads / self.kv_heads;
        let q = q.reshape((b, self.kv_heads, group, len, d))?;
        // Queries in blocks: a block reads the keys up to its last position only (the square's upper right, all
        // masked, is never computed), and its scores take a block's memory, not the whole square's. Keys and
        // values are read in place (a narrowed prefix of each head's rows).
        let mut contexts = Vec::with_capacity(len.div_ceil(QUERY_BLOCK));
        for start in (0..len).step_by(QUERY_BLOCK) {
            let (rows, end) = (QUERY_BLOCK.min(len - start), offset + (start + QUERY_BLOCK).min(len));
            let (k, v) = (k.narrow(2, 0, end)?, v.narrow(2, 0, end)?);
            let block = q.narrow(3, start, rows)?.contiguous()?.reshape((b, self.kv_heads, group * rows, d))?;
            let scores = block.matmul(&k.t()?)?.reshape((b, self.kv_heads, group, rows, end))?;
            let probs =
                kernels::causal_softmax(&scores, offset + start)?.reshape((b, self.kv_heads, group * rows, end))?;
            contexts.push(probs.matmul(&v)?.reshape((b, self.heads, rows, d))?);
        }
        let context = Tensor::cat(&contexts, 2)?.transpose(1, 2)?.reshape((b, len, q_width))?;
        Ok((layer.out.forward(&context, lengths)?, (k, v)))
    }

    /// The states after every layer of the tokens `ids` (`[batch, len]`), whose positions follow `past`'s, and
    /// with `keep` each layer's keys and values of every position so far (else none: a long input's would hold
    /// hundreds of MB).
    fn layers(
        &self,
        ids: &Tensor,
        lengths: &[usize],
        rotary: &(Tensor, Tensor),
        past: Option<&Prefix>,
        keep: bool,
    ) -> candle_core::Result<(Tensor, Prefix)> {
        let mut x = self.embed.forward(ids)?;
        if let Some(scale) = self.embed_scale {
            // transformers multiplies by √hidden in the states' dtype.
            x = x.broadcast_mul(&Tensor::new(scale as f32, x.device())?.to_dtype(x.dtype())?)?;
        }
        let mut cache = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            let past = past.map(|p| &p[i]);
            let (attended, kv) = self.attention(layer, &layer.input_norm.forward(&x)?, lengths, rotary, past)?;
            if keep {
                cache.push(kv);
            }
            x = (x + attended)?;
            x = (&x + self.feed_forward(layer, &layer.post_norm.forward(&x)?, lengths)?)?;
        }
        Ok((x, cache))
    }

    /// The keys and values of a shared prefix: kept from an earlier input of the same query, else computed
    /// (alone, so that they have the same bits whichever input asked first).
    fn prefix(&self, ids: &[u32], rotary: &(Tensor, Tensor), device: &Device) -> candle_core::Result<Arc<Prefix>> {
        let kept =
            |prefixes: &Vec<(Vec<u32>, Arc<Prefix>)>| prefixes.iter().find(|(k, _)| k == ids).map(|e| e.1.clone());
        if let Some(prefix) = kept(&self.prefixes.lock().expect("the prefixes' lock")) {
            return Ok(prefix);
        }
        let tokens = Tensor::new(ids, device)?.unsqueeze(0)?;
        let prefix = Arc::new(self.layers(&tokens, &[ids.len()], rotary, None, true)?.1);
        let mut prefixes = self.prefixes.lock().expect("the prefixes' lock");
        if kept(&prefixes).is_none() {
            if prefixes.len() == PREFIXES_KEPT {
                prefixes.remove(0);
            }
            prefixes.push((ids.to_vec(), prefix.clone()));
        }
        Ok(prefix)
    }

    fn feed_forward(&self, layer: &Layer, x: &Tensor, lengths: &[usize]) -> candle_core::Result<Tensor> {
        let gate_up = layer.gate_up.forward(x, lengths)?;
        let gated = match self.activation {
            Activation::Silu => kernels::silu_gate(&gate_up)?,
            Activation::GeluTanh | Activation::Gelu => {
                let gate = gate_up.narrow(D::Minus1, 0, self.intermediate)?;
                let up = gate_up.narrow(D::Minus1, self.intermediate, self.intermediate)?;
                let gate =
                    if matches!(self.activation, Activation::GeluTanh) { gate.gelu()? } else { gate.gelu_erf()? };
                (gate * up)?
            }
        };
        layer.down.forward(&gated, lengths)
    }
}

/// Query positions per attention block (`Decoder::attention`).
const QUERY_BLOCK: usize = 256;

impl Network for Decoder {
    /// An input computed alone (the CPU's way) whose prompt has a shared prefix computes the rest after that
    /// prefix's keys and values, computed once for every segment of its query (`Decoder::prefix`); its states
    /// at the prefix's positions, which no head reads, are zeros. Every other input runs whole.
    fn forward(&self, inputs: &Inputs, _: Positions) -> candle_core::Result<Tensor> {
        let (batch, len) = inputs.ids.dims2()?;
        let device = inputs.ids.device();
        let dtype = self.embed.embeddings().dtype();
        let rotary = super::rotary::tables(self.head_dim, self.rope_theta, len, dtype, device)?;
        let shared = match inputs.shared_prefixes[..] {
            [p] if batch == 1 && p > 0 && p < len => p,
            _ => return self.norm.forward(&self.layers(&inputs.ids, &inputs.lengths, &rotary, None, false)?.0),
        };
        let ids = inputs.ids.i(0)?.to_vec1::<u32>()?;
        let prefix = self.prefix(&ids[..shared], &rotary, device)?;
        let rest = inputs.ids.narrow(1, shared, len - shared)?;
        let states = self.norm.forward(&self.layers(&rest, &[len - shared], &rotary, Some(&prefix), false)?.0)?;
        Tensor::cat(&[&Tensor::zeros((1, shared, self.hidden), states.dtype(), device)?, &states], 1)
    }

    fn quantize(&mut self) -> Result<(), ModelError> {
        let device = self.embed.embeddings().device().clone();
        let layers = self.layers.iter_mut().flat_map(|l| [&mut l.qkv, &mut l.out, &mut l.gate_up, &mut l.down]);
        Ok(Dense::quantize_all(layers, &device)?)
    }

    /// Our BLAS products are exact in any batch, candle's attention products are not: alone on the CPU.
    fn computes_alone(&self, device: &Device) -> bool {
        device.is_cpu()
    }

    /// Per layer: the projections (queries and output `4·L·h·q`, keys and values `4·L·h·kv`), the gated
    /// feed-forward (`6·L·h·i`) and the attention products (`4·L²·q`, counted whole though causal).
    fn flops(&self, _: &candle_transformers::models::bert::Config, len: usize) -> f64 {
        let (l, h, i) = (len as f64, self.hidden as f64, self.intermediate as f64);
        let (q, kv) = ((self.heads * self.head_dim) as f64, (self.kv_heads * self.head_dim) as f64);
        self.layers.len() as f64 * (4.0 * l * h * q + 4.0 * l * h * kv + 6.0 * l * h * i + 4.0 * l * l * q)
    }
}
