//! The ranking pipeline: validate a request against the limits, resolve its collection, retrieve with BM25,
//! and shape the ranking (later stages re-rank and attach segment evidence here). The HTTP server and the
//! CLI both call `Engine`, so validation and limits live only here.

pub mod batch;
mod models;
mod rerank;
mod selection;
mod snippet;

use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::config::{Config, Limits};
use crate::index::{analyzer, Bm25Params, Catalog, Collection, Hit, IndexError, Rm3Params, StoredDoc};
use crate::model::Cancel;
use crate::segment::SegmentOptions;

pub use batch::{BatchParams, BatchPlan, TopicRun};
pub use models::{LoadedModel, ModelStatus, Models, DEFAULT as DEFAULT_MODEL};
pub use rerank::{aggregate, interpolate, Evidence, ScoredSegment};
pub use snippet::snippet;

#[derive(Debug, thiserror::Error)]
pub enum RankError {
    #[error("query is empty")]
    EmptyQuery,
    #[error("query is {len} characters long; the limit is {max}")]
    QueryTooLong { len: usize, max: usize },
    #[error("{field} must be between {min} and {max}, got {value}")]
    OutOfRange { field: &'static str, value: i64, min: usize, max: usize },
    #[error("{0}")]
    InvalidParameter(String),
    #[error("unknown pipeline {name:?}; available: {}", available.join(", "))]
    UnknownPipeline { name: String, available: Vec<String> },
    #[error("no collection given and no default: name one of {}", available.join(", "))]
    CollectionRequired { available: Vec<String> },
    #[error("unknown collection {name:?}; available: {}", available.join(", "))]
    UnknownCollection { name: String, available: Vec<String> },
    #[error("no document {docid:?}{}", collection.as_ref().map(|c| format!(" in collection {c:?}")).unwrap_or_default())]
    UnknownDocument { docid: String, collection: Option<String> },
    #[error("document {docid:?} exists in several collections ({}); name one with ?collection=", collections.join(", "))]
    AmbiguousDocument { docid: String, collections: Vec<String> },
    #[error("pipeline {pipeline} re-ranks with a model, and none is configured (set [model] path or --model)")]
    ModelRequired { pipeline: &'static str },
    #[error("unknown model {name:?}; available: {}", available.join(", "))]
    UnknownModel { name: String, available: Vec<String> },
    #[error("model {name:?} is unavailable: {reason}")]
    ModelUnavailable { name: String, reason: String },
    #[error("model: {0}")]
    Model(crate::model::ModelError),
    #[error(transparent)]
    Index(#[from] IndexError),
}

/// The pipelines a request can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Pipeline {
    /// BM25 over the whole document, Anserini's parameters.
    Bm25,
    /// BM25 with RM3 pseudo-relevance feedback (Anserini's defaults: 10 documents, 10 terms, weight 0.5).
    #[serde(rename = "bm25+rm3")]
    Bm25Rm3,
    /// The model scores each BM25 candidate's first segment.
    #[serde(rename = "firstp")]
    FirstP,
    /// The model scores every segment; a document scores its best segment's score.
    #[serde(rename = "maxp")]
    MaxP,
    /// Every segment scored; a document scores the sum.
    #[serde(rename = "sump")]
    SumP,
    /// Every segment scored; a document scores the mean.
    #[serde(rename = "avgp")]
    AvgP,
    /// MaxP, then Co-BERT's heads re-score the candidates from their best passages, calibrated against the
    /// top ones and scored in groups (needs a Co-BERT model).
    #[serde(rename = "cobert")]
    CoBert,
}

impl Pipeline {
    pub const ALL: [Pipeline; 7] = [
        Pipeline::Bm25,
        Pipeline::Bm25Rm3,
        Pipeline::FirstP,
        Pipeline::MaxP,
        Pipeline::SumP,
        Pipeline::AvgP,
        Pipeline::CoBert,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Pipeline::Bm25 => "bm25",
            Pipeline::Bm25Rm3 => "bm25+rm3",
            Pipeline::FirstP => "firstp",
            Pipeline::MaxP => "maxp",
            Pipeline::SumP => "sump",
            Pipeline::AvgP => "avgp",
            Pipeline::CoBert => "cobert",
        }
    }

    /// Whether the pipeline re-ranks BM25's candidates with the model.
    pub fn needs_model(self) -> bool {
        !matches!(self, Pipeline::Bm25 | Pipeline::Bm25Rm3)
    }

    pub fn parse(name: &str) -> Result<Pipeline, RankError> {
        Pipeline::ALL.into_iter().find(|p| p.name() == name).ok_or_else(|| RankError::UnknownPipeline {
            name: name.to_string(),
            available: Pipeline::ALL.iter().map(|p| p.name().to_string()).collect(),
        })
    }
}

/// A search request (`POST /search` body; `GET /search` query parameters map onto it).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchRequest {
    /// Free text; a bag of words (no operators).
    pub query: String,
    /// Results to return (default from configuration, 10).
    #[serde(default)]
    pub k: Option<i64>,
    /// First-stage candidates to consider (re-ranking pipelines re-score this many).
    #[serde(default)]
    pub depth: Option<i64>,
    /// Pipeline name (default `bm25`); taken as a string so an unknown one is a 422, not a parse error.
    #[serde(default)]
    pub pipeline: Option<String>,
    /// Collection name; optional when there is one collection or a default is configured.
    #[serde(default)]
    pub collection: Option<String>,
    /// BM25 parameters for this request (default from configuration).
    #[serde(default)]
    pub bm25: Option<Bm25Params>,
    /// RM3 parameters for `bm25+rm3` (default: Anserini's).
    #[serde(default)]
    pub rm3: Option<Rm3Params>,
    /// The model re-ranking pipelines use (`GET /pipelines` lists them; default `default`).
    #[serde(default)]
    pub model: Option<String>,
    /// How documents are cut into segments (default from configuration).
    #[serde(default)]
    pub segments: Option<SegmentOptions>,
    /// Weight of the normalized first-stage score mixed into the re-ranked score (0 to 1; default none).
    #[serde(default)]
    pub interpolate: Option<f32>,
    /// Include every segment's text in `segments` (default false: offsets only).
    #[serde(default)]
    pub segment_text: bool,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SearchResponse {
    pub query: String,
    pub collection: String,
    pub pipeline: Pipeline,
    /// The model that re-ranked, for re-ranking pipelines.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Wall time inside the pipeline, milliseconds.
    pub took_ms: f64,
    pub timing: Timing,
    pub results: Vec<SearchHit>,
}

/// Where the time went, milliseconds.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Timing {
    pub retrieve_ms: f64,
    /// Segmenting and model scoring, for re-ranking pipelines.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rerank_ms: Option<f64>,
    #[serde(flatten)]
    pub model: Option<ModelTiming>,
    pub total_ms: f64,
}

