//! Training data: queries with judged-relevant documents and BM25 negatives, the examples of every step
//! (drawn from the seed and the step number alone, so every model of a run and every resumed run sees the
//! same ones), and documents cut into training segments.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroUsize;
use std::sync::Arc;

use lru::LruCache;
use parking_lot::Mutex;

use super::{Loss, TrainError, TrainOptions};
use crate::eval::Qrels;
use crate::index::Snapshot;
use crate::model::{Fnv, TrainableEncoder};
use crate::rng::Rng;
use crate::segment::{self, Segment};

/// A training (or dev) query: its judged-relevant documents in the collection and the BM25 candidates that
/// are not judged relevant.
#[derive(Debug, Clone)]
pub struct Query {
    pub qid: String,
    pub text: String,
    pub positives: Vec<String>,
    pub negatives: Vec<String>,
}

/// The queries of `qids` that have a relevant document in the collection, with negatives from the BM25
/// top `options.candidates`.
pub fn queries(
    collection: &Snapshot,
    topics: &[(String, String)],
    qrels: &Qrels,
    qids: &BTreeSet<String>,
    options: &TrainOptions,
) -> Result<Vec<Query>, TrainError> {
    let mut out = Vec::new();
    for (qid, text) in topics.iter().filter(|(q, _)| qids.contains(q)) {
        let judged = qrels.topics.get(qid);
        let relevant = |docid: &str| judged.and_then(|j| j.get(docid)).is_some_and(|g| *g > 0);
        let mut positives: Vec<String> =
            judged.map(|j| j.iter().filter(|(_, g)| **g > 0).map(|(d, _)| d.clone()).collect()).unwrap_or_default();
        positives.sort();
        let mut present = Vec::new();
        for docid in positives {
            if collection.get(&docid)?.is_some() {
                present.push(docid);
            }
        }
        let hits = collection.search(text, options.candidates, options.bm25)?;
        let negatives: Vec<String> = hits.into_iter().map(|h| h.docid).filter(|d| !relevant(d)).collect();
        if !present.is_empty() {
            out.push(Query { qid: qid.clone(), text: text.clone(), positives: present, negatives });
        }
    }
    Ok(out)
}

/// One training example: a query, one relevant document and its negatives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    pub query: usize,
    /// The relevant document first, then the negatives.
    pub docs: Vec<String>,
    /// Seeds each document's segment draw (`allp`).
    pub seed: u64,
}

/// The examples of step `step` (1-based): queries with negatives, drawn from the run's seed and the step.
pub fn examples(queries: &[Query], options: &TrainOptions, step: usize) -> Vec<Example> {
    let usable: Vec<usize> = (0..queries.len()).filter(|&q| !queries[q].negatives.is_empty()).collect();
    let negatives = match options.loss {
        Loss::Hinge => 1,
        Loss::Softmax => options.negatives,
    };
    let per_step = options.batch * options.accumulate;
    (0..per_step)
        .filter(|_| !usable.is_empty())
        .map(|i| {
            let mut rng = Rng::stream(options.seed, (step * per_step + i) as u64);
            let query = usable[rng.below(usable.len())];
            let q = &queries[query];
            let mut docs = vec![q.positives[rng.below(q.positives.len())].clone()];
            // Distinct negatives while there are enough, with repeats when a query has fewer.
            let mut pool: Vec<&String> = q.negatives.iter().collect();
            rng.shuffle(&mut pool);
            docs.extend((0..negatives).map(|k| pool[k % pool.len()].clone()));
            Example { query, docs, seed: rng.next_u64() }
        })
        .collect()
}

/// A document cut for training: its title prefix and leading segments (lengths drawn per document from the
/// run's seed, so a document is cut the same way for every model and every iteration).
pub struct TrainingDoc {
    pub prefix: Option<String>,
    pub text: String,
    pub segments: Vec<Segment>,
}

impl TrainingDoc {
    pub fn input(&self, index: usize) -> String {
        self.segments
            .get(index)
            .map(|s| segment::model_input(self.prefix.as_deref(), &self.text, s).into_owned())
            .unwrap_or_else(|| self.prefix.clone().unwrap_or_default())
    }
}

/// Documents cut for training with the model's tokenizer, fetched from the collection and kept in a bounded
/// cache.
pub struct Documents<'a> {
    collection: &'a Snapshot<'a>,
    options: &'a TrainOptions,
    tokenizer: &'a TrainableEncoder,
    cache: Mutex<LruCache<String, Arc<TrainingDoc>>>,
}

const CACHED_DOCUMENTS: usize = 4096;

