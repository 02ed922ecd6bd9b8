//! Co-BERT's heads (Co-BERT: a context-aware BERT retrieval model incorporating local and query-specific
//! context), over the interaction representations r_j (the backbone's final `[CLS]` state on the query and
//! the best passage of candidate j), candidates in first-round order:
//!
//! - the calibrator: for each prototype i (the first round's top m), the sequence [t_i, r_j] (as input
//!   vectors, with position and type embeddings) goes through a small encoder; the state at r_j's position,
//!   projected by W_t, b_t, is c_ij. c_j = Σ_i w_i c_ij with w = softmax(the prototypes' first-round scores),
//!   and r̂_j = (r_j + c_j) / 2, the averaging skip connection;
//! - the groupwise scorer: the candidates cut into groups of n overlapping by o, each group's r̂ sequence
//!   through an encoder without position embeddings (type 1 marks the overlap documents carried from the
//!   previous group), a linear layer giving each position a score; a document keeps its first group's score.
//!
//! Ablations: no calibration (r̂_j = r_j), no groupwise scorer (r̂_j scored alone by W_rel, b_rel), no averaging
//! (r̂_j = c_j).

use std::path::Path;

use candle_core::{DType, Device, IndexOp, Module, Tensor, D};
use candle_nn::{Embedding, LayerNorm, Linear, VarBuilder};
use candle_transformers::models::bert::Config;
use serde::{Deserialize, Serialize};

use super::bert::{Encoder, Positions};
use super::{encoder_flops, load_err, read_config, read_json, CrossEncoder, ModelError};

/// The heads' configuration file, whose presence makes a directory a Co-BERT model.
pub const CONFIG_FILE: &str = "cobert.json";
/// The heads' weights beside the backbone's.
pub const WEIGHTS_FILE: &str = "cobert.safetensors";
/// Where a Co-BERT trained end to end keeps the cross-encoder of its first round (its own backbone moved on).
pub const FIRST_ROUND_DIR: &str = "first-round";

/// A Co-BERT model: the cross-encoder whose MaxP is the first round, the backbone whose final `[CLS]`
/// states are the interaction representations, and the heads. Trained with the backbone frozen, the two are
/// one model, and the second round reuses the first round's pass over each best passage; trained end to end,
/// the directory is Co-BERT's own backbone and `first-round/` the cross-encoder it started from.
pub struct CoBert {
    pub cross: CrossEncoder,
    /// Co-BERT's own backbone, when it is not the first round's.
    pub own: Option<CrossEncoder>,
    pub heads: CoBertHeads,
    pub backbone: Config,
}

impl CoBert {
    pub fn load(dir: &Path, device: &Device, dtype: DType) -> Result<CoBert, ModelError> {
        let first_round = dir.join(FIRST_ROUND_DIR);
        let (cross, own) = if first_round.is_dir() {
            (
                CrossEncoder::load(&first_round, device, dtype, None)?,
                Some(CrossEncoder::load(dir, device, dtype, None)?),
            )
        } else {
            (CrossEncoder::load(dir, device, dtype, None)?, None)
        };
        let (backbone, _) = read_config(dir)?;
        let config: CoBertConfig = read_json(&dir.join(CONFIG_FILE))?;
        let weights = dir.join(WEIGHTS_FILE);
        // SAFETY: read-only mapping, as for every checkpoint.
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[&weights], dtype, device) }
            .map_err(|e| load_err(&weights, e))?;
        let heads = CoBertHeads::new(vb.pp("cobert"), &backbone, config, false).map_err(|e| load_err(&weights, e))?;
        Ok(CoBert { cross, own, heads, backbone })
    }

    /// The model whose `[CLS]` states the heads read.
    pub fn interactions(&self) -> &CrossEncoder {
        self.own.as_ref().unwrap_or(&self.cross)
    }

    /// Scores of the candidates (in first-round order) from their best passages' `[CLS]` states and their
    /// first-round scores.
    pub fn rescore(&self, states: &[&[f32]], first_round: &[f32]) -> Result<Vec<f32>, ModelError> {
        let device = self.interactions().device();
        let h = self.backbone.hidden_size;
        let flat: Vec<f32> = states.iter().flat_map(|s| s.iter().copied()).collect();
        let dtype = self.interactions().dtype();
        let r = Tensor::from_vec(flat, (states.len(), h), device)?.to_dtype(dtype)?;
        let first = Tensor::new(first_round, device)?.to_dtype(dtype)?;
        Ok(self.heads.forward(&r, &first)?.to_dtype(DType::F32)?.to_vec1()?)
    }
}