/// What the model cost a request.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelTiming {
    /// Waiting in the model's queue behind other requests.
    pub queue_ms: f64,
    /// Forward passes that carried this request's pairs.
    pub inference_ms: f64,
    /// (query, segment) pairs the request needed.
    pub pairs: usize,
    /// Of those, pairs the model computed (the rest came from caches).
    pub computed: usize,
    /// FLOPs of the model passes behind the scores, from the model's shape and each pair's word pieces,
    /// cached pairs included (cross-encoders).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flops: Option<f64>,
}

impl ModelTiming {
    fn of(reranked: &rerank::Reranked) -> ModelTiming {
        ModelTiming {
            queue_ms: reranked.scores.queue_ms(),
            inference_ms: reranked.scores.inference_ms(),
            pairs: reranked.pairs,
            computed: reranked.scores.computed,
            flops: reranked.scores.flops,
        }
    }
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SearchHit {
    /// 1-based.
    pub rank: usize,
    pub docid: String,
    /// The pipeline's final score.
    pub score: f32,
    /// BM25 score from the first stage (absent for documents given to `/rerank` as text).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_stage_score: Option<f32>,
    /// Re-ranked results: the model's aggregated score (before interpolation with the first stage).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_score: Option<f32>,
    pub title: String,
    /// A short passage: the best segment for re-ranked results, else the text around the query terms.
    pub snippet: String,
    /// Re-ranked results: the segment that scored best, with its text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_segment: Option<BestSegment>,
    /// Re-ranked results: every segment the model scored, in document order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub segments: Option<Vec<ScoredSegment>>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BestSegment {
    pub index: usize,
    /// UTF-8 byte offsets into the document's text.
    pub start: usize,
    pub end: usize,
    pub score: f32,
    pub text: String,
}

/// A topic's ranked documents and what the model's passes cost.
pub struct Ranking {
    pub ranked: Vec<Ranked>,
    /// As `ModelTiming::flops`; `None` for first-stage pipelines and models without a FLOPs count.
    pub flops: Option<f64>,
}

impl From<rerank::Reranked> for Ranking {
    fn from(reranked: rerank::Reranked) -> Ranking {
        Ranking { flops: reranked.scores.flops, ranked: reranked.ranked }
    }
}

/// A ranked document: the final score, the first-stage score and address when it came from the index, and
/// the evidence when a model re-ranked it.
pub struct Ranked {
    pub docid: String,
    pub first_stage_score: Option<f32>,
    pub address: Option<tantivy::DocAddress>,
    pub score: f32,
    pub evidence: Option<Evidence>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DocumentResponse {
    pub collection: String,
    pub docid: String,
    pub title: String,
    pub text: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CollectionInfo {
    pub name: String,
    pub documents: u64,
    /// Mean length in analyzed terms.
    pub average_length: f64,
    pub size_bytes: u64,
    pub bm25: Bm25Params,
}

/// `POST /rerank`: the client's own candidates, re-ranked with evidence (text-embeddings-inference's
/// `/rerank` for long documents). Give either `documents` (texts) or `docids` (stored documents).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RerankRequest {
    pub query: String,
    #[serde(default)]
    pub documents: Option<Vec<RerankDocument>>,
    #[serde(default)]
    pub docids: Option<Vec<String>>,
    /// Where `docids` are looked up (default as for /search).
    #[serde(default)]
    pub collection: Option<String>,
    /// A re-ranking pipeline (default `maxp`).
    #[serde(default)]
    pub pipeline: Option<String>,
    /// Results to return (default: all).
    #[serde(default)]
    pub k: Option<i64>,
    /// The model (default `default`).
    #[serde(default)]
    pub model: Option<String>,
    /// How documents are cut into segments (default from configuration).
    #[serde(default)]
    pub segments: Option<SegmentOptions>,
    /// Include every segment's text in `segments`.
    #[serde(default)]
    pub segment_text: bool,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RerankDocument {
    /// Echoed as the result's docid (default: the document's position, from 0).
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub title: Option<String>,
    pub text: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RerankResponse {
    pub query: String,
    pub pipeline: Pipeline,
    pub model: String,
    pub took_ms: f64,
    pub timing: ModelTiming,
    pub results: Vec<SearchHit>,
}

/// Ranking options as a request or batch gives them, before validation.
#[derive(Debug, Clone, Default)]
pub struct RankParams<'a> {
    pub k: Option<i64>,
    pub depth: Option<i64>,
    pub pipeline: Option<&'a str>,
    pub bm25: Option<Bm25Params>,
    pub rm3: Option<Rm3Params>,
    pub model: Option<&'a str>,
    pub segments: Option<SegmentOptions>,
    pub interpolate: Option<f32>,
}

/// Validated ranking options.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct RankOptions {
    pub k: usize,
    pub depth: usize,
    pub pipeline: Pipeline,
    pub bm25: Bm25Params,
    pub rm3: Rm3Params,
    /// Re-ranking pipelines only.
    pub rerank: Option<RerankOptions>,
}

/// How re-ranking pipelines score.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct RerankOptions {
    pub model: String,
    pub segments: SegmentOptions,
    /// Weight of the normalized first-stage score, if mixed in.
    pub interpolate: Option<f32>,
}

/// Runs requests against the catalog under the configured limits.
pub struct Engine {
    catalog: Arc<Catalog>,
    limits: Limits,
    bm25: Bm25Params,
    default_collection: Option<String>,
    models: Models,
    default_segments: SegmentOptions,
    segments: rerank::SegmentCache,
}

impl Engine {
    pub fn new(catalog: Arc<Catalog>, config: &Config) -> Engine {
        let default_collection = (!config.default_collection.is_empty()).then(|| config.default_collection.clone());
        Engine {
            catalog,
            limits: config.limits.clone(),
            bm25: config.bm25,
            default_collection,
            models: Models::new(&config.model),
            default_segments: config.model.segments,
            segments: rerank::SegmentCache::default(),
        }
    }

