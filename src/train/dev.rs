//! The dev split: a sample of queries with their BM25 candidates, re-ranked as the server ranks them (MaxP;
//! FirstP for a FirstP model) through a `Scorer`, and measured for model selection.

use std::collections::{BTreeMap, BTreeSet};

use super::scorer::Scorer;
use super::{DevMeasure, Method, TrainError, TrainOptions};
use crate::eval::{self, EvalOptions, Measure, Qrels, Run};
use crate::index::{Snapshot, StoredDoc};
use crate::progress::Progress;

/// A dev evaluation: the dev measure, every measure computed, and the run.
pub type Evaluation = (f64, BTreeMap<String, f64>, Run);
use crate::rank::rerank::Candidate;
use crate::rank::Pipeline;

pub struct DevSet {
    queries: Vec<DevQuery>,
    qrels: Qrels,
}

struct DevQuery {
    qid: String,
    text: String,
    /// BM25's candidates, in its order, with their scores.
    candidates: Vec<(StoredDoc, f32)>,
}

impl DevSet {
    pub fn new(
        collection: &Snapshot,
        topics: &[(String, String)],
        qrels: &Qrels,
        qids: &BTreeSet<String>,
        options: &TrainOptions,
    ) -> Result<DevSet, TrainError> {
        let mut queries = Vec::new();
        for (qid, text) in topics.iter().filter(|(q, _)| qids.contains(q)) {
            let hits = collection.search(text, options.dev_depth, options.bm25)?;
            let mut candidates = Vec::new();
            for hit in hits {
                candidates.push((collection.document(hit.address)?, hit.score));
            }
            queries.push(DevQuery { qid: qid.clone(), text: text.clone(), candidates });
        }
        let topics: BTreeMap<_, _> =
            qrels.topics.iter().filter(|(q, _)| qids.contains(*q)).map(|(q, j)| (q.clone(), j.clone())).collect();
        Ok(DevSet { queries, qrels: Qrels { topics } })
    }

    pub fn len(&self) -> usize {
        self.queries.len()
    }

    /// The dev measure, every measure computed, and the run.
    pub fn evaluate(
        &self,
        scorer: &Scorer,
        options: &TrainOptions,
        progress: &dyn Progress,
    ) -> Result<Evaluation, TrainError> {
        let pipeline = if options.method == Method::Firstp { Pipeline::FirstP } else { Pipeline::MaxP };
        let mut run = Run { tag: "dev".into(), ..Default::default() };
        for (done, query) in self.queries.iter().enumerate() {
            let candidates = query
                .candidates
                .iter()
                .map(|(doc, score)| Candidate { first_stage_score: Some(*score), doc: doc.clone() })
                .collect();
            run.topics.insert(query.qid.clone(), scorer.rank(&query.text, pipeline, candidates)?);
            progress.set(done as u64 + 1, &query.qid);
        }
        let (value, named) = measure(&run, &self.qrels, options);
        Ok((value, named, run))
    }
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
