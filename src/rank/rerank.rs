//! The re-ranking stage: each first-stage candidate is cut into segments, the model scores every (query,
//! segment) pair, and the segment scores are aggregated into the document's score (FirstP, MaxP, SumP,
//! AvgP), keeping every segment's score as evidence.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use utoipa::ToSchema;

use super::models::LoadedModel;
use super::{Pipeline, RankError, Ranked, RerankOptions};
use crate::index::StoredDoc;
use crate::model::{Cancel, Reranker, Scores, Served, VectorFile};
use crate::segment::{self, Segment, SegmentOptions, Strategy};

/// One segment with the model's score.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ScoredSegment {
    pub index: usize,
    /// UTF-8 byte offsets into the document's text.
    pub start: usize,
    pub end: usize,
    pub score: f32,
    /// The segment's text, when the request asks for it (`segment_text`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// Why a re-ranked document scored what it did: its text, every segment's score, and the aggregated
/// model score (before any interpolation with the first stage).
pub struct Evidence {
    pub doc: StoredDoc,
    pub segments: Vec<ScoredSegment>,
    pub model_score: f32,
}

impl Evidence {
    /// The highest-scoring segment (the first of equals).
    pub fn best(&self) -> Option<&ScoredSegment> {
        self.segments.iter().fold(None, |best: Option<&ScoredSegment>, s| match best {
            Some(b) if b.score >= s.score => Some(b),
            _ => Some(s),
        })
    }
}

/// The document score from its segment scores (in document order).
pub fn aggregate(pipeline: Pipeline, scores: &[f32]) -> f32 {
    if scores.is_empty() {
        return f32::NEG_INFINITY;
    }
    match pipeline {
        Pipeline::FirstP => scores[0],
        // Co-BERT's first round is MaxP.
        Pipeline::MaxP | Pipeline::CoBert => scores.iter().copied().fold(f32::NEG_INFINITY, f32::max),
        Pipeline::SumP => scores.iter().sum(),
        Pipeline::AvgP => scores.iter().sum::<f32>() / scores.len() as f32,
        Pipeline::Bm25 | Pipeline::Bm25Rm3 => unreachable!("first-stage pipelines are not aggregated"),
    }
}

/// Min-max normalizes both score lists over the candidates and mixes them: `weight` × first stage +
/// (1 − `weight`) × model. A list whose scores are all equal normalizes to zeros.
pub fn interpolate(first_stage: &[f32], model: &[f32], weight: f32) -> Vec<f32> {
    fn normalized(scores: &[f32]) -> Vec<f32> {
        let (lo, hi) = scores.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &s| (lo.min(s), hi.max(s)));
        scores.iter().map(|&s| if hi > lo { (s - lo) / (hi - lo) } else { 0.0 }).collect()
    }
    normalized(first_stage).into_iter().zip(normalized(model)).map(|(f, m)| weight * f + (1.0 - weight) * m).collect()
}

/// Documents' segments, which depend on the document and the strategy but not on the query: cut once.
#[derive(Default)]
pub struct SegmentCache {
    entries: Mutex<HashMap<(u64, Strategy), Segments>>,
}

/// A document's segments, shared between the cache and its readers.
type Segments = Arc<Vec<Segment>>;