    pub fn models(&self) -> &Models {
        &self.models
    }

    /// The model a validated re-ranking uses (loaded on first use).
    pub fn model_for(&self, options: &RankOptions) -> Result<Option<Arc<LoadedModel>>, RankError> {
        match &options.rerank {
            Some(rerank) => Ok(Some(self.models.get(&rerank.model, options.pipeline.name())?)),
            None => Ok(None),
        }
    }

    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    pub fn search(&self, request: SearchRequest, cancel: &Cancel) -> Result<SearchResponse, RankError> {
        let started = Instant::now();
        let query = self.check_query(&request.query)?;
        let options = self.options(RankParams {
            k: request.k,
            depth: request.depth,
            pipeline: request.pipeline.as_deref(),
            bm25: request.bm25,
            rm3: request.rm3,
            model: request.model.as_deref(),
            segments: request.segments,
            interpolate: request.interpolate,
        })?;
        let collection = self.collection(request.collection.as_deref())?;
        // The model first: an unavailable one fails before any work.
        let model = self.model_for(&options)?;
        let hits = self.retrieve(&collection, query, &options)?;
        let retrieve_ms = ms(started);
        let (ranked, model_timing) = match &model {
            Some(model) => {
                let reranked = self.rerank_hits(&collection, model, query, &options, hits, cancel)?;
                let timing = ModelTiming::of(&reranked);
                (reranked.ranked, Some(timing))
            }
            None => (first_stage(hits), None),
        };
        let rerank_ms = model.is_some().then(|| ms(started) - retrieve_ms);
        let query_terms = analyzer::terms(query);
        let results = ranked
            .into_iter()
            .take(options.k)
            .enumerate()
            .map(|(i, ranked)| self.search_hit(i + 1, ranked, Some(&collection), &query_terms, request.segment_text))
            .collect::<Result<Vec<_>, RankError>>()?;
        let total_ms = ms(started);
        Ok(SearchResponse {
            query: request.query,
            collection: collection.name().to_string(),
            pipeline: options.pipeline,
            model: model.map(|m| m.name.clone()),
            took_ms: total_ms,
            timing: Timing { retrieve_ms, rerank_ms, model: model_timing, total_ms },
            results,
        })
    }

