//! The dev split: a sample of queries with their BM25 candidates, re-ranked as the server would (every
//! segment at the model's full budget, MaxP — FirstP for a FirstP model), scored for model selection.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{DevMeasure, Method, TrainError, TrainOptions};
use crate::eval::{self, EvalOptions, Measure, Qrels, Run, Scored};
use crate::index::{Bm25Params, Collection};
use crate::model::{CrossEncoder, Encoded};
use crate::segment::{self, Strategy, TokenCounter};

pub struct DevSet {
    /// (qid, query, candidate docids in BM25 order).
    queries: Vec<(String, String, Vec<String>)>,
    /// Candidate documents: title prefix and text, cut when first scored.
    docs: HashMap<String, (Option<String>, String)>,
    qrels: Qrels,
}

impl DevSet {
    pub fn new(
        collection: &Collection,
        topics: &[(String, String)],
        qrels: &Qrels,
        qids: &BTreeSet<String>,
        options: &TrainOptions,
    ) -> Result<DevSet, TrainError> {
        let mut queries = Vec::new();
        let mut docs = HashMap::new();
        for (qid, text) in topics.iter().filter(|(q, _)| qids.contains(q)) {
            let hits = collection.search(text, options.dev_depth, Bm25Params::default())?;
            for hit in &hits {
                if !docs.contains_key(&hit.docid) {
                    if let Some(doc) = collection.get(&hit.docid)? {
                        docs.insert(
                            hit.docid.clone(),
                            (segment::title_prefix(&doc.title, options.repeat_title), doc.text),
                        );
                    }
                }
            }
            queries.push((qid.clone(), text.clone(), hits.into_iter().map(|h| h.docid).collect()));
        }
        let topics: BTreeMap<_, _> =
            qrels.topics.iter().filter(|(q, _)| qids.contains(*q)).map(|(q, j)| (q.clone(), j.clone())).collect();
        Ok(DevSet { queries, docs, qrels: Qrels { topics } })
    }

    pub fn len(&self) -> usize {
        self.queries.len()
    }

    /// The dev measure, every measure computed, and the run.
    pub fn evaluate(
        &self,
        scorer: &CrossEncoder,
        options: &TrainOptions,
    ) -> Result<(f64, BTreeMap<String, f64>, Run), TrainError> {
        let first_only = options.method == Method::Firstp;
        let mut segments: HashMap<&str, Vec<String>> = HashMap::new();
        for (docid, (prefix, text)) in &self.docs {
            segments.insert(docid, inference_inputs(prefix.as_deref(), text, scorer, options, first_only.then_some(1)));
        }
        let mut encoded = Vec::new();
        let mut owners = Vec::new();
        for (q, (_, query, candidates)) in self.queries.iter().enumerate() {
            for (d, docid) in candidates.iter().enumerate() {
                for input in segments.get(docid.as_str()).into_iter().flatten() {
                    encoded.push(scorer.encode(query, input, options.max_length, options.max_query_tokens)?);
                    owners.push((q, d));
                }
            }
        }
        let scores = score_batched(scorer, &encoded, options.batch_tokens)?;
        let mut best: HashMap<(usize, usize), f32> = HashMap::new();
        for (owner, score) in owners.into_iter().zip(scores) {
            let entry = best.entry(owner).or_insert(f32::NEG_INFINITY);
            *entry = entry.max(score);
        }
        let mut run = Run { tag: "dev".into(), ..Default::default() };
        for (q, (qid, _, candidates)) in self.queries.iter().enumerate() {
            let docs = candidates
                .iter()
                .enumerate()
                .map(|(d, docid)| Scored {
                    docid: docid.clone(),
                    score: *best.get(&(q, d)).unwrap_or(&f32::NEG_INFINITY) as f64,
                })
                .collect();
            run.topics.insert(qid.clone(), docs);
        }
        let (value, named) = measure(&run, &self.qrels, options);
        Ok((value, named, run))
    }
}

/// What the model reads for each of a document's segments at inference, cut as the server's re-ranking cuts
/// them (whole sentences at the full budget less the repeated title; an empty text is one empty segment).
pub fn inference_inputs(
    prefix: Option<&str>,
    text: &str,
    scorer: &CrossEncoder,
    options: &TrainOptions,
    cap: Option<usize>,
) -> Vec<String> {
    let title_tokens = prefix.map_or(0, |p| scorer.count(p));
    let strategy = Strategy::Sentences { max_tokens: options.segment_budget().saturating_sub(title_tokens).max(1) };
    let mut cut = segment::segment(text, strategy, scorer, cap);
    if cut.is_empty() {
        cut.push(segment::Segment { index: 0, start: 0, end: 0 });
    }
    cut.iter().map(|s| segment::model_input(prefix, text, s).into_owned()).collect()
}

/// MRR@10 and nDCG@10 of a run (every judged query counted), and the dev measure among them.
pub fn measure(run: &Run, qrels: &Qrels, options: &TrainOptions) -> (f64, BTreeMap<String, f64>) {
    let measures = [Measure::RecipRank, Measure::NdcgCut(vec![10])];
    let options_eval = EvalOptions { max_docs: Some(10), complete: true, ..Default::default() };
    let values = eval::evaluate(run, qrels, &measures, options_eval).all_map();
    let mut named = BTreeMap::new();
    named.insert("mrr@10".to_string(), values.get("recip_rank").copied().unwrap_or(0.0));
    named.insert("ndcg@10".to_string(), values.get("ndcg_cut_10").copied().unwrap_or(0.0));
    let value = named[match options.dev_measure {
        DevMeasure::Mrr10 => "mrr@10",
        DevMeasure::Ndcg10 => "ndcg@10",
    }];
    (value, named)
}

/// Scores inputs in batches of at most `batch_tokens` padded tokens, grouped by length.
pub fn score_batched(scorer: &CrossEncoder, encoded: &[Encoded], batch_tokens: usize) -> Result<Vec<f32>, TrainError> {
    score_batched_with(encoded, batch_tokens, |batch| Ok(scorer.score(batch)?))
}

/// `score` over inputs in batches of at most `batch_tokens` padded tokens, grouped by length; the outputs
/// in the inputs' order.
pub fn score_batched_with<T: Clone + Default>(
    encoded: &[Encoded],
    batch_tokens: usize,
    mut score: impl FnMut(&[Encoded]) -> Result<Vec<T>, TrainError>,
) -> Result<Vec<T>, TrainError> {
    let mut order: Vec<usize> = (0..encoded.len()).collect();
    order.sort_by_key(|&i| encoded[i].ids.len());
    let mut outputs = vec![T::default(); encoded.len()];
    let mut start = 0;
    while start < order.len() {
        let mut end = start + 1;
        while end < order.len() && encoded[order[end]].ids.len() * (end + 1 - start) <= batch_tokens.max(1) {
            end += 1;
        }
        let batch: Vec<Encoded> = order[start..end].iter().map(|&i| encoded[i].clone()).collect();
        for (&i, output) in order[start..end].iter().zip(score(&batch)?) {
            outputs[i] = output;
        }
        start = end;
    }
    Ok(outputs)
}
