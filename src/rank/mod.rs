//! The ranking pipeline: validate a request against the limits, resolve its collection, retrieve with BM25,
//! and shape the ranking (later stages re-rank and attach segment evidence here). The HTTP server and the
//! CLI both call `Engine`, so validation and limits live only here.

pub mod batch;
mod rerank;
mod snippet;

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::config::{Config, Limits};
use crate::index::{analyzer, Bm25Params, Catalog, Collection, Hit, IndexError, Rm3Params, StoredDoc};
use crate::model::{Reranker, ScoreOptions};

pub use batch::{BatchParams, BatchPlan};
pub use rerank::{aggregate, Evidence, ScoredSegment};
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
    #[error("pipeline {pipeline} re-ranks with a model, and none is loaded (set [model] path or --model)")]
    ModelRequired { pipeline: &'static str },
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
}

impl Pipeline {
    pub const ALL: [Pipeline; 6] =
        [Pipeline::Bm25, Pipeline::Bm25Rm3, Pipeline::FirstP, Pipeline::MaxP, Pipeline::SumP, Pipeline::AvgP];

    pub fn name(self) -> &'static str {
        match self {
            Pipeline::Bm25 => "bm25",
            Pipeline::Bm25Rm3 => "bm25+rm3",
            Pipeline::FirstP => "firstp",
            Pipeline::MaxP => "maxp",
            Pipeline::SumP => "sump",
            Pipeline::AvgP => "avgp",
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
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SearchResponse {
    pub query: String,
    pub collection: String,
    pub pipeline: Pipeline,
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
    pub total_ms: f64,
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
    pub took_ms: f64,
    pub results: Vec<SearchHit>,
}

/// Validated ranking options.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, ToSchema)]
pub struct RankOptions {
    pub k: usize,
    pub depth: usize,
    pub pipeline: Pipeline,
    pub bm25: Bm25Params,
    pub rm3: Rm3Params,
}

/// Runs requests against the catalog under the configured limits.
pub struct Engine {
    catalog: Arc<Catalog>,
    limits: Limits,
    bm25: Bm25Params,
    default_collection: Option<String>,
    /// The re-ranking model, once loaded (start-up loads it off the request path).
    model: OnceLock<LoadedModel>,
    score_options: ScoreOptions,
    segments: rerank::SegmentCache,
}

/// The model and where it came from (for `/pipelines` and provenance).
pub struct LoadedModel {
    pub reranker: Reranker,
    pub source: String,
    /// FNV-1a (64-bit, hex) over the weight files, in name order: which weights a run was made with.
    pub weights_hash: String,
}

impl Engine {
    pub fn new(catalog: Arc<Catalog>, config: &Config) -> Engine {
        let default_collection = (!config.default_collection.is_empty()).then(|| config.default_collection.clone());
        let m = &config.model;
        let score_options =
            ScoreOptions { max_length: m.max_length, max_query_tokens: m.max_query_tokens, batch_size: m.batch_size };
        Engine {
            catalog,
            limits: config.limits.clone(),
            bm25: config.bm25,
            default_collection,
            model: OnceLock::new(),
            score_options,
            segments: rerank::SegmentCache::default(),
        }
    }

    /// Loads the re-ranking model from a Hugging Face directory (once).
    pub fn load_model(&self, dir: &std::path::Path) -> Result<(), RankError> {
        let reranker = Reranker::load(dir, &candle_core::Device::Cpu).map_err(RankError::Model)?;
        let weights_hash = crate::model::weights_hash(dir).map_err(RankError::Model)?;
        let _ = self.model.set(LoadedModel { reranker, source: dir.display().to_string(), weights_hash });
        Ok(())
    }

    pub fn model(&self) -> Option<&LoadedModel> {
        self.model.get()
    }

    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    pub fn search(&self, request: SearchRequest) -> Result<SearchResponse, RankError> {
        let started = Instant::now();
        let query = self.check_query(&request.query)?;
        let options = self.options(request.k, request.depth, request.pipeline.as_deref(), request.bm25, request.rm3)?;
        let collection = self.collection(request.collection.as_deref())?;
        let hits = self.retrieve(&collection, query, &options)?;
        let retrieve_ms = ms(started);
        let ranked = self.rerank(&collection, query, &options, hits)?;
        let rerank_ms = options.pipeline.needs_model().then(|| ms(started) - retrieve_ms);
        let query_terms = analyzer::terms(query);
        let results = ranked
            .into_iter()
            .take(options.k)
            .enumerate()
            .map(|(i, ranked)| self.search_hit(i + 1, ranked, Some(&collection), &query_terms))
            .collect::<Result<Vec<_>, RankError>>()?;
        let total_ms = ms(started);
        Ok(SearchResponse {
            query: request.query,
            collection: collection.name().to_string(),
            pipeline: options.pipeline,
            took_ms: total_ms,
            timing: Timing { retrieve_ms, rerank_ms, total_ms },
            results,
        })
    }

    /// Re-ranks the client's documents (texts, or docids of a collection) with the model.
    pub fn rerank_documents(&self, request: RerankRequest) -> Result<RerankResponse, RankError> {
        let started = Instant::now();
        let query = self.check_query(&request.query)?;
        let pipeline = Pipeline::parse(request.pipeline.as_deref().unwrap_or("maxp"))?;
        if !pipeline.needs_model() {
            return Err(RankError::InvalidParameter(format!(
                "/rerank needs a re-ranking pipeline, not {}",
                pipeline.name()
            )));
        }
        let model = self.model().ok_or(RankError::ModelRequired { pipeline: pipeline.name() })?;
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
        let ranked = rerank::rerank(&model.reranker, &self.score_options, &self.segments, pipeline, query, candidates)?;
        let query_terms = analyzer::terms(query);
        let results = ranked
            .into_iter()
            .take(k)
            .enumerate()
            .map(|(i, r)| self.search_hit(i + 1, r, None, &query_terms))
            .collect::<Result<Vec<_>, RankError>>()?;
        Ok(RerankResponse { query: request.query, pipeline, took_ms: ms(started), results })
    }

    /// Re-ranks a topic's documents of an existing run (its top `depth`, in trec_eval's order).
    pub fn rerank_run(
        &self,
        collection: &Collection,
        query: &str,
        options: &RankOptions,
        given: &[crate::eval::Scored],
    ) -> Result<Vec<Ranked>, RankError> {
        let model = self.model().ok_or(RankError::ModelRequired { pipeline: options.pipeline.name() })?;
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
        rerank::rerank(&model.reranker, &self.score_options, &self.segments, options.pipeline, query, candidates)
    }

    /// First stage, then the model for re-ranking pipelines: the candidates, best first.
    pub fn rank(&self, collection: &Collection, query: &str, options: &RankOptions) -> Result<Vec<Ranked>, RankError> {
        let hits = self.retrieve(collection, query, options)?;
        self.rerank(collection, query, options, hits)
    }

    fn rerank(
        &self,
        collection: &Collection,
        query: &str,
        options: &RankOptions,
        hits: Vec<Hit>,
    ) -> Result<Vec<Ranked>, RankError> {
        if !options.pipeline.needs_model() {
            return Ok(hits
                .into_iter()
                .map(|hit| Ranked {
                    first_stage_score: Some(hit.score),
                    address: Some(hit.address),
                    score: hit.score,
                    docid: hit.docid,
                    evidence: None,
                })
                .collect());
        }
        let model = self.model().ok_or(RankError::ModelRequired { pipeline: options.pipeline.name() })?;
        let candidates = hits
            .into_iter()
            .take(options.depth)
            .map(|hit| {
                Ok(rerank::Candidate { first_stage_score: Some(hit.score), doc: collection.document(hit.address)? })
            })
            .collect::<Result<Vec<_>, IndexError>>()?;
        rerank::rerank(&model.reranker, &self.score_options, &self.segments, options.pipeline, query, candidates)
    }

    fn search_hit(
        &self,
        rank: usize,
        ranked: Ranked,
        collection: Option<&Collection>,
        query_terms: &[String],
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
        Ok(SearchHit {
            rank,
            snippet: best.as_ref().map(|b| snippet(&b.text, query_terms)).unwrap_or_default(),
            docid,
            score,
            first_stage_score,
            title: evidence.doc.title,
            best_segment: best,
            segments: Some(evidence.segments),
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
    pub fn options(
        &self,
        k: Option<i64>,
        depth: Option<i64>,
        pipeline: Option<&str>,
        bm25: Option<Bm25Params>,
        rm3: Option<Rm3Params>,
    ) -> Result<RankOptions, RankError> {
        let k = in_range("k", k, self.limits.default_k, self.limits.max_k)?;
        let depth = in_range("depth", depth, self.limits.default_depth.max(k), self.limits.max_depth)?;
        let pipeline = Pipeline::parse(pipeline.unwrap_or("bm25"))?;
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
        Ok(RankOptions { k, depth, pipeline, bm25, rm3 })
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
        assert_eq!(err.to_string(), "unknown pipeline \"magic\"; available: bm25, bm25+rm3, firstp, maxp, sump, avgp");
    }
}