    /// Re-ranks the client's documents (texts, or docids of a collection) with the model.
    pub fn rerank_documents(&self, request: RerankRequest, cancel: &Cancel) -> Result<RerankResponse, RankError> {
        let started = Instant::now();
        let query = self.check_query(&request.query)?;
        let options = self.options(RankParams {
            pipeline: Some(request.pipeline.as_deref().unwrap_or("maxp")),
            model: request.model.as_deref(),
            segments: request.segments,
            ..Default::default()
        })?;
        if !options.pipeline.needs_model() {
            return Err(RankError::InvalidParameter(format!(
                "/rerank needs a re-ranking pipeline, not {}",
                options.pipeline.name()
            )));
        }
        let model = self.model_for(&options)?.expect("re-ranking pipelines have a model");
        let mut store = None;
        let candidates: Vec<rerank::Candidate> = match (request.documents, request.docids) {
            (Some(documents), None) => documents
                .into_iter()
                .enumerate()
                .map(|(i, d)| rerank::Candidate {
                    first_stage_score: None,
                    doc: StoredDoc {
                        docid: d.id.unwrap_or_else(|| i.to_string()),
                        title: d.title.unwrap_or_default(),
                        text: d.text,
                    },
                })
                .collect(),
            (None, Some(docids)) => {
                let collection = self.collection(request.collection.as_deref())?;
                store = self.models.store(&collection, &model)?;
                docids
                    .into_iter()
                    .map(|docid| match collection.get(&docid)? {
                        Some(doc) => Ok(rerank::Candidate { first_stage_score: None, doc }),
                        None => {
                            Err(RankError::UnknownDocument { docid, collection: Some(collection.name().to_string()) })
                        }
                    })
                    .collect::<Result<_, RankError>>()?
            }
            _ => return Err(RankError::InvalidParameter("give either documents or docids".into())),
        };
        let count = candidates.len();
        if count == 0 || count > self.limits.max_depth {
            return Err(RankError::OutOfRange {
                field: "documents",
                value: count as i64,
                min: 1,
                max: self.limits.max_depth,
            });
        }
        let k = in_range("k", request.k, count, self.limits.max_k)?;
        let reranked = self.rerank_with(&model, store.as_deref(), query, &options, candidates, cancel)?;
        let timing = ModelTiming::of(&reranked);
        let query_terms = analyzer::terms(query);
        let results = reranked
            .ranked
            .into_iter()
            .take(k)
            .enumerate()
            .map(|(i, r)| self.search_hit(i + 1, r, None, &query_terms, request.segment_text))
            .collect::<Result<Vec<_>, RankError>>()?;
        let (pipeline, model) = (options.pipeline, model.name.clone());
        Ok(RerankResponse { query: request.query, pipeline, model, took_ms: ms(started), timing, results })
    }

