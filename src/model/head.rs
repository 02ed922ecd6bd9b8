//! A cross-encoder's classification head, for every family: the final states pooled (the first token's, or
//! their mean under the mask: ModernBERT's `classifier_pooling`), a dense layer and its activation (BERT's
//! pooler and RoBERTa's head with tanh, ELECTRA's and ModernBERT's with GELU, DistilBERT's pre-classifier with
//! ReLU), ModernBERT's LayerNorm, then the output layer; with two labels, label 1's logit is the score. A
//! decoder reranker's head is its answer (`recipe`): the last real token's state times one folded vector.

use std::path::Path;

use candle_core::{DType, IndexOp, Module, Tensor, D};
use candle_nn::{LayerNorm, Linear, VarBuilder};
use candle_transformers::models::bert::Config;

use super::bert::Positions;
use super::dropout::{Dropout, Site};
use super::error::load_err;
use super::family::{Activation, Family};
use super::ModelError;

/// How the head reads the final states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadPooling {
    First,
    Mean,
    /// The last real token's (a causal decoder's: the only one that has read the whole input).
    Last,
}

pub struct Head {
    pooling: HeadPooling,
    /// The dense layer and its activation (none in a decoder's answer head).
    dense: Option<(Linear, Activation)>,
    norm: Option<LayerNorm>,
    classifier: Linear,
    /// The output read as the score: the last label's.
    label: usize,
    /// A trainable model's (none in inference).
    dropout: Dropout,
}

impl Head {
    /// The head of the checkpoint whose variables `vb` holds (from its root); `origin` (its directory) names it
    /// in errors and holds ModernBERT's head options.
    pub fn load(vb: &VarBuilder, config: &Config, origin: &Path) -> Result<Head, ModelError> {
        let output = Family::from_config(config).head().2;
        let labels = Head::labels_in(vb, config)
            .ok_or_else(|| load_err(origin, format!("no {output} with 1 or 2 labels ({output}.weight)")))?;
        Head::with_labels(vb, config, origin, labels)
    }

    /// How many labels (1 or 2) the checkpoint's output layer has, if it has one.
    pub fn labels_in(vb: &VarBuilder, config: &Config) -> Option<usize> {
        let output = Family::from_config(config).head().2;
        [2usize, 1].into_iter().find(|n| vb.pp(output).get((*n, config.hidden_size), "weight").is_ok())
    }

    /// The head with an output layer of `labels` (as `load`, which finds how many): a model in training builds
    /// it over its variables, where asking is creating.
    pub fn with_labels(vb: &VarBuilder, config: &Config, origin: &Path, labels: usize) -> Result<Head, ModelError> {
        let h = config.hidden_size;
        let family = Family::from_config(config);
        let (dense_names, activation, output) = family.head();
        let classifier = candle_nn::linear(h, labels, vb.pp(output)).map_err(|e| load_err(origin, e))?;
        let label = labels - 1;
        if family == Family::ModernBert {
            let options = modernbert_options(origin)?;
            let dense = match options.dense_bias {
                true => candle_nn::linear(h, h, vb.pp(dense_names[0])),
                false => candle_nn::linear_no_bias(h, h, vb.pp(dense_names[0])),
            };
            let norm = candle_nn::layer_norm_no_bias(h, options.norm_eps, vb.pp("head.norm"));
            let err = |e| load_err(origin, e);
            return Ok(Head {
                pooling: options.pooling,
                dense: Some((dense.map_err(err)?, options.activation)),
                norm: Some(norm.map_err(err)?),
                classifier,
                label,
                dropout: Dropout::default(),
            });
        }
        let dense = dense_names
            .iter()
            .find_map(|n| candle_nn::linear(h, h, vb.pp(*n)).ok())
            .ok_or_else(|| load_err(origin, format!("no weights for {}", dense_names.join(" or "))))?;
        let dropout = Dropout::default();
        Ok(Head {
            pooling: HeadPooling::First,
            dense: Some((dense, activation)),
            norm: None,
            classifier,
            label,
            dropout,
        })
    }

    /// A decoder's answer: the last real token's final state times `answer` (`[hidden]`, `recipe::Answer`).
    pub fn answer(answer: Tensor) -> candle_core::Result<Head> {
        let classifier = Linear::new(answer.unsqueeze(0)?, None);
        Ok(Head {
            pooling: HeadPooling::Last,
            dense: None,
            norm: None,
            classifier,
            label: 0,
            dropout: Dropout::default(),
        })
    }

