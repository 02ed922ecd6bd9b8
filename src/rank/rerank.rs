//! The re-ranking stage: each first-stage candidate is cut into segments, the model scores every (query,
//! segment) pair, and the segment scores are aggregated into the document's score (FirstP, MaxP, SumP,
//! AvgP), keeping every segment's score as evidence.

use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use parking_lot::Mutex;

use super::bags::{Bag, BagCache};
use super::first_stage::minmax;
use super::{Pipeline, RankError, Ranked, RerankOptions, ScoredSegment};
use crate::index::{analyzer, bm25, Bm25Params, IndexError, Snapshot, StoredDoc};
use crate::model::{Cancel, Output, Reranker, Scores, Served, VectorFile};
use crate::preselect::Preselect;
use crate::segment::{self, Segment, SegmentOptions, Strategy};

/// Why a re-ranked document scored what it did: its text, every segment's score, and the aggregated
/// model score (before any interpolation with the first stage; none when the model read no segment of it).
pub struct Evidence {
    pub doc: StoredDoc,
    pub segments: Vec<ScoredSegment>,
    pub model_score: Option<f32>,
}

impl Evidence {
    /// The highest-scoring segment the model read (the first of equals).
    pub fn best(&self) -> Option<&ScoredSegment> {
        let scored: Vec<&ScoredSegment> = self.segments.iter().filter(|s| s.scored).collect();
        best(&scored.iter().filter_map(|s| s.score).collect::<Vec<_>>()).map(|i| scored[i])
    }

    /// The model's scores of the segments it read, in document order.
    fn scores(segments: &[ScoredSegment]) -> Vec<f32> {
        segments.iter().filter_map(|s| s.score).collect()
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
/// (1 − `weight`) × model. A list whose scores are all equal normalizes to zeros. (A weight of 0 is not mixed:
/// the model's scores stay as they are.)
pub fn interpolate(first_stage: &[f32], model: &[f32], weight: f32) -> Vec<f32> {
    minmax(first_stage).into_iter().zip(minmax(model)).map(|(f, m)| weight * f + (1.0 - weight) * m).collect()
}

/// Documents' segments, which depend on the document, the strategy and the model's tokenizer but not on the
/// query: cut once; and the bm25 selector's bags of their terms (keyed by the segments' ranges), analyzed once.
#[derive(Default)]
pub struct SegmentCache {
    entries: Mutex<HashMap<SegmentationKey, Segments>>,
    bags: BagCache,
}

/// All that a segmentation depends on: the text, the strategy (with its token budget) and the tokenizer that
/// counts the tokens (`Reranker::tokenizer_fingerprint`). Models of another tokenizer cut the same text
/// elsewhere, so they never share a segmentation, whichever of them asked first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct SegmentationKey {
    text: u64,
    strategy: Strategy,
    tokenizer: u64,
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
        let key = SegmentationKey { text: text_hash(text), strategy, tokenizer: model.tokenizer_fingerprint() };
        if let Some(segments) = self.entries.lock().get(&key) {
            return segments.clone();
        }
        let mut segments = segment::segment(text, strategy, model, None);
        if segments.is_empty() {
            // An empty text is still a document: score the empty passage rather than drop it.
            segments.push(Segment { index: 0, start: 0, end: 0 });
        }
        let segments = Arc::new(segments);
        let mut entries = self.entries.lock();
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

/// A preselection to run: its options and the selector, ready to score.
pub struct Selecting<'a> {
    pub options: &'a Preselect,
    pub scorer: SelectorScorer<'a>,
}

pub enum SelectorScorer<'a> {
    /// BM25 with the collection's IDF when there is a collection, else the candidates' segments' own.
    Bm25 { snapshot: Option<&'a Snapshot<'a>>, params: Bm25Params },
    /// A served model's scores (a bi-encoder's cosine, a cross-encoder's logit).
    Model { served: &'a Served, store: Option<&'a VectorFile> },
}