    /// Re-ranks a topic's documents of an existing run (its top `depth`, in trec_eval's order).
    pub fn rerank_run(
        &self,
        collection: &Collection,
        query: &str,
        options: &RankOptions,
        given: &[crate::eval::Scored],
        cancel: &Cancel,
    ) -> Result<Ranking, RankError> {
        let Some(model) = self.model_for(options)? else {
            return Err(RankError::InvalidParameter("re-ranking a run needs a re-ranking pipeline".into()));
        };
        let candidates = crate::eval::measures::ranked(given)
            .into_iter()
            .take(options.depth)
            .map(|d| match collection.get(&d.docid)? {
                Some(doc) => Ok(rerank::Candidate { first_stage_score: Some(d.score as f32), doc }),
                None => Err(RankError::UnknownDocument {
                    docid: d.docid.clone(),
                    collection: Some(collection.name().to_string()),
                }),
            })
            .collect::<Result<Vec<_>, RankError>>()?;
        let store = self.models.store(collection, &model)?;
        Ok(self.rerank_with(&model, store.as_deref(), query, options, candidates, cancel)?.into())
    }

    /// Computes a bi-encoder's segment embeddings for every document of a collection ahead of queries, into
    /// the collection's embedding file (what is there already is skipped, so an interrupted run resumes).
    /// `progress` gets the documents done so far. Returns the embeddings computed, and those the file holds.
    pub fn embed_collection(
        &self,
        collection: &Collection,
        model: Option<&str>,
        mut progress: impl FnMut(u64),
    ) -> Result<(usize, usize), RankError> {
        let name = self.models.check(model)?;
        let model = self.models.get(&name, "embed")?;
        let store = match model.served.model() {
            crate::model::Reranker::Bi(_) => self.models.store(collection, &model)?,
            _ => None,
        };
        let Some(vectors) = store else {
            return Err(RankError::InvalidParameter(format!(
                "model {name:?} is a {}; only a bi-encoder's embeddings can be computed ahead",
                model.kind()
            )));
        };
        // Texts go to the model in chunks, so the queue batches well and memory stays bounded.
        const CHUNK: usize = 256;
        let (cancel, mut pending, mut computed, mut done) = (Cancel::default(), Vec::<String>::new(), 0, 0u64);
        let mut flush = |pending: &mut Vec<String>| -> Result<(), RankError> {
            let texts: Vec<&str> = pending.iter().map(String::as_str).collect();
            computed += model.served.embed_into(&texts, &vectors, &cancel).map_err(RankError::Model)?;
            pending.clear();
            Ok(())
        };
        collection.for_each_document(|doc| {
            let inputs = self.segments.inputs(&model.served, &self.default_segments, &doc, usize::MAX);
            pending.extend(inputs.into_iter().map(|(_, text)| text.into_owned()));
            if pending.len() >= CHUNK {
                flush(&mut pending)?;
            }
            done += 1;
            progress(done);
            Ok::<(), RankError>(())
        })?;
        flush(&mut pending)?;
        Ok((computed, vectors.len()))
    }

    /// First stage, then the model for re-ranking pipelines: the candidates, best first.
    pub fn rank(
        &self,
        collection: &Collection,
        query: &str,
        options: &RankOptions,
        cancel: &Cancel,
    ) -> Result<Ranking, RankError> {
        let model = self.model_for(options)?;
        let hits = self.retrieve(collection, query, options)?;
        match model {
            Some(model) => Ok(self.rerank_hits(collection, &model, query, options, hits, cancel)?.into()),
            None => Ok(Ranking { ranked: first_stage(hits), flops: None }),
        }
    }

    fn rerank_hits(
        &self,
        collection: &Collection,
        model: &LoadedModel,
        query: &str,
        options: &RankOptions,
        hits: Vec<Hit>,
        cancel: &Cancel,
    ) -> Result<rerank::Reranked, RankError> {
        let candidates = hits
            .into_iter()
            .take(options.depth)
            .map(|hit| {
                Ok(rerank::Candidate { first_stage_score: Some(hit.score), doc: collection.document(hit.address)? })
            })
            .collect::<Result<Vec<_>, IndexError>>()?;
        let store = self.models.store(collection, model)?;
        self.rerank_with(model, store.as_deref(), query, options, candidates, cancel)
    }

