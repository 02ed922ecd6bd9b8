//! The model families longrank loads, told apart by `config.json`'s `model_type`: BERT and the encoders that
//! differ from it only around the same layers (RoBERTa and XLM-RoBERTa: positions offset past the padding id, no
//! token types in use, their classification head; ELECTRA: embeddings narrower than the encoder, projected, and
//! its head; DistilBERT: other names, no token types, a pre-classifier). Each runs through `bert::Bert`, whose
//! CPU kernels pay for all of them; what differs is read here. ModernBERT is another architecture (`modernbert`);
//! DeBERTa is BERT's layers with relative attention (`deberta`). Qwen2, Qwen3 and Gemma are causal decoders
//! (`decoder`), loaded as rerankers through a recipe (`recipe`).

use candle_nn::VarBuilder;
use candle_transformers::models::bert::Config;
use serde_json::{Map, Value};

/// A family of encoders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Bert,
    /// RoBERTa, XLM-RoBERTa, CamemBERT.
    Roberta,
    Electra,
    DistilBert,
    /// ModernBERT (`modernbert`).
    ModernBert,
    /// DeBERTa-v2 and v3 (`deberta`).
    Deberta,
    /// Causal decoders (`decoder`), read by a reranker recipe.
    Qwen2,
    Qwen3,
    Gemma,
}

/// `model_type`s longrank loads, as a refusal lists them.
pub const LOADED: &str =
    "bert, roberta, xlm-roberta, camembert, electra, distilbert, modernbert, deberta-v2, qwen2, qwen3, gemma";

/// How a family's classification head reads the first token's final state: a dense layer, an activation, and
/// the output layer (one or two labels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Tanh,
    Gelu,
    Relu,
}

impl Family {
    fn of(model_type: &str) -> Option<Family> {
        match model_type {
            "bert" => Some(Family::Bert),
            "roberta" | "xlm-roberta" | "camembert" => Some(Family::Roberta),
            "electra" => Some(Family::Electra),
            "distilbert" => Some(Family::DistilBert),
            "modernbert" => Some(Family::ModernBert),
            "deberta-v2" => Some(Family::Deberta),
            "qwen2" => Some(Family::Qwen2),
            "qwen3" => Some(Family::Qwen3),
            "gemma" => Some(Family::Gemma),
            _ => None,
        }
    }

    /// Whether the family is a causal decoder (scored through a recipe, not a classification head).
    pub fn is_decoder(self) -> bool {
        matches!(self, Family::Qwen2 | Family::Qwen3 | Family::Gemma)
    }

    /// The family of a BERT-shaped configuration (`config`'s `model_type`, as `configuration` wrote it).
    pub fn from_config(config: &Config) -> Family {
        config.model_type.as_deref().and_then(Family::of).unwrap_or(Family::Bert)
    }

    /// `config.json` as a BERT-shaped configuration (DistilBERT's names mapped; settings inference does not
    /// read filled in), its family, or why it is refused.
    pub fn configuration(mut raw: Map<String, Value>) -> Result<(Config, Family), String> {
        let model_type = raw.get("model_type").and_then(Value::as_str).unwrap_or("bert").to_string();
        let family = Family::of(&model_type)
            .ok_or_else(|| format!("model_type {model_type:?} is not one longrank loads ({LOADED})"))?;
        let renamed: &[(&str, &str)] = match family {
            Family::DistilBert => &[
                ("dim", "hidden_size"),
                ("n_layers", "num_hidden_layers"),
                ("n_heads", "num_attention_heads"),
                ("hidden_dim", "intermediate_size"),
                ("activation", "hidden_act"),
            ],
            Family::ModernBert => &[("hidden_activation", "hidden_act"), ("norm_eps", "layer_norm_eps")],
            Family::Bert | Family::Roberta | Family::Electra | Family::Deberta => &[],
            Family::Qwen2 | Family::Qwen3 | Family::Gemma => {
                // The decoder reads its own configuration (`decoder`); the BERT shape keeps the sizes, and
                // settings it cannot hold (null ids, SiLU) give way to defaults it does not read.
                raw.retain(|_, value| !value.is_null());
                raw.insert("hidden_act".into(), "gelu".into());
                &[]
            }
        };
        for (from, to) in renamed {
            if let Some(value) = raw.remove(*from) {
                raw.insert(to.to_string(), value);
            }
        }
        if matches!(family, Family::DistilBert | Family::ModernBert) || family.is_decoder() {
            raw.insert("type_vocab_size".into(), 0.into());
        }
        for (name, value) in [
            ("hidden_act", Value::from("gelu")),
            ("hidden_dropout_prob", 0.1.into()),
            ("initializer_range", 0.02.into()),
            ("layer_norm_eps", 1e-12.into()),
            ("type_vocab_size", 2.into()),
            ("pad_token_id", 0.into()),
        ] {
            raw.entry(name).or_insert(value);
        }
        raw.insert("model_type".into(), model_type.into());
        let config = serde_json::from_value(Value::Object(raw)).map_err(|e| format!("not a {family:?} config: {e}"))?;
        Ok((config, family))
    }