    /// The same head, dropping as `dropout` does (a trainable model's).
    pub(super) fn dropping(self, dropout: Dropout) -> Head {
        Head { dropout, ..self }
    }

    /// FLOPs of the head over one input's pooled state.
    pub fn flops(&self, hidden: usize) -> f64 {
        let h = hidden as f64;
        let dense = if self.dense.is_some() { 2.0 * h * h } else { 0.0 };
        dense + 2.0 * h * self.labels() as f64
    }

    /// The final states the head reads: the first position's alone, or every position's (mean pooling).
    pub fn positions(&self) -> Positions {
        match self.pooling {
            HeadPooling::First => Positions::First,
            HeadPooling::Mean | HeadPooling::Last => Positions::All,
        }
    }

    pub fn labels(&self) -> usize {
        self.label + 1
    }

    pub fn dtype(&self) -> DType {
        self.classifier.weight().dtype()
    }

    /// The scores `[batch]` of final states `[batch, len, hidden]` under `mask` `[batch, len]`.
    pub fn forward(&self, states: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
        let pooled = match self.pooling {
            HeadPooling::First => states.i((.., 0))?,
            HeadPooling::Mean => {
                let mask = mask.to_dtype(states.dtype())?.unsqueeze(D::Minus1)?;
                states.broadcast_mul(&mask)?.sum(1)?.broadcast_div(&mask.sum(1)?)?
            }
            HeadPooling::Last => last_states(states, mask)?,
        };
        let activated = match &self.dense {
            Some((dense, activation)) => {
                let dense = dense.forward(&self.dropout.apply(Site::Pooled, &pooled)?)?;
                match activation {
                    Activation::Tanh => dense.tanh()?,
                    Activation::Gelu => dense.gelu_erf()?,
                    Activation::Relu => dense.relu()?,
                }
            }
            None => pooled,
        };
        let normed = match &self.norm {
            Some(norm) => norm.forward(&activated)?,
            None => activated,
        };
        self.classifier.forward(&self.dropout.apply(Site::Classifier, &normed)?)?.i((.., self.label))
    }
}

/// Each input's state `[batch, hidden]` at its last real position (right padding: its length less one).
pub fn last_states(states: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
    let lengths = mask.to_dtype(DType::U32)?.sum(1)?.to_vec1::<u32>()?;
    let rows = lengths
        .iter()
        .enumerate()
        .map(|(i, &len)| states.i((i, len.saturating_sub(1) as usize)))
        .collect::<candle_core::Result<Vec<_>>>()?;
    Tensor::stack(&rows, 0)
}

/// What a ModernBERT checkpoint's `config.json` says of its head (transformers' defaults where it is silent).
#[derive(serde::Deserialize)]
struct ModernBertHead {
    #[serde(default)]
    classifier_bias: bool,
    #[serde(default = "gelu")]
    classifier_activation: String,
    #[serde(default = "cls")]
    classifier_pooling: String,
    #[serde(default = "norm_eps")]
    norm_eps: f64,
}

fn gelu() -> String {
    "gelu".into()
}

fn cls() -> String {
    "cls".into()
}

fn norm_eps() -> f64 {
    1e-5
}

/// What the head of the ModernBERT checkpoint in `dir` is: its pooling, whether its dense layer has a bias, its
/// activation, and its LayerNorm's epsilon.
struct HeadOptions {
    pooling: HeadPooling,
    dense_bias: bool,
    activation: Activation,
    norm_eps: f64,
}

fn modernbert_options(dir: &Path) -> Result<HeadOptions, ModelError> {
    let path = dir.join("config.json");
    let options: ModernBertHead = super::load::read_json(&path)?;
    let pooling = match options.classifier_pooling.as_str() {
        "cls" => HeadPooling::First,
        "mean" => HeadPooling::Mean,
        other => return Err(load_err(&path, format!("classifier_pooling {other:?} is not supported"))),
    };
    let activation = match options.classifier_activation.as_str() {
        "gelu" => Activation::Gelu,
        "tanh" => Activation::Tanh,
        "relu" => Activation::Relu,
        other => return Err(load_err(&path, format!("classifier_activation {other:?} is not supported"))),
    };
    Ok(HeadOptions { pooling, dense_bias: options.classifier_bias, activation, norm_eps: options.norm_eps })
}