    fn rerank_with(
        &self,
        model: &LoadedModel,
        store: Option<&crate::model::VectorFile>,
        query: &str,
        options: &RankOptions,
        candidates: Vec<rerank::Candidate>,
        cancel: &Cancel,
    ) -> Result<rerank::Reranked, RankError> {
        let rerank_options = options.rerank.as_ref().expect("a re-ranking pipeline has re-ranking options");
        let job = rerank::Reranking {
            model,
            store,
            segments: &self.segments,
            pipeline: options.pipeline,
            options: rerank_options,
            query,
            cancel,
        };
        rerank::rerank(&job, candidates)
    }

    fn search_hit(
        &self,
        rank: usize,
        ranked: Ranked,
        collection: Option<&Collection>,
        query_terms: &[String],
        segment_text: bool,
    ) -> Result<SearchHit, RankError> {
        let Ranked { docid, first_stage_score, address, score, evidence } = ranked;
        let Some(evidence) = evidence else {
            let (Some(collection), Some(address)) = (collection, address) else {
                unreachable!("first-stage results come from a collection");
            };
            let doc = collection.document(address)?;
            return Ok(SearchHit {
                rank,
                snippet: snippet(&doc.text, query_terms),
                docid,
                score,
                first_stage_score,
                model_score: None,
                title: doc.title,
                best_segment: None,
                segments: None,
            });
        };
        let best = evidence.best().map(|b| BestSegment {
            index: b.index,
            start: b.start,
            end: b.end,
            score: b.score,
            text: evidence.doc.text[b.start..b.end].to_string(),
        });
        let mut segments = evidence.segments;
        if segment_text {
            for s in &mut segments {
                s.text = Some(evidence.doc.text[s.start..s.end].to_string());
            }
        }
        Ok(SearchHit {
            rank,
            snippet: best.as_ref().map(|b| snippet(&b.text, query_terms)).unwrap_or_default(),
            docid,
            score,
            first_stage_score,
            model_score: Some(evidence.model_score),
            title: evidence.doc.title,
            best_segment: best,
            segments: Some(segments),
        })
    }

