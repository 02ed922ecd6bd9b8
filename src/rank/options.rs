//! Validation: a request's `RankParams` checked against the limits and completed with the configured
//! defaults into `RankOptions`. Every limit and default of a ranking lives here, for HTTP and CLI alike.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::first_stage::{FirstStageKind, Fusion};
use super::{Engine, Pipeline, RankError, RankParams};
use crate::index::{Bm25Params, Rm3Params};
use crate::preselect::Preselect;
use crate::segment::SegmentOptions;

/// Results per topic when a batch names no k (trec_eval's customary depth).
pub const DEFAULT_BATCH_K: i64 = 1000;

/// Validated ranking options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RankOptions {
    pub k: usize,
    pub pipeline: Pipeline,
    pub bm25: Bm25Params,
    pub rm3: Rm3Params,
    #[serde(default)]
    pub first_stage: FirstStageKind,
    /// The dense and hybrid first stages' bi-encoder: the first of these models that is one (the one named,
    /// else the request's model and the default).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dense_models: Vec<String>,
    /// The hybrid first stage's fusion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hybrid: Option<Fusion>,
    /// Re-ranking pipelines only.
    pub rerank: Option<RerankOptions>,
}

/// How re-ranking pipelines score.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RerankOptions {
    pub model: String,
    /// First-stage candidates re-ranked (whatever k is: beyond them, a ranking continues in first-stage order).
    pub depth: usize,
    pub segments: SegmentOptions,
    /// Weight of the normalized first-stage score, if mixed in.
    pub interpolate: Option<f32>,
    /// Which segments the model reads.
    pub preselect: Preselect,
    /// A decoder reranker's instruction (its recipe's default when none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instruction: Option<String>,
}

/// The ranking parameters of a first stage, which `/rerank` (the client's own candidates) refuses.
pub const FIRST_STAGE_FIELDS: [&str; 7] =
    ["depth", "bm25", "rm3", "interpolate", "first_stage", "dense_model", "hybrid"];

/// What the parameters are for: each use has its defaults, and `/rerank` has no first stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    Search,
    Batch,
    /// The client's own candidates (`/rerank`): k is checked against their number by the caller.
    Rerank,
}

impl Engine {
    /// Validates ranking parameters against the limits and fills in the defaults.
    pub fn options(&self, params: &RankParams, usage: Usage) -> Result<RankOptions, RankError> {
        let limits = &self.limits;
        let default_k = match usage {
            Usage::Batch => DEFAULT_BATCH_K as usize,
            Usage::Search | Usage::Rerank => limits.default_k,
        };
        let default_pipeline = if usage == Usage::Rerank { Pipeline::MaxP } else { Pipeline::Bm25 };
        if usage == Usage::Rerank {
            let given = [
                params.depth.is_some(),
                params.bm25.is_some(),
                params.rm3.is_some(),
                params.interpolate.is_some(),
                params.first_stage.is_some(),
                params.dense_model.is_some(),
                params.hybrid.is_some(),
            ];
            let first_stage = FIRST_STAGE_FIELDS.into_iter().zip(given);
            if let Some((field, _)) = first_stage.into_iter().find(|(_, given)| *given) {
                return Err(RankError::NotApplicable { field, what: "/rerank (there is no first stage)".into() });
            }
        }
        let k = in_range("k", params.k, default_k, limits.max_k)?;
        let depth = in_range("depth", params.depth, limits.default_depth, limits.max_depth)?;
        let pipeline = params.pipeline.as_deref().map_or(Ok(default_pipeline), Pipeline::parse)?;
        // Settings a pipeline would ignore are refused: a client should not believe it ran RM3.
        if params.rm3.is_some() && pipeline != Pipeline::Bm25Rm3 {
            let what = format!("the {} pipeline (only bm25+rm3 takes it)", pipeline.name());
            return Err(RankError::NotApplicable { field: "rm3", what });
        }
        let (first_stage, dense_models, hybrid) = self.first_stage(params, pipeline)?;
        let rerank = if pipeline.needs_model() {
            if self.models.names().is_empty() {
                return Err(RankError::ModelRequired { what: pipeline.name() });
            }
            let segments = params.segments.unwrap_or(self.default_segments);
            segments.validate().map_err(RankError::InvalidSegments)?;
            let model = self.models.check(params.model.as_deref())?;
            let interpolate = match params.interpolate {
                Some(weight) => Some(unit("interpolate", weight).map(|_| weight)?),
                // A bi-encoder mixes in the first stage's score by default (none for `/rerank`'s candidates).
                None if usage != Usage::Rerank && self.is_bi_encoder(&model) => {
                    let weight = self.bi_encoder_interpolate;
                    Some(unit("model.bi_encoder_interpolate", weight).map(|_| weight)?)
                }
                None => None,
            };
            // The configured preselection is MaxP's: a best segment among the selector's picks is most often
            // the best of all (measured), while a sum or a mean over some segments is another score.
            let preselect = params.preselect.clone().unwrap_or_else(|| match pipeline {
                Pipeline::MaxP => self.default_preselect.clone(),
                _ => Preselect::default(),
            });
            self.check_preselect(&preselect)?;
            let instruction = params.instruction.as_deref().map(|i| self.check_instruction(i)).transpose()?;
            Some(RerankOptions { model, depth, segments, interpolate, preselect, instruction })
        } else {
            if let Some(model) = &params.model {
                self.models.check(Some(model))?;
            }
            if params.instruction.is_some() {
                let what = format!("the {} pipeline (a model's instruction is for re-ranking)", pipeline.name());
                return Err(RankError::NotApplicable { field: "instruction", what });
            }
            None
        };
        if usage == Usage::Rerank && rerank.is_none() {
            return Err(RankError::RerankingPipelineRequired { what: "/rerank", pipeline: pipeline.name() });
        }
        let bm25 = params.bm25.unwrap_or(self.bm25);
        within("bm25.k1", bm25.k1 as f64, 0.0, MAX_K1)?;
        unit("bm25.b", bm25.b)?;
        let rm3 = params.rm3.unwrap_or_default();
        within("rm3.fb_docs", rm3.fb_docs as f64, 1.0, limits.max_fb_docs as f64)?;
        within("rm3.fb_terms", rm3.fb_terms as f64, 1.0, limits.max_fb_terms as f64)?;
        unit("rm3.original_query_weight", rm3.original_query_weight)?;
        Ok(RankOptions { k, pipeline, bm25, rm3, first_stage, dense_models, hybrid, rerank })
    }

