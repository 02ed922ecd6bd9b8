//! DeBERTa-v2 and v3: BERT's layers (`bert::Encoder`, our kernels and products, int8 too) whose attention
//! adds content-to-position and position-to-content scores over bucketed relative positions (`relative`), no
//! absolute positions. Its sequence-classification head (the context pooler: the first token's state through a
//! dense layer and its activation, then the classifier) is `head`'s. What the forward does not compute
//! (convolutions, absolute positions, separate position projections, one of the two relative terms alone) is
//! refused at load rather than ignored; the checkpoints of the v3 line (and v2's without a convolution) use none.

use std::path::Path;

use candle_core::{Device, Tensor};
use candle_nn::{Embedding, LayerNorm, VarBuilder};
use candle_transformers::models::bert;
use candle_transformers::models::debertav2;

use super::bert::{token_embeddings, Encoder, Positions, RelativePositions};
use super::dropout::{Dropout, Site};
use super::error::load_err;
use super::load::read_json;
use super::network::{encoder_flops, Inputs, Network};
use super::relative::{self, Buckets};
use super::ModelError;

pub struct Deberta {
    word: Embedding,
    /// None where the model reads no token types (DeBERTa-v3).
    token_type: Option<Embedding>,
    norm: LayerNorm,
    encoder: Encoder,
}

/// The options of `config.json` that this forward computes, or the reason it refuses the configuration.
fn buckets(c: &debertav2::Config) -> Result<Buckets, String> {
    let terms = |t: &str| c.pos_att_type.iter().any(|p| p == t);
    let refused = [
        (!c.relative_attention, "relative_attention = false"),
        (!(terms("c2p") && terms("p2c")), "pos_att_type other than [\"p2c\", \"c2p\"]"),
        (!c.share_att_key.unwrap_or(false), "share_att_key = false"),
        (c.position_biased_input, "position_biased_input = true"),
        (c.conv_kernel_size.unwrap_or(0) > 0, "a convolution layer (conv_kernel_size)"),
        (c.embedding_size.is_some_and(|e| e != c.hidden_size), "embedding_size other than hidden_size"),
        (c.attention_head_size.is_some_and(|d| d * c.num_attention_heads != c.hidden_size), "attention_head_size"),
        (!matches!(c.norm_rel_ebd.as_deref().map(str::trim), None | Some("none" | "layer_norm")), "norm_rel_ebd"),
        (c.hidden_act != debertav2::HiddenAct::Gelu, "hidden_act other than gelu"),
    ];
    if let Some((_, what)) = refused.iter().find(|(refused, _)| *refused) {
        return Err(format!("DeBERTa with {what} is not supported"));
    }
    let max_position = match c.max_relative_positions {
        m if m < 1 => c.max_position_embeddings,
        m => m as usize,
    };
    let buckets = c.position_buckets.filter(|b| *b > 0).map(|b| b as usize);
    Ok(Buckets { span: buckets.unwrap_or(max_position), buckets, max_position })
}

impl Deberta {
    /// The backbone under `vb` (the checkpoint's `deberta.*`, or a bare model's root) of the configuration in
    /// `dir`; a context pooler whose activation is not GELU is refused (`head` reads it as GELU).
    pub fn load(vb: VarBuilder, config: &bert::Config, dir: &Path) -> Result<Deberta, ModelError> {
        let classifier = vb.contains_tensor("deberta.embeddings.word_embeddings.weight");
        Deberta::build(vb, config, dir, classifier, false)
    }

    /// The training model (every operation differentiable) over variables named as a sequence classifier's
    /// (`deberta.*`).
    pub fn trainable(
        vb: VarBuilder,
        config: &bert::Config,
        dir: &Path,
        dropout: Dropout,
    ) -> Result<Deberta, ModelError> {
        let mut deberta = Deberta::build(vb, config, dir, true, true)?;
        deberta.encoder.dropout = dropout;
        Ok(deberta)
    }

    fn build(
        vb: VarBuilder,
        config: &bert::Config,
        dir: &Path,
        classifier: bool,
        differentiable: bool,
    ) -> Result<Deberta, ModelError> {
        let path = dir.join("config.json");
        let c: debertav2::Config = read_json(&path)?;
        if c.pooler_hidden_act.is_some_and(|act| act != debertav2::HiddenAct::Gelu) {
            return Err(load_err(&path, "a DeBERTa context pooler whose activation is not gelu is not supported"));
        }
        if c.pooler_hidden_size.is_some_and(|size| size != c.hidden_size) {
            return Err(load_err(
                &path,
                "a DeBERTa context pooler narrower or wider than the encoder is not supported",
            ));
        }
        let buckets = buckets(&c).map_err(|e| load_err(&path, e))?;
        // BERT's layer names (a renaming applies to whole names, from the root): transformers' DeBERTa names its
        // attention projections `query_proj`, ….
        let vb = vb.rename_f(|name: &str| {
            ["query", "key", "value"].iter().fold(name.to_string(), |name, part| {
                name.replace(&format!(".attention.self.{part}."), &format!(".attention.self.{part}_proj."))
            })
        });
        let vb = if classifier { vb.pp("deberta") } else { vb };
        let h = c.hidden_size;
        let norm = |vb: VarBuilder| candle_nn::layer_norm(h, c.layer_norm_eps, vb);
        let build = || -> candle_core::Result<Deberta> {
            let encoder = vb.pp("encoder");
            let rows = relative::embedding_rows(&encoder.get_unchecked("rel_embeddings.weight")?, &buckets)?;
            let rel_norm = match c.norm_rel_ebd.as_deref().map(str::trim) {
                Some("layer_norm") => Some(norm(encoder.pp("LayerNorm"))?),
                _ => None,
            };
            let positions = RelativePositions { buckets, rows, norm: rel_norm };
            let embedding = |rows, name: &str| candle_nn::embedding(rows, h, vb.pp("embeddings").pp(name));
            Ok(Deberta {
                word: embedding(c.vocab_size, "word_embeddings")?,
                token_type: (c.type_vocab_size > 0)
                    .then(|| embedding(c.type_vocab_size, "token_type_embeddings"))
                    .transpose()?,
                norm: norm(vb.pp("embeddings.LayerNorm"))?,
                encoder: Encoder::disentangled(encoder, config, positions, differentiable)?,
            })
        };
        build().map_err(|e| load_err(dir, e))
    }
}

/// The encoder's attention products are candle's, which sum in batch-shaped products: alone on the CPU.
impl Network for Deberta {
    fn forward(&self, inputs: &Inputs, positions: Positions) -> candle_core::Result<Tensor> {
        let x = token_embeddings(&self.word, self.token_type.as_ref(), &inputs.ids, &inputs.types)?;
        let mask = inputs.padded.then_some(&inputs.mask);
        let x = self.encoder.dropout.apply(Site::Embeddings, &self.encoder.normalize(&self.norm, &x)?)?;
        self.encoder.forward(&x, mask, positions)
    }

    fn computes_alone(&self, device: &Device) -> bool {
        device.is_cpu()
    }

    /// An encoder's, and per layer the products of the queries and keys with the `2 · span` relative positions'
    /// projections (8·L·span·h).
    fn flops(&self, config: &bert::Config, len: usize) -> f64 {
        let (l, h, span) = (len as f64, config.hidden_size as f64, self.encoder.span() as f64);
        encoder_flops(config, config.num_hidden_layers, len) + config.num_hidden_layers as f64 * 8.0 * l * span * h
    }

    fn quantize(&mut self) -> Result<(), ModelError> {
        Ok(self.encoder.quantize(self.word.embeddings().device())?)
    }
}