    /// A query's text, trimmed, checked against the limits.
    pub fn check_query<'q>(&self, query: &'q str) -> Result<&'q str, RankError> {
        let query = query.trim();
        if query.is_empty() {
            return Err(RankError::EmptyQuery);
        }
        let len = query.chars().count();
        if len > self.limits.max_query_chars {
            return Err(RankError::QueryTooLong { len, max: self.limits.max_query_chars });
        }
        Ok(query)
    }

    /// Validates the ranking options of a request (or a batch) against the limits.
    pub fn options(&self, params: RankParams<'_>) -> Result<RankOptions, RankError> {
        let RankParams { k, depth, pipeline, bm25, rm3, model, segments, interpolate } = params;
        let k = in_range("k", k, self.limits.default_k, self.limits.max_k)?;
        let depth = in_range("depth", depth, self.limits.default_depth.max(k), self.limits.max_depth)?;
        let pipeline = Pipeline::parse(pipeline.unwrap_or("bm25"))?;
        let rerank = if pipeline.needs_model() {
            if self.models.names().is_empty() {
                return Err(RankError::ModelRequired { pipeline: pipeline.name() });
            }
            let segments = segments.unwrap_or(self.default_segments);
            segments.validate().map_err(RankError::InvalidParameter)?;
            if interpolate.is_some_and(|w| !(0.0..=1.0).contains(&w)) {
                return Err(RankError::InvalidParameter(format!(
                    "interpolate is the first stage's weight, between 0 and 1; got {}",
                    interpolate.unwrap_or_default()
                )));
            }
            Some(RerankOptions { model: self.models.check(model)?, segments, interpolate })
        } else {
            if let Some(model) = model {
                self.models.check(Some(model))?;
            }
            None
        };
        let bm25 = bm25.unwrap_or(self.bm25);
        if !(bm25.k1 >= 0.0 && (0.0..=1.0).contains(&bm25.b)) {
            return Err(RankError::InvalidParameter(format!(
                "bm25 needs k1 >= 0 and 0 <= b <= 1, got k1={} b={}",
                bm25.k1, bm25.b
            )));
        }
        let rm3 = rm3.unwrap_or_default();
        if rm3.fb_docs == 0 || rm3.fb_terms == 0 || !(0.0..=1.0).contains(&rm3.original_query_weight) {
            return Err(RankError::InvalidParameter(format!(
                "rm3 needs fb_docs >= 1, fb_terms >= 1 and 0 <= original_query_weight <= 1, got {rm3:?}"
            )));
        }
        Ok(RankOptions { k, depth, pipeline, bm25, rm3, rerank })
    }

    /// The first stage of a pipeline: at least `k` (and `depth`) hits, best first.
    pub fn retrieve(&self, collection: &Collection, query: &str, options: &RankOptions) -> Result<Vec<Hit>, RankError> {
        let n = options.depth.max(options.k);
        Ok(match options.pipeline {
            Pipeline::Bm25Rm3 => collection.search_rm3(query, n, options.bm25, options.rm3)?,
            _ => collection.search(query, n, options.bm25)?,
        })
    }

    /// A stored document; without a collection, every collection is searched (two matches: ambiguous).
    pub fn document(&self, docid: &str, collection: Option<&str>) -> Result<DocumentResponse, RankError> {
        let candidates = match collection {
            Some(name) => vec![self.collection(Some(name))?],
            None => self.catalog.all(),
        };
        let mut found = Vec::new();
        for c in candidates {
            if let Some(doc) = c.get(docid)? {
                found.push((c.name().to_string(), doc));
            }
        }
        match found.len() {
            0 => Err(RankError::UnknownDocument { docid: docid.to_string(), collection: collection.map(String::from) }),
            1 => {
                let (collection, doc) = found.remove(0);
                Ok(DocumentResponse { collection, docid: doc.docid, title: doc.title, text: doc.text })
            }
            _ => Err(RankError::AmbiguousDocument {
                docid: docid.to_string(),
                collections: found.into_iter().map(|(c, _)| c).collect(),
            }),
        }
    }

    pub fn collections(&self) -> Result<Vec<CollectionInfo>, RankError> {
        self.catalog
            .all()
            .iter()
            .map(|c| {
                let stats = c.stats()?;
                Ok(CollectionInfo {
                    name: c.name().to_string(),
                    documents: c.num_docs(),
                    average_length: stats.avg_len,
                    size_bytes: c.size_bytes(),
                    bm25: self.bm25,
                })
            })
            .collect()
    }

    /// The named collection, else the configured default, else the only one.
    pub fn collection(&self, name: Option<&str>) -> Result<Arc<Collection>, RankError> {
        let available = || self.catalog.names();
        let name = match name.or(self.default_collection.as_deref()) {
            Some(name) => name.to_string(),
            None => match available().as_slice() {
                [only] => only.clone(),
                _ => return Err(RankError::CollectionRequired { available: available() }),
            },
        };
        self.catalog.get(&name).map_err(|_| RankError::UnknownCollection { name, available: available() })
    }
}

/// First-stage hits as the ranking.
fn first_stage(hits: Vec<Hit>) -> Vec<Ranked> {
    hits.into_iter()
        .map(|hit| Ranked {
            first_stage_score: Some(hit.score),
            address: Some(hit.address),
            score: hit.score,
            docid: hit.docid,
            evidence: None,
        })
        .collect()
}

fn in_range(field: &'static str, value: Option<i64>, default: usize, max: usize) -> Result<usize, RankError> {
    let Some(value) = value else { return Ok(default.min(max)) };
    if value < 1 || value as u64 > max as u64 {
        return Err(RankError::OutOfRange { field, value, min: 1, max });
    }
    Ok(value as usize)
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_checks() {
        assert_eq!(in_range("k", None, 10, 100).unwrap(), 10);
        assert_eq!(in_range("k", Some(100), 10, 100).unwrap(), 100);
        assert!(matches!(in_range("k", Some(0), 10, 100), Err(RankError::OutOfRange { value: 0, .. })));
        assert!(in_range("k", Some(101), 10, 100).is_err());
        assert!(in_range("k", Some(-5), 10, 100).is_err());
    }

    #[test]
    fn pipelines_parse_by_name() {
        assert_eq!(Pipeline::parse("bm25").unwrap(), Pipeline::Bm25);
        assert_eq!(Pipeline::parse("bm25+rm3").unwrap(), Pipeline::Bm25Rm3);
        let err = Pipeline::parse("magic").unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown pipeline \"magic\"; available: bm25, bm25+rm3, firstp, maxp, sump, avgp, cobert"
        );
    }
}
