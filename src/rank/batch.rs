//! Batch runs: every topic of a topic file through the same pipeline as `/search`, as a TREC run. The CLI
//! (`longrank batch`) and the HTTP jobs (`POST /batch`) both plan with `Engine::plan_batch` and run topics
//! with `BatchPlan::run_topic`.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{Engine, RankError, RankOptions, RankParams};
use crate::eval::{Run, Scored, Topic, TopicField};
use crate::index::{Bm25Params, Collection, Rm3Params};
use crate::model::Cancel;
use crate::segment::SegmentOptions;

/// Results per topic when a batch names no k (trec_eval's customary depth).
pub const DEFAULT_BATCH_K: i64 = 1000;

/// How to run a batch (everything but the files).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchParams {
    /// Collection name; optional when there is one collection or a default is configured.
    pub collection: Option<String>,
    /// Pipeline name (default `bm25`).
    pub pipeline: Option<String>,
    /// Documents per topic (default 1000).
    pub k: Option<i64>,
    /// First-stage candidates per topic for re-ranking pipelines.
    pub depth: Option<i64>,
    /// Topic field used as the query (default `title`).
    #[serde(default)]
    pub field: TopicField,
    /// Run tag, the run file's last column (default `longrank-PIPELINE`).
    pub tag: Option<String>,
    pub bm25: Option<Bm25Params>,
    pub rm3: Option<Rm3Params>,
    /// The model re-ranking pipelines use (default `default`).
    pub model: Option<String>,
    /// How documents are cut into segments (default from configuration).
    pub segments: Option<SegmentOptions>,
    /// Weight of the normalized first-stage score mixed into re-ranked scores.
    pub interpolate: Option<f32>,
}

/// A validated batch: the collection, the topics and the ranking options.
pub struct BatchPlan {
    /// Candidates to re-rank instead of the first stage's (`--rerank RUN`, an Anserini run say).
    pub rerank: Option<Run>,
    pub collection: Arc<Collection>,
    pub topics: Vec<Topic>,
    pub field: TopicField,
    pub options: RankOptions,
    pub tag: String,
}

impl Engine {
    /// Validates a batch before it runs, so a bad request fails at once rather than at its first topic.
    pub fn plan_batch(
        &self,
        params: &BatchParams,
        topics: Vec<Topic>,
        rerank: Option<Run>,
    ) -> Result<BatchPlan, RankError> {
        let options = self.options(RankParams {
            k: Some(params.k.unwrap_or(DEFAULT_BATCH_K)),
            depth: params.depth,
            pipeline: params.pipeline.as_deref(),
            bm25: params.bm25,
            rm3: params.rm3,
            model: params.model.as_deref(),
            segments: params.segments,
            interpolate: params.interpolate,
        })?;
        if rerank.is_some() && !options.pipeline.needs_model() {
            let message = format!("re-ranking a run needs a re-ranking pipeline, not {}", options.pipeline.name());
            return Err(RankError::InvalidParameter(message));
        }
        let collection = self.collection(params.collection.as_deref())?;
        for topic in &topics {
            self.check_query(&topic.query(params.field))
                .map_err(|e| RankError::InvalidParameter(format!("topic {}: {e}", topic.qid)))?;
        }
        let tag = params.tag.clone().unwrap_or_else(|| format!("longrank-{}", options.pipeline.name()));
        if tag.is_empty() || tag.contains(char::is_whitespace) {
            return Err(RankError::InvalidParameter(format!("run tag {tag:?} must be one word")));
        }
        Ok(BatchPlan { rerank, collection, topics, field: params.field, options, tag })
    }
}

/// One topic's part of a batch run.
pub struct TopicRun {
    pub scored: Vec<Scored>,
    /// FLOPs of the model passes behind the topic's scores (re-ranking pipelines with a FLOPs count).
    pub flops: Option<f64>,
}

impl BatchPlan {
    /// The ranked documents of one topic.
    pub fn run_topic(&self, engine: &Engine, topic: &Topic, cancel: &Cancel) -> Result<TopicRun, RankError> {
        let query = topic.query(self.field);
        let query = engine.check_query(&query)?;
        let ranked = match &self.rerank {
            Some(run) => {
                let given = run.topics.get(&topic.qid).map_or(&[][..], |docs| &docs[..]);
                engine.rerank_run(&self.collection, query, &self.options, given, cancel)?
            }
            None => engine.rank(&self.collection, query, &self.options, cancel)?,
        };
        let scored =
            ranked.ranked.into_iter().take(self.options.k).map(|r| Scored { docid: r.docid, score: r.score as f64 });
        Ok(TopicRun { scored: scored.collect(), flops: ranked.flops })
    }
}
