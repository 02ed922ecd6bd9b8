//! DeBERTa-v2 and v3 (disentangled attention over relative positions, bucketed; no absolute positions in v3)
//! through candle-transformers' backbone. Its sequence-classification head (the context pooler: the first
//! token's state through a dense layer and its activation, then the classifier) is `head`'s.

use std::path::Path;

use candle_core::{DType, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::debertav2;

use super::error::load_err;
use super::load::read_json;
use super::ModelError;

pub struct Deberta {
    model: debertav2::DebertaV2Model,
    /// Whether the model reads token types (DeBERTa-v3 has none).
    token_types: bool,
}

impl Deberta {
    /// The backbone under `vb` (the checkpoint's `deberta.*`, or a bare model's root) of the configuration in
    /// `dir`; a context pooler whose activation is not GELU is refused (`head` reads it as GELU).
    pub fn load(vb: VarBuilder, dir: &Path) -> Result<Deberta, ModelError> {
        let path = dir.join("config.json");
        let config: debertav2::Config = read_json(&path)?;
        if config.pooler_hidden_act.is_some_and(|act| act != debertav2::HiddenAct::Gelu) {
            return Err(load_err(&path, "a DeBERTa context pooler whose activation is not gelu is not supported"));
        }
        if config.pooler_hidden_size.is_some_and(|size| size != config.hidden_size) {
            return Err(load_err(
                &path,
                "a DeBERTa context pooler narrower or wider than the encoder is not supported",
            ));
        }
        let vb = match vb.contains_tensor("deberta.embeddings.word_embeddings.weight") {
            true => vb.pp("deberta"),
            false => vb,
        };
        let model = debertav2::DebertaV2Model::load(vb, &config).map_err(|e| load_err(dir, e))?;
        Ok(Deberta { model, token_types: config.type_vocab_size > 0 })
    }

    /// Final states `[batch, len, hidden]` of right-padded `ids` with their token types, under `mask`.
    pub fn forward(&self, ids: &Tensor, types: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
        let types = self.token_types.then(|| types.clone());
        self.model.forward(ids, types, Some(mask.to_dtype(DType::I64)?))
    }
}