    /// The first stage, the bi-encoders a dense one may use (in order), and a hybrid one's fusion.
    fn first_stage(
        &self,
        params: &RankParams,
        pipeline: Pipeline,
    ) -> Result<(FirstStageKind, Vec<String>, Option<Fusion>), RankError> {
        let kind = params.first_stage.unwrap_or_default();
        let not_for = |field, what: &str| Err(RankError::NotApplicable { field, what: what.to_string() });
        if params.hybrid.is_some() && kind != FirstStageKind::Hybrid {
            return not_for("hybrid", "a first stage other than hybrid (only hybrid fuses)");
        }
        if kind == FirstStageKind::Bm25 {
            if params.dense_model.is_some() {
                return not_for("dense_model", "the bm25 first stage (dense and hybrid take it)");
            }
            return Ok((kind, vec![], None));
        }
        if kind == FirstStageKind::Dense && pipeline == Pipeline::Bm25Rm3 {
            return not_for("first_stage", "bm25+rm3 as dense (RM3 expands BM25's query: use hybrid, or bm25)");
        }
        if self.models.names().is_empty() {
            return Err(RankError::ModelRequired { what: "a dense or hybrid first stage" });
        }
        let mut models = match &params.dense_model {
            Some(name) => vec![self.models.check(Some(name))?],
            None => vec![self.models.check(params.model.as_deref())?],
        };
        if params.dense_model.is_none() {
            if let Ok(default) = self.models.check(None) {
                if !models.contains(&default) {
                    models.push(default);
                }
            }
        }
        let fusion = (kind == FirstStageKind::Hybrid).then(|| params.hybrid.unwrap_or_default());
        match fusion {
            Some(Fusion::Rrf { rrf_k }) => within("hybrid.rrf_k", rrf_k as f64, 0.0, MAX_RRF_K)?,
            Some(Fusion::Linear { weight, .. }) => unit("hybrid.weight", weight)?,
            None => {}
        }
        Ok((kind, models, fusion))
    }

    /// Whether the named model loads as a bi-encoder (one that does not load is reported when it is used).
    fn is_bi_encoder(&self, name: &str) -> bool {
        let model = self.models.get(name, "re-ranking");
        model.is_ok_and(|m| matches!(m.served.model(), crate::model::Reranker::Bi(_)))
    }

    /// A preselection's counts (1 and up: they only ever cut work) and its selector's model (served).
    fn check_preselect(&self, preselect: &Preselect) -> Result<(), RankError> {
        for (field, value) in [("preselect.per_doc", preselect.per_doc), ("preselect.budget", preselect.budget)] {
            if value == Some(0) {
                return Err(RankError::OutOfRange { field, value: 0.0, min: 1.0, max: usize::MAX as f64 });
            }
        }
        if let Some(name) = preselect.selector.model() {
            self.models.check(Some(name))?;
        }
        Ok(())
    }

