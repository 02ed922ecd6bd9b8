//! A cross-encoder's classification head, for every family: the final states pooled (the first token's, or
//! their mean under the mask: ModernBERT's `classifier_pooling`), a dense layer and its activation (BERT's
//! pooler and RoBERTa's head with tanh, ELECTRA's and ModernBERT's with GELU, DistilBERT's pre-classifier with
//! ReLU), ModernBERT's LayerNorm, then the output layer; with two labels, label 1's logit is the score.

use std::path::Path;

use candle_core::{DType, IndexOp, Module, Tensor, D};
use candle_nn::{LayerNorm, Linear, VarBuilder};
use candle_transformers::models::bert::Config;

use super::bert::Positions;
use super::family::{Activation, Family};
use super::load::load_err;
use super::{modernbert, ModelError};

/// How the head reads the final states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadPooling {
    First,
    Mean,
}

pub struct Head {
    pooling: HeadPooling,
    dense: Linear,
    activation: Activation,
    norm: Option<LayerNorm>,
    classifier: Linear,
    /// The output read as the score: the last label's.
    label: usize,
}

impl Head {
    /// The head of the checkpoint whose variables `vb` holds (from its root); `origin` (its directory) names it
    /// in errors and holds ModernBERT's head options.
    pub fn load(vb: &VarBuilder, config: &Config, origin: &Path) -> Result<Head, ModelError> {
        let h = config.hidden_size;
        let family = Family::from_config(config);
        let (dense_names, activation, output) = family.head();
        let labels = [2usize, 1].into_iter().find(|n| vb.pp(output).get((*n, h), "weight").is_ok());
        let labels =
            labels.ok_or_else(|| load_err(origin, format!("no {output} with 1 or 2 labels ({output}.weight)")))?;
        let classifier = candle_nn::linear(h, labels, vb.pp(output)).map_err(|e| load_err(origin, e))?;
        let label = labels - 1;
        if family == Family::ModernBert {
            let options = modernbert::head_options(origin)?;
            let dense = match options.dense_bias {
                true => candle_nn::linear(h, h, vb.pp(dense_names[0])),
                false => candle_nn::linear_no_bias(h, h, vb.pp(dense_names[0])),
            };
            let norm = candle_nn::layer_norm_no_bias(h, options.norm_eps, vb.pp("head.norm"));
            let err = |e| load_err(origin, e);
            return Ok(Head {
                pooling: options.pooling,
                dense: dense.map_err(err)?,
                activation: options.activation,
                norm: Some(norm.map_err(err)?),
                classifier,
                label,
            });
        }
        let dense = dense_names
            .iter()
            .find_map(|n| candle_nn::linear(h, h, vb.pp(*n)).ok())
            .ok_or_else(|| load_err(origin, format!("no weights for {}", dense_names.join(" or "))))?;
        Ok(Head { pooling: HeadPooling::First, dense, activation, norm: None, classifier, label })
    }

    /// The final states the head reads: the first position's alone, or every position's (mean pooling).
    pub fn positions(&self) -> Positions {
        match self.pooling {
            HeadPooling::First => Positions::First,
            HeadPooling::Mean => Positions::All,
        }
    }

    pub fn labels(&self) -> usize {
        self.label + 1
    }

    pub fn dtype(&self) -> DType {
        self.dense.weight().dtype()
    }

    /// The scores `[batch]` of final states `[batch, len, hidden]` under `mask` `[batch, len]`.
    pub fn forward(&self, states: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
        let pooled = match self.pooling {
            HeadPooling::First => states.i((.., 0))?,
            HeadPooling::Mean => {
                let mask = mask.to_dtype(states.dtype())?.unsqueeze(D::Minus1)?;
                states.broadcast_mul(&mask)?.sum(1)?.broadcast_div(&mask.sum(1)?)?
            }
        };
        let dense = self.dense.forward(&pooled)?;
        let activated = match self.activation {
            Activation::Tanh => dense.tanh()?,
            Activation::Gelu => dense.gelu_erf()?,
            Activation::Relu => dense.relu()?,
        };
        let normed = match &self.norm {
            Some(norm) => norm.forward(&activated)?,
            None => activated,
        };
        self.classifier.forward(&normed)?.i((.., self.label))
    }
}
