//! Batch runs: every topic of a topic file through the same pipeline as `/search`, as a TREC run. The CLI
//! (`longrank batch`) and the HTTP jobs (`POST /batch`) both plan with `Engine::plan_batch` and run topics
//! with `BatchPlan::run_topic`.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{BatchParams, Engine, RankError, RankOptions, Usage};
use crate::config::Config;
use crate::eval::{Run, Scored, Topic, TopicField};
use crate::index::{Collection, Point, Snapshot};
use crate::model::Cancel;

/// A validated batch: the collection as it was when planned, the topics and the ranking options.
pub struct BatchPlan {
    /// Candidates to re-rank instead of the first stage's (`--rerank RUN`, an Anserini run say).
    pub rerank: Option<Run>,
    pub collection: Arc<Collection>,
    /// Every topic reads the collection as it was at planning, whatever commits land during the run.
    pub point: Point,
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
        let options = self.options(&params.params, Usage::Batch)?;
        let max = self.limits.max_topics;
        if topics.len() > max {
            let value = topics.len() as f64;
            return Err(RankError::OutOfRange { field: "topics", value, min: 1.0, max: max as f64 });
        }
        // An unavailable pipeline is refused now, as /search refuses it, not at the job's first topic.
        self.model_for(&options)?;
        if rerank.is_some() && !options.pipeline.needs_model() {
            return Err(RankError::RerankingPipelineRequired {
                what: "re-ranking a run",
                pipeline: options.pipeline.name(),
            });
        }
        let collection = self.collection(params.params.collection.as_deref())?;
        for topic in &topics {
            self.check_query(&topic.query(params.field))
                .map_err(|e| RankError::Topic { qid: topic.qid.clone(), source: Box::new(e) })?;
        }
        let tag = params.tag.clone().unwrap_or_else(|| format!("longrank-{}", options.pipeline.name()));
        if tag.is_empty() || tag.contains(char::is_whitespace) {
            return Err(RankError::InvalidTag(tag));
        }
        let point = collection.snapshot().point();
        Ok(BatchPlan { rerank, collection, point, topics, field: params.field, options, tag })
    }
}

/// One topic's part of a batch run.
pub struct TopicRun {
    pub scored: Vec<Scored>,
    /// FLOPs of the model passes behind the topic's scores (re-ranking pipelines with a FLOPs count).
    pub flops: Option<f64>,
    /// Pairs sent to the model, and segments of the candidates seen (a preselection sends only some).
    pub pairs: usize,
    pub segments: usize,
}

impl BatchPlan {
    /// The collection as the batch reads it.
    pub fn snapshot(&self) -> Snapshot<'_> {
        self.collection.at(&self.point)
    }

    /// The ranked documents of one topic.
    pub fn run_topic(&self, engine: &Engine, topic: &Topic, cancel: &Cancel) -> Result<TopicRun, RankError> {
        let query = topic.query(self.field);
        let query = engine.check_query(&query)?;
        let ranked = match &self.rerank {
            Some(run) => {
                let given = run.topics.get(&topic.qid).map_or(&[][..], |docs| &docs[..]);
                engine.rerank_run(&self.snapshot().cancellable(cancel), query, &self.options, given, cancel)?
            }
            None => engine.rank(&self.snapshot().cancellable(cancel), query, &self.options, cancel)?,
        };
        let scored =
            ranked.ranked.into_iter().take(self.options.k).map(|r| Scored { docid: r.docid, score: r.score as f64 });
        Ok(TopicRun { scored: scored.collect(), flops: ranked.flops, pairs: ranked.pairs, segments: ranked.segments })
    }
}

/// How a run was made: the version, the configuration, the validated options, the collection and the model.
/// Kept with every HTTP job and written beside every CLI run (`OUT.provenance.json`).
#[derive(Debug, Clone, Serialize)]
pub struct Provenance<'a> {
    pub longrank_version: &'static str,
    pub configuration: &'a Config,
    pub options: &'a RankOptions,
    pub field: TopicField,
    pub tag: &'a str,
    pub collection: CollectionProvenance<'a>,
    /// Source and weights hash of the model; null for first-stage pipelines.
    pub model: Option<ModelProvenance>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CollectionProvenance<'a> {
    pub name: &'a str,
    pub documents: u64,
    pub built_at: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelProvenance {
    pub name: String,
    pub source: String,
    /// Where the weights were read (a hub model's cache snapshot, which names the commit).
    pub dir: std::path::PathBuf,
    pub kind: &'static str,
    pub weights_fnv1a64: String,
}

/// What a job's stored provenance holds that its run depends on (`BatchPlan::restore`).
#[derive(Debug, Deserialize)]
struct Recorded {
    options: RankOptions,
    field: TopicField,
    tag: String,
    model: Option<RecordedModel>,
}

#[derive(Debug, Deserialize)]
struct RecordedModel {
    name: String,
    weights_fnv1a64: String,
}

impl BatchPlan {
    /// Makes a plan made again after a restart run as it was submitted: the options, topic field and tag its
    /// provenance recorded replace what today's configuration gives. A model whose weights changed since is
    /// refused (its scores would differ).
    pub fn restore(&mut self, engine: &Engine, provenance: &str) -> Result<(), RankError> {
        let recorded: Recorded = serde_json::from_str(provenance)
            .map_err(|e| RankError::Unresumable(format!("its provenance does not read: {e}")))?;
        (self.options, self.field, self.tag) = (recorded.options, recorded.field, recorded.tag);
        if let (Some(model), Some(recorded)) = (engine.model_for(&self.options)?, recorded.model) {
            if model.weights_hash != recorded.weights_fnv1a64 {
                return Err(RankError::Unresumable(format!(
                    "model {:?} has other weights than when it was submitted ({}, now {})",
                    recorded.name, recorded.weights_fnv1a64, model.weights_hash
                )));
            }
        }
        Ok(())
    }

    pub fn provenance<'a>(&'a self, engine: &Engine, config: &'a Config) -> Provenance<'a> {
        // Planning checked the model; one that failed to load has no provenance, and the run fails on it.
        let model = engine.model_for(&self.options).ok().flatten();
        Provenance {
            longrank_version: env!("CARGO_PKG_VERSION"),
            configuration: config,
            options: &self.options,
            field: self.field,
            tag: &self.tag,
            collection: CollectionProvenance {
                name: self.collection.name(),
                documents: self.snapshot().num_docs(),
                built_at: self.collection.built_at().map(crate::timestamp::rfc3339),
            },
            model: model.as_deref().map(|m| ModelProvenance {
                name: m.name.clone(),
                source: crate::config::local_absolute(&m.source),
                dir: crate::config::absolute(&m.dir),
                kind: m.kind(),
                weights_fnv1a64: m.weights_hash.clone(),
            }),
        }
    }
}