/// Co-BERT's shape and ablations (`cobert.json` in a checkpoint; `longrank train --method cobert` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::Args)]
#[serde(default, deny_unknown_fields)]
pub struct CoBertConfig {
    /// Co-BERT: prototypes m, the first round's top documents.
    #[arg(long, default_value_t = CoBertConfig::default().prototypes)]
    pub prototypes: usize,
    /// Co-BERT: documents per group n.
    #[arg(long, default_value_t = CoBertConfig::default().group)]
    pub group: usize,
    /// Co-BERT: documents each group shares with the previous one, o.
    #[arg(long, default_value_t = CoBertConfig::default().overlap)]
    pub overlap: usize,
    #[arg(skip = CoBertConfig::default().calibrator_layers)]
    pub calibrator_layers: usize,
    #[arg(skip = CoBertConfig::default().groupwise_layers)]
    pub groupwise_layers: usize,
    /// Calibrate against the prototypes (`--no-calibration`: the ablation without).
    #[arg(long = "no-calibration", action = clap::ArgAction::SetFalse)]
    pub calibrate: bool,
    /// Score groups jointly (`--no-groupwise`: each candidate alone).
    #[arg(long = "no-groupwise", action = clap::ArgAction::SetFalse)]
    pub groupwise: bool,
    /// Average r and c in the calibration (`--no-average`: without).
    #[arg(long = "no-average", action = clap::ArgAction::SetFalse)]
    pub average: bool,
}

impl Default for CoBertConfig {
    fn default() -> Self {
        CoBertConfig {
            prototypes: 4,
            group: 60,
            overlap: 4,
            calibrator_layers: 2,
            groupwise_layers: 4,
            calibrate: true,
            groupwise: true,
            average: true,
        }
    }
}

impl CoBertConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.prototypes == 0 || self.group == 0 || self.overlap >= self.group {
            return Err(format!(
                "Co-BERT needs at least one prototype and 0 <= overlap < group, got m={} n={} o={}",
                self.prototypes, self.group, self.overlap
            ));
        }
        Ok(())
    }
}

/// One group of the groupwise scorer: `len` candidates from `start`, the first `carried` of them shared with
/// the previous group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    pub start: usize,
    pub len: usize,
    pub carried: usize,
}

/// The groups over `k` candidates: n at a time, each after the first starting o before the previous end.
pub fn groups(k: usize, n: usize, o: usize) -> Vec<Group> {
    let mut out = Vec::new();
    let (mut start, mut previous_end) = (0, 0);
    while start < k {
        let len = n.min(k - start);
        out.push(Group { start, len, carried: previous_end - start });
        previous_end = start + len;
        if previous_end >= k {
            break;
        }
        start += n - o;
    }
    out
}

pub struct CoBertHeads {
    config: CoBertConfig,
    calibrator_position: Embedding,
    calibrator_type: Embedding,
    calibrator_norm: LayerNorm,
    calibrator: Encoder,
    project: Linear,
    group_type: Embedding,
    group_norm: LayerNorm,
    groupwise: Encoder,
    score: Linear,
    relevance: Linear,
}

impl CoBertHeads {
    /// The heads' variables under `vb` (`cobert.` in a checkpoint), shaped like the backbone's layers.
    pub fn new(
        vb: VarBuilder,
        backbone: &Config,
        config: CoBertConfig,
        differentiable: bool,
    ) -> candle_core::Result<CoBertHeads> {
        config.validate().map_err(candle_core::Error::Msg)?;
        let h = backbone.hidden_size;
        let (cal, grp) = (vb.pp("calibrator"), vb.pp("groupwise"));
        let norm = |vb: VarBuilder| candle_nn::layer_norm(h, backbone.layer_norm_eps, vb);
        Ok(CoBertHeads {
            config,
            calibrator_position: candle_nn::embedding(2, h, cal.pp("embeddings.position_embeddings"))?,
            calibrator_type: candle_nn::embedding(2, h, cal.pp("embeddings.token_type_embeddings"))?,
            calibrator_norm: norm(cal.pp("embeddings.LayerNorm"))?,
            calibrator: Encoder::load(cal.pp("encoder"), backbone, config.calibrator_layers, differentiable)?,
            project: candle_nn::linear(h, h, cal.pp("project"))?,
            group_type: candle_nn::embedding(2, h, grp.pp("embeddings.token_type_embeddings"))?,
            group_norm: norm(grp.pp("embeddings.LayerNorm"))?,
            groupwise: Encoder::load(grp.pp("encoder"), backbone, config.groupwise_layers, differentiable)?,
            score: candle_nn::linear(h, 1, grp.pp("score"))?,
            relevance: candle_nn::linear(h, 1, vb.pp("relevance"))?,
        })
    }