    /// Where the encoder's weights live in a checkpoint of a sequence classifier.
    pub fn prefix(self) -> &'static str {
        match self {
            Family::Bert => "bert",
            Family::Roberta => "roberta",
            Family::Electra => "electra",
            Family::DistilBert => "distilbert",
            Family::ModernBert | Family::Qwen2 | Family::Qwen3 | Family::Gemma => "model",
            Family::Deberta => "deberta",
        }
    }

    /// The first position id: RoBERTa's positions start past its padding id.
    pub fn position_offset(self, config: &Config) -> usize {
        match self {
            Family::Roberta => config.pad_token_id + 1,
            _ => 0,
        }
    }

    /// The longest input the positions allow.
    pub fn max_len(self, config: &Config) -> usize {
        config.max_position_embeddings.saturating_sub(self.position_offset(config))
    }

    /// A checkpoint's weights, the encoder's under BERT's names (`….embeddings.…`, `….encoder.layer.N.…`); from
    /// the checkpoint's root (a renaming applies to whole names).
    pub fn bert_names(self, vb: VarBuilder) -> VarBuilder {
        if self != Family::DistilBert {
            return vb;
        }
        vb.rename_f(|name: &str| {
            let Some((root, rest)) = name.split_once("encoder.layer.") else { return name.to_string() };
            let (layer, rest) = rest.split_once('.').unwrap_or((rest, ""));
            let renamed = [
                ("attention.self.query.", "attention.q_lin."),
                ("attention.self.key.", "attention.k_lin."),
                ("attention.self.value.", "attention.v_lin."),
                ("attention.output.dense.", "attention.out_lin."),
                ("attention.output.LayerNorm.", "sa_layer_norm."),
                ("intermediate.dense.", "ffn.lin1."),
                ("output.dense.", "ffn.lin2."),
                ("output.LayerNorm.", "output_layer_norm."),
            ]
            .iter()
            .find_map(|(bert, own)| rest.strip_prefix(bert).map(|tail| format!("{own}{tail}")))
            .unwrap_or_else(|| rest.to_string());
            format!("{root}transformer.layer.{layer}.{renamed}")
        })
    }

    /// The classification head's dense layer, activation and output layer (names from the checkpoint's root).
    pub fn head(self) -> (&'static [&'static str], Activation, &'static str) {
        match self {
            Family::Bert => (&["bert.pooler.dense", "pooler.dense"], Activation::Tanh, "classifier"),
            Family::Roberta => (&["classifier.dense"], Activation::Tanh, "classifier.out_proj"),
            Family::Electra => (&["classifier.dense"], Activation::Gelu, "classifier.out_proj"),
            Family::DistilBert => (&["pre_classifier"], Activation::Relu, "classifier"),
            // Its activation and the rest of its head: `head::modernbert_options`.
            Family::ModernBert => (&["head.dense"], Activation::Gelu, "classifier"),
            // The context pooler (its activation checked by `deberta`).
            Family::Deberta => (&["pooler.dense"], Activation::Gelu, "classifier"),
            // Never read: `CrossEncoder::new` gives a decoder its recipe's answer (`Head::answer`, a converted
            // checkpoint's `score` row).
            Family::Qwen2 | Family::Qwen3 | Family::Gemma => (&[], Activation::Gelu, "score"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(json: serde_json::Value) -> Map<String, Value> {
        json.as_object().unwrap().clone()
    }

    #[test]
    fn configurations_of_each_family_and_a_refusal_naming_what_loads() {
        let shape = serde_json::json!({"vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 64, "max_position_embeddings": 130});
        let mut roberta = raw(shape.clone());
        roberta.insert("model_type".into(), "xlm-roberta".into());
        roberta.insert("pad_token_id".into(), 1.into());
        let (config, family) = Family::configuration(roberta).unwrap();
        assert_eq!((family, family.position_offset(&config), family.max_len(&config)), (Family::Roberta, 2, 128));
        let distil = raw(serde_json::json!({"model_type": "distilbert", "vocab_size": 99, "dim": 32, "n_layers": 2,
            "n_heads": 4, "hidden_dim": 64, "max_position_embeddings": 128, "activation": "gelu"}));
        let (config, family) = Family::configuration(distil).unwrap();
        assert_eq!(
            (family, config.hidden_size, config.intermediate_size, config.type_vocab_size),
            (Family::DistilBert, 32, 64, 0)
        );
        let (config, family) = Family::configuration(raw(shape.clone())).unwrap();
        assert_eq!((family, Family::from_config(&config)), (Family::Bert, Family::Bert));
        let mut modern = raw(shape);
        modern.insert("model_type".into(), "mpnet".into());
        let refused = Family::configuration(modern).unwrap_err();
        assert!(refused.contains("\"mpnet\"") && refused.contains(LOADED), "{refused}");
    }

    #[test]
    fn distilbert_weights_are_read_under_berts_names() {
        let weights = [
            "transformer.layer.1.attention.q_lin.weight",
            "transformer.layer.1.sa_layer_norm.bias",
            "transformer.layer.1.ffn.lin2.weight",
            "transformer.layer.1.output_layer_norm.weight",
            "embeddings.word_embeddings.weight",
        ];
        let tensors = weights
            .iter()
            .map(|n| {
                (
                    n.to_string(),
                    candle_core::Tensor::zeros(1, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap(),
                )
            })
            .collect();
        let vb = VarBuilder::from_tensors(tensors, candle_core::DType::F32, &candle_core::Device::Cpu);
        let vb = Family::DistilBert.bert_names(vb);
        for name in [
            "encoder.layer.1.attention.self.query.weight",
            "encoder.layer.1.attention.output.LayerNorm.bias",
            "encoder.layer.1.output.dense.weight",
            "encoder.layer.1.output.LayerNorm.weight",
            "embeddings.word_embeddings.weight",
        ] {
            assert!(vb.contains_tensor(name), "{name}");
        }
    }
}