impl<'a> Documents<'a> {
    pub fn new(
        collection: &'a Snapshot<'a>,
        options: &'a TrainOptions,
        tokenizer: &'a TrainableEncoder,
    ) -> Documents<'a> {
        let size = NonZeroUsize::new(CACHED_DOCUMENTS).unwrap_or(NonZeroUsize::MIN);
        Documents { collection, options, tokenizer, cache: Mutex::new(LruCache::new(size)) }
    }

    /// The document, cut.
    pub fn get(&self, docid: &str) -> Result<Arc<TrainingDoc>, TrainError> {
        let model = self.tokenizer;
        if let Some(doc) = self.cache.lock().get(docid) {
            return Ok(doc.clone());
        }
        let stored = self
            .collection
            .get(docid)?
            .ok_or_else(|| TrainError::Data(format!("document {docid} is not in the collection")))?;
        let prefix = segment::title_prefix(&stored.title, self.options.repeat_title);
        let title_tokens = prefix.as_deref().map_or(0, |p| segment::TokenCounter::count(model, p));
        let budget = model.segment_budget(self.options.max_length, self.options.max_query_tokens);
        let max = budget.saturating_sub(title_tokens).max(1);
        let mut hash = Fnv::default();
        hash.write(docid.as_bytes());
        let mut rng = Rng::stream(self.options.seed, hash.0);
        let random = self.options.random_lengths;
        // Random budgets between half and all of the model's, so length carries no label.
        let mut budgets = || if random { max / 2 + rng.below(max - max / 2 + 1) } else { max };
        let segments = segment::training_segments(&stored.text, max, model, self.options.doc_tokens.0, &mut budgets);
        let doc = Arc::new(TrainingDoc { prefix, text: stored.text, segments });
        self.cache.lock().put(docid.to_string(), doc.clone());
        Ok(doc)
    }
}

/// Splits queries into training and dev: by folds (`train_folds`, `dev_fold`) when given, else a seeded
/// sample of `dev_queries` for dev and the rest for training. The dev side is cut to a seeded sample of
/// `dev_queries`, the training side to one of `train_queries` when set (its own stream: the dev sample does
/// not depend on it).
pub fn split(
    qids: &[String],
    folds: Option<&BTreeMap<String, usize>>,
    options: &TrainOptions,
) -> Result<(BTreeSet<String>, BTreeSet<String>), TrainError> {
    let mut rng = Rng::stream(options.seed, 0xdef);
    let (mut train, mut dev): (Vec<String>, Vec<String>) = match (folds, options.dev_fold) {
        (Some(folds), Some(dev_fold)) => {
            let fold = |q: &String| folds.get(q).copied();
            let train = qids
                .iter()
                .filter(|q| fold(q).is_some_and(|f| options.train_folds.is_empty() || options.train_folds.contains(&f)))
                .filter(|q| fold(q) != Some(dev_fold))
                .cloned()
                .collect();
            (train, qids.iter().filter(|q| fold(q) == Some(dev_fold)).cloned().collect())
        }
        (None, Some(_)) => return Err(TrainError::Data("--dev-fold needs --folds".into())),
        _ => {
            let mut shuffled = qids.to_vec();
            shuffled.sort();
            rng.shuffle(&mut shuffled);
            let dev = shuffled.split_off(shuffled.len().saturating_sub(options.dev_queries));
            (shuffled, dev)
        }
    };
    dev.sort();
    rng.shuffle(&mut dev);
    dev.truncate(options.dev_queries);
    if let Some(n) = options.train_queries {
        train.sort();
        Rng::stream(options.seed, 0x7a1).shuffle(&mut train);
        train.truncate(n);
    }
    if train.is_empty() || dev.is_empty() {
        return Err(TrainError::Data(format!("{} training and {} dev queries: need both", train.len(), dev.len())));
    }
    Ok((train.into_iter().collect(), dev.into_iter().collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn train_queries_cut_the_training_side_to_a_seeded_sample_and_leave_dev_alone() {
        let qids: Vec<String> = (0..40).map(|i| format!("q{i}")).collect();
        let folds: BTreeMap<String, usize> = qids.iter().enumerate().map(|(i, q)| (q.clone(), i % 4)).collect();
        let options =
            TrainOptions { train_folds: vec![0, 1, 2], dev_fold: Some(3), dev_queries: 5, ..Default::default() };
        let (all, dev) = split(&qids, Some(&folds), &options).unwrap();
        assert_eq!((all.len(), dev.len()), (30, 5));
        let cut = TrainOptions { train_queries: Some(7), ..options.clone() };
        let (some, same_dev) = split(&qids, Some(&folds), &cut).unwrap();
        assert_eq!(some.len(), 7);
        assert!(some.is_subset(&all));
        assert_eq!(same_dev, dev);
        assert_eq!(split(&qids, Some(&folds), &cut).unwrap().0, some, "seeded");
        let other_seed = TrainOptions { seed: 7, ..cut };
        assert_ne!(split(&qids, Some(&folds), &other_seed).unwrap().0, some);
        // Left out of train.json when unset, so runs from before the option compare equal.
        assert!(serde_json::to_value(&options).unwrap().get("train_queries").is_none());
    }
}