impl Selecting<'_> {
    /// The selector's score of every segment of every candidate.
    fn score(
        &self,
        query: &str,
        docs: &[Candidate],
        inputs: &[Vec<(Segment, Cow<'_, str>)>],
        bags: &BagCache,
        cancel: &Cancel,
    ) -> Result<Vec<Vec<f32>>, RankError> {
        let flat: Vec<f32> = match &self.scorer {
            SelectorScorer::Bm25 { snapshot, params } => {
                // The segment's own text: the selector scores segments, whatever the model reads around them.
                let segmented: Vec<(&str, Vec<Range<usize>>)> = docs
                    .iter()
                    .zip(inputs)
                    .map(|(c, segments)| (c.doc.text.as_str(), segments.iter().map(|(s, _)| s.start..s.end).collect()))
                    .collect();
                let query = analyzer::terms(query);
                let bags = bags.bags(&segmented, &query);
                let passages: Vec<&Bag> = bags.docs.iter().flat_map(|d| d.iter()).collect();
                let tf = |p: usize, i: usize| passages[p].tf(bags.query[i]);
                let idfs: Vec<f32> = match snapshot {
                    Some(snapshot) => {
                        let n = snapshot.stats()?.num_docs;
                        let idf = |t: &String| Ok(bm25::idf(n, snapshot.doc_freq(t)?));
                        query.iter().map(idf).collect::<Result<_, IndexError>>()?
                    }
                    None => (0..query.len())
                        .map(|i| {
                            let df = (0..passages.len()).filter(|&p| tf(p, i) > 0).count();
                            bm25::idf(passages.len() as u64, df as u64)
                        })
                        .collect(),
                };
                let lens: Vec<u64> = passages.iter().map(|b| b.len).collect();
                bm25::score_passages(&idfs, &lens, tf, *params)
            }
            SelectorScorer::Model { served, store } => {
                let texts: Vec<&str> = inputs.iter().flatten().map(|(_, text)| text.as_ref()).collect();
                served.score(query, None, &texts, *store, cancel).map_err(RankError::Model)?.scores
            }
        };
        let mut flat = flat.into_iter();
        Ok(inputs.iter().map(|segments| flat.by_ref().take(segments.len()).collect()).collect())
    }
}

/// Everything a re-ranking needs besides the candidates.
pub struct Reranking<'a> {
    /// The model's name (for messages) and the model as served.
    pub name: &'a str,
    pub served: &'a Served,
    /// The model's outputs on disk for the collection (`Models::store`).
    pub store: Option<&'a VectorFile>,
    pub segments: &'a SegmentCache,
    pub pipeline: Pipeline,
    pub options: &'a RerankOptions,
    pub query: &'a str,
    pub cancel: &'a Cancel,
    /// Which segments the model reads, when a preselection is active (never for FirstP, which reads one).
    pub preselect: Option<Selecting<'a>>,
}

/// The re-ranked candidates, best first, and what the model cost.
pub struct Reranked {
    pub ranked: Vec<Ranked>,
    pub scores: Scores,
    /// (query, segment) pairs sent to the model, cached ones included.
    pub pairs: usize,
    /// Segments of the candidates seen (a preselection sends the model only some of them).
    pub segments: usize,
}

/// Every candidate's segments with the model's scores, and the text the model read for each candidate's best.
struct Scored<'d> {
    per_doc: Vec<Vec<ScoredSegment>>,
    best_text: Vec<Option<Cow<'d, str>>>,
    scores: Scores,
    pairs: usize,
    segments: usize,
}