fn text_hash(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// A document to re-rank: from the first stage, or given by the client.
pub struct Candidate {
    pub first_stage_score: Option<f32>,
    pub doc: StoredDoc,
}

/// Cached segmentations (a few hundred bytes each).
const MAX_CACHED_SEGMENTATIONS: usize = 100_000;

impl SegmentCache {
    fn get(&self, text: &str, strategy: Strategy, model: &Reranker) -> Segments {
        let key = (text_hash(text), strategy);
        if let Some(segments) = self.entries.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return segments.clone();
        }
        let mut segments = segment::segment(text, strategy, model, None);
        if segments.is_empty() {
            // An empty text is still a document: score the empty passage rather than drop it.
            segments.push(Segment { index: 0, start: 0, end: 0 });
        }
        let segments = Arc::new(segments);
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= MAX_CACHED_SEGMENTATIONS {
            entries.clear();
        }
        entries.insert(key, segments.clone());
        segments
    }

    /// A document's first `cap` segments with the text the model reads for each: the segment, after the
    /// title when titles are repeated. A repeated title takes its tokens out of the segment budget, so
    /// segments are still never cut.
    pub fn inputs<'d>(
        &self,
        served: &Served,
        options: &SegmentOptions,
        doc: &'d StoredDoc,
        cap: usize,
    ) -> Vec<(Segment, Cow<'d, str>)> {
        let prefix = segment::title_prefix(&doc.title, options.repeat_title);
        let title_tokens = prefix.as_deref().map_or(0, |p| segment::TokenCounter::count(served.model(), p));
        let strategy = options.strategy(served.segment_budget().saturating_sub(title_tokens).max(1));
        let segments = self.get(&doc.text, strategy, served.model());
        segments.iter().take(cap).map(|s| (*s, segment::model_input(prefix.as_deref(), &doc.text, s))).collect()
    }
}

/// Everything a re-ranking needs besides the candidates.
pub struct Reranking<'a> {
    pub model: &'a LoadedModel,
    /// The model's outputs on disk for the collection (`Models::store`).
    pub store: Option<&'a VectorFile>,
    pub segments: &'a SegmentCache,
    pub pipeline: Pipeline,
    pub options: &'a RerankOptions,
    pub query: &'a str,
    pub cancel: &'a Cancel,
}

/// The re-ranked candidates, best first, and what the model cost.
pub struct Reranked {
    pub ranked: Vec<Ranked>,
    pub scores: Scores,
    /// (query, segment) pairs scored, cached ones included.
    pub pairs: usize,
}

/// Re-scores the candidates with the model; best first (ties keep the given order).
pub fn rerank(job: &Reranking<'_>, docs: Vec<Candidate>) -> Result<Reranked, RankError> {
    let served = &job.model.served;
    // FirstP needs only the first segment; the others score them all.
    let cap = if job.pipeline == Pipeline::FirstP { 1 } else { usize::MAX };
    let mut pairs: Vec<(usize, Segment)> = Vec::new();
    let mut texts: Vec<Cow<'_, str>> = Vec::new();
    for (d, candidate) in docs.iter().enumerate() {
        for (segment, text) in job.segments.inputs(served, &job.options.segments, &candidate.doc, cap) {
            pairs.push((d, segment));
            texts.push(text);
        }
    }
    let texts: Vec<&str> = texts.iter().map(|t| t.as_ref()).collect();
    let mut scores = served.score(job.query, &texts, job.store, job.cancel).map_err(RankError::Model)?;
    let mut per_doc: Vec<Vec<ScoredSegment>> = vec![Vec::new(); docs.len()];
    let mut best_input: Vec<Option<(f32, usize)>> = vec![None; docs.len()];
    for (i, ((d, s), &score)) in pairs.iter().zip(&scores.scores).enumerate() {
        per_doc[*d].push(ScoredSegment { index: s.index, start: s.start, end: s.end, score, text: None });
        if best_input[*d].is_none_or(|(best, _)| score > best) {
            best_input[*d] = Some((score, i));
        }
    }
    let mut model_scores: Vec<f32> = per_doc
        .iter()
        .map(|segments| aggregate(job.pipeline, &segments.iter().map(|s| s.score).collect::<Vec<_>>()))
        .collect();
    if job.pipeline == Pipeline::CoBert {
        let best: Vec<&str> = best_input.iter().map(|b| b.map_or("", |(_, i)| texts[i])).collect();
        let (rescored, flops) = cobert(job, &best, &model_scores)?;
        model_scores = rescored;
        scores.flops = scores.flops.map(|f| f + flops);
    }
    let finals = match job.options.interpolate {
        Some(weight) => {
            let first: Option<Vec<f32>> = docs.iter().map(|c| c.first_stage_score).collect();
            let first = first.ok_or_else(|| {
                RankError::InvalidParameter("interpolate needs first-stage scores, which given texts lack".into())
            })?;
            interpolate(&first, &model_scores, weight)
        }
        None => model_scores.clone(),
    };
    let mut ranked: Vec<Ranked> = docs
        .into_iter()
        .zip(per_doc)
        .zip(model_scores.into_iter().zip(finals))
        .map(|((Candidate { first_stage_score, doc }, segments), (model_score, score))| Ranked {
            docid: doc.docid.clone(),
            first_stage_score,
            address: None,
            score,
            evidence: Some(Evidence { doc, segments, model_score }),
        })
        .collect();
    // A stable sort keeps the first-stage order among equal scores.
    ranked.sort_by(|a, b| b.score.total_cmp(&a.score));
    Ok(Reranked { ranked, scores, pairs: pairs.len() })
}