    /// An instruction's text, trimmed, bounded as a query is (it is read with one).
    fn check_instruction(&self, instruction: &str) -> Result<String, RankError> {
        let instruction = trimmed(instruction);
        let len = instruction.chars().count();
        match len {
            0 => Err(RankError::InvalidInstruction("empty".into())),
            _ if len > self.limits.max_query_chars => Err(RankError::InvalidInstruction(format!(
                "{len} characters long; the limit is limits.max_query_chars, {}",
                self.limits.max_query_chars
            ))),
            _ => Ok(instruction.to_string()),
        }
    }

    /// A query's text, trimmed, checked against the limits.
    pub fn check_query<'q>(&self, query: &'q str) -> Result<&'q str, RankError> {
        let query = trimmed(query);
        if query.is_empty() {
            return Err(RankError::EmptyQuery);
        }
        let len = query.chars().count();
        if len > self.limits.max_query_chars {
            return Err(RankError::QueryTooLong { len, max: self.limits.max_query_chars });
        }
        Ok(query)
    }
}

/// A text without the spaces and control characters around it: control characters (NUL say) are no more a
/// query or an instruction than spaces are.
fn trimmed(text: &str) -> &str {
    text.trim_matches(|c: char| c.is_whitespace() || c.is_control())
}

/// A count between 1 and `max`, or `default` (capped at `max`) when none is given.
pub(super) fn in_range(
    field: &'static str,
    value: Option<i64>,
    default: usize,
    max: usize,
) -> Result<usize, RankError> {
    let Some(value) = value else { return Ok(default.min(max)) };
    if value < 1 || value as u64 > max as u64 {
        return Err(RankError::OutOfRange { field, value: value as f64, min: 1.0, max: max as f64 });
    }
    Ok(value as usize)
}

/// How many results a page skips: 0 and up, with the page (`k` results) ending within `max_k`.
pub(super) fn offset(value: Option<i64>, k: usize, max_k: usize) -> Result<usize, RankError> {
    let max = max_k.saturating_sub(k);
    match value {
        None => Ok(0),
        Some(value) if (0..=max as i64).contains(&value) => Ok(value as usize),
        Some(value) => Err(RankError::OutOfRange { field: "offset", value: value as f64, min: 0.0, max: max as f64 }),
    }
}

/// A weight between 0 and 1.
fn unit(field: &'static str, value: f32) -> Result<(), RankError> {
    if (0.0..=1.0).contains(&value) {
        return Ok(());
    }
    Err(RankError::OutOfRange { field, value: value as f64, min: 0.0, max: 1.0 })
}

/// RRF's k past which every rank contributes about equally (Elasticsearch's default is 60).
pub const MAX_RRF_K: f64 = 1e6;

/// BM25's k1 past which term frequency no longer saturates in any useful way (tuned values run 0.5 to 3).
pub const MAX_K1: f64 = 100.0;

/// A parameter between `min` and `max` (NaN and infinities are refused).
fn within(field: &'static str, value: f64, min: f64, max: f64) -> Result<(), RankError> {
    if (min..=max).contains(&value) {
        return Ok(());
    }
    Err(RankError::OutOfRange { field, value, min, max })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_checks() {
        assert_eq!(in_range("k", None, 10, 100).unwrap(), 10);
        assert_eq!(in_range("k", Some(100), 10, 100).unwrap(), 100);
        assert!(matches!(in_range("k", Some(0), 10, 100), Err(RankError::OutOfRange { value: 0.0, .. })));
        assert!(in_range("k", Some(101), 10, 100).is_err());
        assert!(in_range("k", Some(-5), 10, 100).is_err());
        assert!(unit("interpolate", 1.5).is_err() && unit("interpolate", 0.0).is_ok());
        assert!(within("bm25.k1", f64::NAN, 0.0, MAX_K1).is_err());
        assert!(within("bm25.k1", f32::INFINITY as f64, 0.0, MAX_K1).is_err());
        let err = within("bm25.k1", -1.0, 0.0, MAX_K1).unwrap_err();
        assert_eq!(err.to_string(), "bm25.k1 must be between 0 and 100, got -1");
    }

    #[test]
    fn a_page_ends_within_max_k() {
        assert_eq!(offset(None, 10, 100).unwrap(), 0);
        assert_eq!(offset(Some(90), 10, 100).unwrap(), 90);
        let err = offset(Some(91), 10, 100).unwrap_err();
        assert_eq!(err.to_string(), "offset must be between 0 and 90, got 91");
        assert!(offset(Some(-1), 10, 100).is_err());
    }
}