/// Scores the candidates' segments (FirstP: the first only; with a preselection, those it picks), as the
/// server cuts and batches them.
fn score_segments<'d>(job: &Reranking<'_>, docs: &'d [Candidate]) -> Result<Scored<'d>, RankError> {
    let cap = if job.pipeline == Pipeline::FirstP { 1 } else { usize::MAX };
    let inputs: Vec<Vec<(Segment, Cow<'d, str>)>> =
        docs.iter().map(|c| job.segments.inputs(job.served, &job.options.segments, &c.doc, cap)).collect();
    let preselect = job.preselect.as_ref().filter(|_| job.pipeline != Pipeline::FirstP);
    let bags = &job.segments.bags;
    let selector_scores = preselect.map(|p| p.score(job.query, docs, &inputs, bags, job.cancel)).transpose()?;
    let chosen: Vec<Vec<usize>> = match (preselect, &selector_scores) {
        (Some(p), Some(scores)) => p.options.choose(scores),
        _ => inputs.iter().map(|segments| (0..segments.len()).collect()).collect(),
    };
    let texts: Vec<&str> =
        chosen.iter().zip(&inputs).flat_map(|(c, segments)| c.iter().map(|&i| segments[i].1.as_ref())).collect();
    let instruction = job.options.instruction.as_deref();
    if instruction.is_some() && job.served.model().recipe().is_none() {
        let what = format!("model {} (an encoder: instructions are read by decoder rerankers)", job.name);
        return Err(RankError::NotApplicable { field: "instruction", what });
    }
    let scores = job.served.score(job.query, instruction, &texts, job.store, job.cancel).map_err(RankError::Model)?;
    let mut model_scores = scores.scores.iter().copied();
    let mut per_doc: Vec<Vec<ScoredSegment>> = Vec::with_capacity(docs.len());
    let mut best_text: Vec<Option<Cow<'d, str>>> = Vec::with_capacity(docs.len());
    for (d, segments) in inputs.iter().enumerate() {
        let mut evidence: Vec<ScoredSegment> = segments
            .iter()
            .enumerate()
            .map(|(i, (s, _))| ScoredSegment {
                index: s.index,
                start: s.start,
                end: s.end,
                scored: false,
                score: None,
                selector_score: selector_scores.as_ref().map(|scores| scores[d][i]),
                text: None,
            })
            .collect();
        for &i in &chosen[d] {
            evidence[i].scored = true;
            evidence[i].score = model_scores.next();
        }
        best_text.push(best(&Evidence::scores(&evidence)).map(|b| segments[chosen[d][b]].1.clone()));
        per_doc.push(evidence);
    }
    let segments = inputs.iter().map(Vec::len).sum();
    Ok(Scored { per_doc, best_text, scores, pairs: texts.len(), segments })
}

/// The index of the highest score (the first of equals): MaxP's choice.
pub fn best(scores: &[f32]) -> Option<usize> {
    scores
        .iter()
        .enumerate()
        .fold(None, |best: Option<(usize, f32)>, (i, &s)| match best {
            Some((_, b)) if b >= s => best,
            _ => Some((i, s)),
        })
        .map(|(i, _)| i)
}

/// Re-scores the candidates with the model; best first (ties keep the given order). Candidates the model read
/// no segment of (a preselection's budget did not reach them) follow every scored one, in the given order.
pub fn rerank(job: &Reranking<'_>, docs: Vec<Candidate>) -> Result<Reranked, RankError> {
    let Scored { per_doc, best_text, mut scores, pairs, segments } = score_segments(job, &docs)?;
    // SumP and AvgP aggregate the scored segments only.
    let mut model_scores: Vec<Option<f32>> = per_doc
        .iter()
        .map(|segments| Some(Evidence::scores(segments)).filter(|s| !s.is_empty()).map(|s| aggregate(job.pipeline, &s)))
        .collect();
    if job.pipeline == Pipeline::CoBert {
        let maxp: Vec<f32> = model_scores.iter().map(|s| s.unwrap_or(f32::NEG_INFINITY)).collect();
        let round = cobert_first_round(job, &best_text, &maxp)?;
        let (rescored, flops) = cobert(job, &round, docs.len())?;
        model_scores = rescored.into_iter().zip(&model_scores).map(|(s, read)| read.map(|_| s)).collect();
        scores.flops = scores.flops.map(|f| f + flops);
    }
    // Interpolation and the order are over the candidates the model read; the others follow them.
    let read_scores: Vec<f32> = model_scores.iter().flatten().copied().collect();
    let finals = match job.options.interpolate {
        Some(weight) if weight > 0.0 => {
            let first: Option<Vec<f32>> =
                docs.iter().zip(&model_scores).filter(|(_, s)| s.is_some()).map(|(c, _)| c.first_stage_score).collect();
            interpolate(&first.ok_or(RankError::NoFirstStage)?, &read_scores, weight)
        }
        _ => read_scores,
    };
    let mut finals = finals.into_iter();
    let (mut ranked, mut tail) = (Vec::with_capacity(docs.len()), Vec::new());
    for ((Candidate { first_stage_score, doc }, segments), model_score) in
        docs.into_iter().zip(per_doc).zip(model_scores)
    {
        let docid = doc.docid.clone();
        let evidence = Some(Evidence { doc, segments, model_score });
        let doc = |score| Ranked { docid, first_stage_score, address: None, score, evidence };
        match model_score {
            Some(_) => ranked.push(doc(finals.next().expect("a final score per candidate read"))),
            // Scored below the others by `continue_below`.
            None => tail.push(doc(f32::NEG_INFINITY)),
        }
    }
    // A stable sort keeps the first-stage order among equal scores.
    ranked.sort_by(|a, b| b.score.total_cmp(&a.score));
    super::continue_below(&mut ranked, tail);
    Ok(Reranked { ranked, scores, pairs, segments })
}

/// A candidate's best passage in Co-BERT's first round.
#[derive(Debug, Clone)]
pub struct FirstRoundPassage {
    /// The candidate's position among those given.
    pub candidate: usize,
    /// Its MaxP score.
    pub score: f32,
    /// The best passage as the model read it (title prefix included).
    pub text: String,
    /// The model's output for it: the logit, the final `[CLS]` state, the pair's length.
    pub output: Output,
}

/// Co-BERT's first round, as the `cobert` pipeline runs it: MaxP over the candidates, then each one's best
/// passage with its `[CLS]` state (read from the first pass's cache), best first (ties keep the given order).
/// Candidates without a segment are left out. Co-BERT's training caches its first round through this.
pub fn first_round(job: &Reranking<'_>, docs: &[Candidate]) -> Result<Vec<FirstRoundPassage>, RankError> {
    let Scored { per_doc, best_text, .. } = score_segments(job, docs)?;
    let maxp: Vec<f32> = per_doc.iter().map(|s| aggregate(Pipeline::MaxP, &Evidence::scores(s))).collect();
    cobert_first_round(job, &best_text, &maxp)
}

fn cobert_first_round(
    job: &Reranking<'_>,
    best_text: &[Option<Cow<'_, str>>],
    first_round: &[f32],
) -> Result<Vec<FirstRoundPassage>, RankError> {
    let mut order: Vec<usize> = (0..best_text.len()).filter(|&d| best_text[d].is_some()).collect();
    order.sort_by(|&a, &b| first_round[b].total_cmp(&first_round[a]));
    let texts: Vec<&str> = order.iter().map(|&d| best_text[d].as_deref().unwrap_or_default()).collect();
    let outputs = job.served.interactions(job.query, &texts, job.store, job.cancel).map_err(|e| match e {
        crate::model::ModelError::Unsupported(_) => not_cobert(job),
        e => RankError::Model(e),
    })?;
    Ok(order
        .iter()
        .zip(texts)
        .zip(outputs)
        .map(|((&candidate, text), output)| FirstRoundPassage {
            candidate,
            score: first_round[candidate],
            text: text.to_string(),
            output,
        })
        .collect())
}

fn not_cobert(job: &Reranking<'_>) -> RankError {
    RankError::PipelineUnavailable {
        pipeline: Pipeline::CoBert.name(),
        model: job.name.to_string(),
        reason: format!(
            "it needs a Co-BERT model (a directory with {}), and this is a {}",
            crate::model::cobert::CONFIG_FILE,
            job.served.model().kind()
        ),
    }
}

/// Co-BERT's second round: the heads over the first round's best passages; the scores come back in the
/// candidates' order (one without a passage keeps MaxP's empty score), with the second round's FLOPs: the
/// heads', and the passes of Co-BERT's own backbone over the best passages when it has one (else those
/// passes are the first round's).
fn cobert(job: &Reranking<'_>, round: &[FirstRoundPassage], candidates: usize) -> Result<(Vec<f32>, f64), RankError> {
    let Reranker::CoBert(model) = job.served.model() else { return Err(not_cobert(job)) };
    let hidden = model.backbone.hidden_size;
    let states: Vec<&[f32]> = round.iter().map(|p| &p.output[1..1 + hidden]).collect();
    let first: Vec<f32> = round.iter().map(|p| p.score).collect();
    let rescored = model.rescore(&states, &first).map_err(RankError::Model)?;
    let mut scores = vec![f32::NEG_INFINITY; candidates];
    for (p, s) in round.iter().zip(rescored) {
        scores[p.candidate] = s;
    }
    let passes: f64 = match &model.own {
        Some(own) => round.iter().map(|p| own.pair_flops(p.output[p.output.len() - 1] as usize)).sum(),
        None => 0.0,
    };
    Ok((scores, model.heads.flops(&model.backbone, round.len()) + passes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 51: a second model with another tokenizer and the same budget read the first model's segments.
    #[test]
    fn each_tokenizer_gets_its_own_segmentation_and_models_of_one_tokenizer_share_it() {
        use crate::model::Kind;
        let load = |name: &str| {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models").join(name);
            Reranker::load(&dir, &candle_core::Device::Cpu, candle_core::DType::F32, Kind::Auto, None).unwrap()
        };
        let (xlmr, modern, modern_cls) = (load("xlm-roberta-bi"), load("modernbert-bi"), load("modernbert-cls"));
        let text = "Super Bowl 50 was an American football game. The Denver Broncos defeated the Carolina \
                    Panthers 24-10. It was played on February 7, 2016, at Levi's Stadium in Santa Clara. "
            .repeat(6);
        let strategy = Strategy::Sentences { max_tokens: 24 };
        let own = |model: &Reranker| segment::segment(&text, strategy, model, None);
        assert_ne!(own(&xlmr), own(&modern), "the two tokenizers cut the text apart");
        for order in [[&xlmr, &modern], [&modern, &xlmr]] {
            let cache = SegmentCache::default();
            for model in order {
                assert_eq!(*cache.get(&text, strategy, model), own(model), "{}", model.kind());
            }
        }
        let cache = SegmentCache::default();
        let (bi, cross) = (cache.get(&text, strategy, &modern), cache.get(&text, strategy, &modern_cls));
        assert!(Arc::ptr_eq(&bi, &cross), "one tokenizer file: one segmentation");
    }

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
