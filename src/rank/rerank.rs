//! The re-ranking stage: each first-stage candidate is cut into segments, the model scores every (query,
//! segment) pair, and the segment scores are aggregated into the document's score (FirstP, MaxP, SumP,
//! AvgP), keeping every segment's score as evidence.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use utoipa::ToSchema;

use super::{Pipeline, RankError, Ranked};
use crate::index::StoredDoc;
use crate::model::{Reranker, ScoreOptions};
use crate::segment::{self, Segment, Strategy};

/// One segment with the model's score.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ScoredSegment {
    pub index: usize,
    /// UTF-8 byte offsets into the document's text.
    pub start: usize,
    pub end: usize,
    pub score: f32,
}

/// Why a re-ranked document scored what it did: its text and every segment's score.
pub struct Evidence {
    pub doc: StoredDoc,
    pub segments: Vec<ScoredSegment>,
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
        Pipeline::MaxP => scores.iter().copied().fold(f32::NEG_INFINITY, f32::max),
        Pipeline::SumP => scores.iter().sum(),
        Pipeline::AvgP => scores.iter().sum::<f32>() / scores.len() as f32,
        Pipeline::Bm25 | Pipeline::Bm25Rm3 => unreachable!("first-stage pipelines are not aggregated"),
    }
}

/// Documents' segments, which depend on the document and the budget but not on the query: cut once.
#[derive(Default)]
pub struct SegmentCache {
    entries: Mutex<HashMap<(u64, usize), Arc<Vec<Segment>>>>,
}

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
    fn get(&self, text: &str, max_tokens: usize, model: &Reranker) -> Arc<Vec<Segment>> {
        let key = (text_hash(text), max_tokens);
        if let Some(segments) = self.entries.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return segments.clone();
        }
        let mut segments = segment::segment(text, Strategy::Sentences { max_tokens }, model, None);
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
}

/// Re-scores the candidates with the model; best first (ties keep the given order).
pub fn rerank(
    model: &Reranker,
    options: &ScoreOptions,
    cache: &SegmentCache,
    pipeline: Pipeline,
    query: &str,
    docs: Vec<Candidate>,
) -> Result<Vec<Ranked>, RankError> {
    let max_tokens = model.segment_budget(options);
    // FirstP needs only the first segment; the others score them all.
    let cap = if pipeline == Pipeline::FirstP { 1 } else { usize::MAX };
    let mut pairs: Vec<(usize, Segment)> = Vec::new();
    for (d, candidate) in docs.iter().enumerate() {
        let segments = cache.get(&candidate.doc.text, max_tokens, model);
        pairs.extend(segments.iter().take(cap).map(|s| (d, *s)));
    }
    let texts: Vec<&str> = pairs.iter().map(|(d, s)| s.text(&docs[*d].doc.text)).collect();
    let scores = model.score(query, &texts, options).map_err(RankError::Model)?;
    let mut per_doc: Vec<Vec<ScoredSegment>> = vec![Vec::new(); docs.len()];
    for ((d, s), score) in pairs.into_iter().zip(scores) {
        per_doc[d].push(ScoredSegment { index: s.index, start: s.start, end: s.end, score });
    }
    let mut out: Vec<Ranked> = docs
        .into_iter()
        .zip(per_doc)
        .map(|(Candidate { first_stage_score, doc }, segments)| {
            let score = aggregate(pipeline, &segments.iter().map(|s| s.score).collect::<Vec<_>>());
            Ranked {
                docid: doc.docid.clone(),
                first_stage_score,
                address: None,
                score,
                evidence: Some(Evidence { doc, segments }),
            }
        })
        .collect();
    // A stable sort keeps the first-stage order among equal scores.
    out.sort_by(|a, b| b.score.total_cmp(&a.score));
    Ok(out)
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
}
