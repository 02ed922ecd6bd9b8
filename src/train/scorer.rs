//! A snapshot of a model in training, served as the server serves models (its own inference queue batching by
//! `batch_tokens`), so that dev scoring, BeST's segment selection and Co-BERT's first round run the inference
//! path itself: the same segments, batches, MaxP and Co-BERT first round as `/search`, never a copy.

use super::data::TrainingDoc;
use super::{TrainError, TrainOptions};
use crate::eval::Scored;
use crate::index::Bm25Params;
use crate::model::{Cancel, CrossEncoder, Output, Reranker, ServeOptions, Served, TrainableEncoder};
use crate::rank::rerank::{self, Candidate, FirstRoundPassage, Reranking, SegmentCache, Selecting, SelectorScorer};
use crate::rank::{Pipeline, RankError, RerankOptions};
use crate::segment::SegmentOptions;

/// The name a training snapshot goes by in messages.
const NAME: &str = "training snapshot";

pub struct Scorer {
    served: Served,
    segments: SegmentCache,
    options: RerankOptions,
    /// The `bm25` selector's parameters in dev evaluation: training's first stage's.
    bm25: Bm25Params,
}

impl Scorer {
    /// The model's current weights as a cross-encoder.
    pub fn of(model: &TrainableEncoder, options: &TrainOptions) -> Result<Scorer, TrainError> {
        Ok(Scorer::cross(model.snapshot()?, options))
    }

    pub fn cross(model: CrossEncoder, options: &TrainOptions) -> Scorer {
        Scorer::serve(Reranker::Cross(model), options)
    }

    /// The model's current weights as Co-BERT (a model with Co-BERT's heads), whose outputs carry the `[CLS]`
    /// states the heads read.
    pub fn cobert_of(model: &TrainableEncoder, options: &TrainOptions) -> Result<Scorer, TrainError> {
        Ok(Scorer::serve(Reranker::CoBert(model.snapshot_cobert()?), options))
    }

    fn serve(model: Reranker, options: &TrainOptions) -> Scorer {
        let serve = ServeOptions {
            max_length: options.max_length,
            max_query_tokens: options.max_query_tokens,
            max_batch_tokens: options.batch_tokens,
            max_queued_inputs: usize::MAX,
            // One query's pairs at a time: Co-BERT's first round reads its best passages' states back from here.
            cache_entries: 1 << 16,
        };
        // Segments as the server cuts them at the model's full budget, the title repeated as in training.
        let segments = SegmentOptions { repeat_title: options.repeat_title, ..SegmentOptions::default() };
        let (preselect, bm25) = (options.dev_preselect.clone().unwrap_or_default(), options.bm25);
        let options = RerankOptions {
            model: NAME.into(),
            depth: usize::MAX,
            segments,
            interpolate: None,
            preselect,
            instruction: None,
        };
        Scorer { served: Served::start(NAME, model, serve), segments: SegmentCache::default(), options, bm25 }
    }

    /// A re-ranking as the server runs it; with the dev preselection for `rank`, every segment otherwise
    /// (Co-BERT's training reads every candidate's best).
    fn job<'a>(&'a self, query: &'a str, pipeline: Pipeline, cancel: &'a Cancel, dev: bool) -> Reranking<'a> {
        let preselect = &self.options.preselect;
        let scorer = SelectorScorer::Bm25 { snapshot: None, params: self.bm25 };
        Reranking {
            preselect: (dev && preselect.active()).then_some(Selecting { options: preselect, scorer }),
            name: NAME,
            served: &self.served,
            store: None,
            segments: &self.segments,
            pipeline,
            options: &self.options,
            query,
            cancel,
        }
    }

    /// The candidates re-ranked as the `pipeline` of the server ranks them.
    pub fn rank(&self, query: &str, pipeline: Pipeline, candidates: Vec<Candidate>) -> Result<Vec<Scored>, TrainError> {
        let ranked =
            rerank::rerank(&self.job(query, pipeline, &Cancel::default(), true), candidates).map_err(rank_error)?;
        Ok(ranked.ranked.into_iter().map(|r| Scored { docid: r.docid, score: r.score as f64 }).collect())
    }

    /// Co-BERT's first round over the candidates (see `rerank::first_round`).
    pub fn first_round(&self, query: &str, candidates: &[Candidate]) -> Result<Vec<FirstRoundPassage>, TrainError> {
        rerank::first_round(&self.job(query, Pipeline::CoBert, &Cancel::default(), false), candidates)
            .map_err(rank_error)
    }

    /// The outputs (logit, `[CLS]` state, length) of the model over (query, passage) pairs.
    pub fn interactions(&self, query: &str, passages: &[&str]) -> Result<Vec<Output>, TrainError> {
        Ok(self.served.interactions(query, passages, None, &Cancel::default())?)
    }

    /// The training segment of `doc` the model scores highest for the query (the first of equals): MaxP's
    /// choice among the segments training cut.
    pub fn best_segment(&self, query: &str, doc: &TrainingDoc) -> Result<usize, TrainError> {
        let inputs: Vec<String> = (0..doc.segments.len()).map(|i| doc.input(i)).collect();
        let texts: Vec<&str> = inputs.iter().map(String::as_str).collect();
        let scores = self.served.score(query, None, &texts, None, &Cancel::default())?;
        Ok(rerank::best(&scores.scores).unwrap_or(0))
    }
}

fn rank_error(e: RankError) -> TrainError {
    match e {
        RankError::Model(e) => TrainError::Model(e),
        RankError::Index(e) => TrainError::Index(e),
        e => TrainError::Data(e.to_string()),
    }
}