    pub fn config(&self) -> &CoBertConfig {
        &self.config
    }

    /// Scores `[k]` of the candidates whose representations `r` (`[k, hidden]`) and first-round scores
    /// (`[k]`) are given in first-round order.
    pub fn forward(&self, r: &Tensor, first_round: &Tensor) -> candle_core::Result<Tensor> {
        let m = self.config.prototypes.min(r.dim(0)?);
        let calibrated = self.calibrate(r, &r.narrow(0, 0, m)?, &first_round.narrow(0, 0, m)?)?;
        if !self.config.groupwise {
            return self.score_alone(&calibrated);
        }
        let groups = groups(r.dim(0)?, self.config.group, self.config.overlap);
        let scores = self.score_groups(&calibrated, &groups)?;
        // A document's score comes from the first group holding it: the part of each group past its carried
        // documents.
        let parts: Vec<Tensor> = groups
            .iter()
            .enumerate()
            .map(|(i, g)| scores.i(i)?.narrow(0, g.carried, g.len - g.carried))
            .collect::<candle_core::Result<_>>()?;
        Tensor::cat(&parts, 0)
    }

    /// r̂ `[k, hidden]` of candidates `r` against the prototypes' representations `[m, hidden]` and
    /// first-round scores `[m]` (r itself when calibration is off).
    pub fn calibrate(&self, r: &Tensor, prototypes: &Tensor, prototype_scores: &Tensor) -> candle_core::Result<Tensor> {
        if !self.config.calibrate {
            return Ok(r.clone());
        }
        let (k, h) = r.dims2()?;
        let m = prototypes.dim(0)?;
        // [k, m, 2, h]: for every candidate j and prototype i the pair (t_i, r_j).
        let pairs =
            Tensor::stack(&[prototypes.unsqueeze(0)?.expand((k, m, h))?, r.unsqueeze(1)?.expand((k, m, h))?], 2)?
                .reshape((k * m, 2, h))?;
        let ids = Tensor::new(&[0u32, 1], r.device())?;
        let embedded = pairs
            .broadcast_add(&self.calibrator_position.forward(&ids)?)?
            .broadcast_add(&self.calibrator_type.forward(&ids)?)?;
        let states = self.calibrator.forward(
            &self.calibrator.normalize(&self.calibrator_norm, &embedded)?,
            None,
            Positions::All,
        )?;
        let c = self.project.forward(&states.i((.., 1))?)?.reshape((k, m, h))?;
        let weights = candle_nn::ops::softmax(prototype_scores, D::Minus1)?;
        let c = c.broadcast_mul(&weights.reshape((1, m, 1))?)?.sum(1)?;
        if self.config.average {
            (r + c)? / 2.0
        } else {
            Ok(c)
        }
    }

    /// Scores `[k]` of calibrated candidates each alone (the no-groupwise ablation: W_rel, b_rel).
    pub fn score_alone(&self, calibrated: &Tensor) -> candle_core::Result<Tensor> {
        self.relevance.forward(calibrated)?.squeeze(1)
    }

    /// Scores `[groups, n]` of every position of each group of `calibrated` (`n` the longest group; padding
    /// positions are masked out and their scores meaningless).
    pub fn score_groups(&self, calibrated: &Tensor, groups: &[Group]) -> candle_core::Result<Tensor> {
        let h = calibrated.dim(1)?;
        let n = groups.iter().map(|g| g.len).max().unwrap_or(0);
        let device = calibrated.device();
        let mut sequences = Vec::new();
        let (mut types, mut mask) = (Vec::new(), Vec::new());
        for g in groups {
            let mut sequence = calibrated.narrow(0, g.start, g.len)?;
            if g.len < n {
                sequence = Tensor::cat(&[&sequence, &Tensor::zeros((n - g.len, h), sequence.dtype(), device)?], 0)?;
            }
            sequences.push(sequence);
            types.extend((0..n).map(|p| (p < g.carried) as u32));
            mask.extend((0..n).map(|p| (p < g.len) as u32));
        }
        let batch = Tensor::stack(&sequences, 0)?;
        let types = Tensor::from_vec(types, (groups.len(), n), device)?;
        let embedded = batch.broadcast_add(&self.group_type.forward(&types)?)?;
        let padded = groups.iter().any(|g| g.len < n);
        let mask = Tensor::from_vec(mask, (groups.len(), n), device)?;
        let states = self.groupwise.forward(
            &self.groupwise.normalize(&self.group_norm, &embedded)?,
            padded.then_some(&mask),
            Positions::All,
        )?;
        self.score.forward(&states)?.squeeze(2)
    }
}