/// Co-BERT's second round: the heads over the candidates' best passages in first-round order; the scores
/// come back in the candidates' order, with the second round's FLOPs: the heads', and the passes of
/// Co-BERT's own backbone over the best passages when it has one (else those passes are the first round's).
fn cobert(job: &Reranking<'_>, best: &[&str], first_round: &[f32]) -> Result<(Vec<f32>, f64), RankError> {
    let served = &job.model.served;
    let crate::model::Reranker::CoBert(model) = served.model() else {
        return Err(RankError::InvalidParameter(format!(
            "pipeline cobert needs a Co-BERT model (a directory with {}), and {} is a {}",
            crate::model::cobert::CONFIG_FILE,
            job.model.name,
            served.model().kind()
        )));
    };
    let mut order: Vec<usize> = (0..best.len()).collect();
    order.sort_by(|&a, &b| first_round[b].total_cmp(&first_round[a]));
    let texts: Vec<&str> = order.iter().map(|&d| best[d]).collect();
    let outputs = served.interactions(job.query, &texts, job.store, job.cancel).map_err(RankError::Model)?;
    let hidden = model.backbone.hidden_size;
    let states: Vec<&[f32]> = outputs.iter().map(|o| &o[1..1 + hidden]).collect();
    let ordered_first: Vec<f32> = order.iter().map(|&d| first_round[d]).collect();
    let rescored = model.rescore(&states, &ordered_first).map_err(RankError::Model)?;
    let mut scores = vec![0f32; best.len()];
    for (&d, s) in order.iter().zip(rescored) {
        scores[d] = s;
    }
    let passes: f64 = match &model.own {
        Some(own) => outputs.iter().map(|o| own.pair_flops(o[o.len() - 1] as usize)).sum(),
        None => 0.0,
    };
    Ok((scores, model.heads.flops(&model.backbone, best.len()) + passes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregations() {
        let s = [1.0, 3.0, -2.0, 2.0];
        assert_eq!(aggregate(Pipeline::FirstP, &s), 1.0);
        assert_eq!(aggregate(Pipeline::MaxP, &s), 3.0);
        assert_eq!(aggregate(Pipeline::SumP, &s), 4.0);
        assert_eq!(aggregate(Pipeline::AvgP, &s), 1.0);
        assert_eq!(aggregate(Pipeline::MaxP, &[]), f32::NEG_INFINITY);
    }

    #[test]
    fn interpolation_mixes_normalized_scores() {
        let mixed = interpolate(&[10.0, 20.0, 30.0], &[1.0, 0.0, 0.5], 0.25);
        let expected = [0.75, 0.125, 0.625];
        for (m, e) in mixed.iter().zip(expected) {
            assert!((m - e).abs() < 1e-6, "{mixed:?}");
        }
        assert_eq!(interpolate(&[5.0, 5.0], &[1.0, 3.0], 1.0), [0.0, 0.0]);
        assert_eq!(interpolate(&[1.0, 2.0], &[7.0, 3.0], 0.0), [1.0, 0.0]);
    }
}
