//! ModernBERT (rotary positions, local attention in every layer but each `global_attn_every_n_layers`-th,
//! GeGLU, inputs up to 8,192 tokens) through candle-transformers' backbone, and what its configuration says of
//! its sequence-classification head (`head` builds and configures it: candle's answers probabilities, a reranker
//! needs logits).
//! Options candle's backbone does not read (biases) are refused rather than ignored.

use std::path::Path;

use candle_core::Tensor;
use candle_nn::VarBuilder;
use candle_transformers::models::modernbert;
use serde::Deserialize;

use super::error::load_err;
use super::load::read_json;
use super::ModelError;

/// The backbone over a checkpoint's root (a sequence classifier's `model.*`, or a bare model's names).
pub struct ModernBert(modernbert::ModernBert);

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
        let config: modernbert::Config =
            serde_json::from_value(serde_json::Value::Object(raw)).map_err(|e| load_err(&path, e))?;
        // candle reads `model.*`: a bare model's checkpoint names its weights without it.
        let vb = match vb.contains_tensor("model.embeddings.tok_embeddings.weight") {
            true => vb,
            false => vb.rename_f(|name: &str| name.strip_prefix("model.").unwrap_or(name).to_string()),
        };
        modernbert::ModernBert::load(vb, &config).map(ModernBert).map_err(|e| load_err(dir, e))
    }

    /// Final states `[batch, len, hidden]` of right-padded `ids` under `mask` (1 for tokens).
    pub fn forward(&self, ids: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
        self.0.forward(ids, mask)
    }
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