impl CoBertHeads {
    /// FLOPs of the heads for `k` candidates (the backbone passes are counted by the pipeline).
    pub fn flops(&self, backbone: &Config, k: usize) -> f64 {
        let h = backbone.hidden_size as f64;
        let c = &self.config;
        let m = c.prototypes.min(k);
        let mut flops = 0.0;
        if c.calibrate {
            // k·m two-vector passes, their projections, and the weighted sum.
            let pairs = (k * m) as f64;
            flops += pairs * (encoder_flops(backbone, c.calibrator_layers, 2) + 2.0 * h * h) + 2.0 * pairs * h;
        }
        if c.groupwise {
            let groups = groups(k, c.group, c.overlap);
            let n = groups.iter().map(|g| g.len).max().unwrap_or(0);
            flops += groups.len() as f64 * (encoder_flops(backbone, c.groupwise_layers, n) + 2.0 * n as f64 * h);
        } else {
            flops += k as f64 * 2.0 * h;
        }
        flops
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use candle_nn::VarMap;

    fn tiny() -> Config {
        serde_json::from_value(serde_json::json!({
            "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
            "intermediate_size": 16, "hidden_act": "gelu", "max_position_embeddings": 16, "type_vocab_size": 2,
            "layer_norm_eps": 1e-12, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
            "initializer_range": 0.02, "pad_token_id": 0, "model_type": "bert"
        }))
        .unwrap()
    }

    /// Heads with every variable drawn at random (the builder's defaults leave the attention weights zero);
    /// built a second time over the drawn values, since inference layers copy their fused weights.
    fn heads(config: CoBertConfig) -> CoBertHeads {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        CoBertHeads::new(vb.clone(), &tiny(), config, false).unwrap();
        let mut data: Vec<(String, candle_core::Var)> = varmap.data().lock().unwrap().clone().into_iter().collect();
        data.sort_by(|a, b| a.0.cmp(&b.0));
        for (i, (_, var)) in data.iter().enumerate() {
            let dims = var.dims().to_vec();
            let (rows, cols) = (dims[0], dims.get(1).copied().unwrap_or(1));
            var.set(&(random((rows, cols), 100 + i as u64) * 0.5).unwrap().reshape(dims).unwrap()).unwrap();
        }
        CoBertHeads::new(vb, &tiny(), config, false).unwrap()
    }

    fn random(shape: (usize, usize), seed: u64) -> Tensor {
        let mut rng = crate::rng::Rng::new(seed);
        let values: Vec<f32> = (0..shape.0 * shape.1).map(|_| rng.normal() as f32).collect();
        Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
    }

    fn scores(heads: &CoBertHeads, r: &Tensor, first: &Tensor) -> Vec<f32> {
        heads.forward(r, first).unwrap().to_vec1().unwrap()
    }

    #[test]
    fn groups_cover_every_candidate_once_and_mark_the_carried_ones() {
        assert_eq!(
            groups(10, 4, 1),
            [
                Group { start: 0, len: 4, carried: 0 },
                Group { start: 3, len: 4, carried: 1 },
                Group { start: 6, len: 4, carried: 1 }
            ]
        );
        assert_eq!(groups(3, 60, 4), [Group { start: 0, len: 3, carried: 0 }]);
        for (k, n, o) in [(100, 60, 4), (61, 60, 4), (7, 3, 2), (1, 1, 0)] {
            let owned: usize = groups(k, n, o).iter().map(|g| g.len - g.carried).sum();
            assert_eq!(owned, k, "k={k} n={n} o={o}");
        }
    }

    #[test]
    fn scores_come_one_per_candidate_and_padding_changes_nothing() {
        let heads = heads(CoBertConfig { prototypes: 2, group: 4, overlap: 1, ..Default::default() });
        let first: Vec<f32> = (0..10).map(|i| 5.0 - i as f32).collect();
        let (r, first) = (random((10, 8), 1), Tensor::new(first.as_slice(), &Device::Cpu).unwrap());
        let all = scores(&heads, &r, &first);
        assert_eq!(all.len(), 10);
        let fewer = scores(&heads, &r.narrow(0, 0, 9).unwrap(), &first.narrow(0, 0, 9).unwrap());
        assert_eq!(fewer.len(), 9);
        assert_eq!(all[..6], fewer[..6], "earlier groups do not depend on later ones");
        // Without overlap, groups [0, 4) and [4, 6) (padded to 4): the second scores as it does alone.
        let disjoint = CoBertHeads { config: CoBertConfig { overlap: 0, ..heads.config }, ..heads };
        let six = r.narrow(0, 0, 6).unwrap();
        let calibrated =
            disjoint.calibrate(&six, &six.narrow(0, 0, 2).unwrap(), &first.narrow(0, 0, 2).unwrap()).unwrap();
        let padded: Vec<f32> = disjoint.forward(&six, &first.narrow(0, 0, 6).unwrap()).unwrap().to_vec1().unwrap();
        let last = [Group { start: 0, len: 2, carried: 0 }];
        let alone = disjoint.score_groups(&calibrated.narrow(0, 4, 2).unwrap(), &last).unwrap();
        let alone: Vec<f32> = alone.squeeze(0).unwrap().to_vec1().unwrap();
        for (a, b) in alone.iter().zip(&padded[4..]) {
            assert!((a - b).abs() < 1e-5, "{alone:?} vs {padded:?}");
        }
    }

    #[test]
    fn each_ablation_removes_its_part() {
        let (r, first) = (random((6, 8), 2), Tensor::new(&[3f32, 2., 1., 0., -1., -2.], &Device::Cpu).unwrap());
        let mut other = r.to_vec2::<f32>().unwrap();
        other[0] = vec![9.0; 8]; // a different top prototype
        let other = Tensor::new(other, &Device::Cpu).unwrap();
        // Without calibration or groups, a candidate's score depends on its own representation only.
        let plain = heads(CoBertConfig { calibrate: false, groupwise: false, prototypes: 2, ..Default::default() });
        assert_eq!(scores(&plain, &r, &first)[1..], scores(&plain, &other, &first)[1..]);
        // Calibration makes every score depend on the prototypes.
        let calibrated = heads(CoBertConfig { groupwise: false, prototypes: 2, ..Default::default() });
        let (a, b) = (scores(&calibrated, &r, &first), scores(&calibrated, &other, &first));
        assert!(a[1..].iter().zip(&b[1..]).all(|(x, y)| x != y), "{a:?} {b:?}");
        // Averaging: r̂ = (r + c) / 2; without it r̂ = c.
        let (t, w) = (r.narrow(0, 0, 2).unwrap(), first.narrow(0, 0, 2).unwrap());
        let averaged = calibrated.calibrate(&r, &t, &w).unwrap();
        let unaveraged_heads =
            CoBertHeads { config: CoBertConfig { average: false, ..calibrated.config }, ..calibrated };
        let c = unaveraged_heads.calibrate(&r, &t, &w).unwrap();
        let expected = ((&r + &c).unwrap() / 2.0).unwrap();
        let diff = (averaged - expected).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(diff < 1e-6);
        // The groupwise scorer makes a candidate's score depend on the other members of its group.
        let grouped =
            heads(CoBertConfig { calibrate: false, prototypes: 2, group: 6, overlap: 0, ..Default::default() });
        let (a, b) = (scores(&grouped, &r, &first), scores(&grouped, &other, &first));
        assert!(a[1..].iter().zip(&b[1..]).all(|(x, y)| x != y));
    }

    #[test]
    fn flops_match_a_hand_count() {
        let config = tiny();
        // One encoder layer over 2 positions, h = 8, i = 16: 8·2·64 + 4·2·8·16 + 4·4·8 = 1024 + 1024 + 128.
        assert_eq!(encoder_flops(&config, 1, 2), 2176.0);
        let heads = heads(CoBertConfig {
            prototypes: 2,
            group: 4,
            overlap: 1,
            calibrator_layers: 1,
            groupwise_layers: 1,
            ..Default::default()
        });
        // k = 5: calibrator 10 pairs × (2176 + 2·64) + 2·10·8 = 23,200; groups (0..4, 3..5) padded to 4:
        // 2 × (one layer over 4 positions: 8·4·64 + 4·4·8·16 + 4·16·8 = 2048 + 2048 + 512, plus 2·4·8).
        assert_eq!(heads.flops(&config, 5), 23_040.0 + 160.0 + 2.0 * (4_608.0 + 64.0));
    }
}
