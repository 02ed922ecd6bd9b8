//! The ranking pipeline: validate a request against the limits, resolve its collection, retrieve with BM25,
//! re-rank with a model, and shape the response with its evidence. The HTTP server and the CLI both call
//! `Engine`, so validation and limits live only here.
//!
//! | module | holds |
//! |---|---|
//! | `api` | the public wire types: `RankParams` (every ranking parameter, declared once), requests, responses |
//! | `options` | validation: `RankParams` against `config::Limits` into `RankOptions` |
//! | `first_stage` | the first stages a request names, and the hybrid's fusion of BM25 and dense |
//! | `dense` | the dense first stage: documents by their best segment's cosine, over stored embeddings |
//! | `error` | `RankError`, one variant per cause |
//! | `rerank` | the re-ranking stage: segments scored by the model, aggregated (FirstP, MaxP, SumP, AvgP), Co-BERT |
//! | `batch` | topic files through a pipeline, shared by `longrank batch` and the HTTP jobs |
//! | `models` | the named models, loaded once, and their stores of outputs per collection |
//! | `selection` | segment selection against gold passages (`eval-segments`) |
//! | `snippet` | the text shown for first-stage hits |

mod api;
mod bags;
pub mod batch;
mod dense;
mod error;
mod first_stage;
mod models;
mod options;
pub mod rerank;
mod selection;
mod snippet;

use std::sync::Arc;
use std::time::Instant;

use crate::config::{Config, Limits};
use crate::index::{analyzer, Bm25Params, Catalog, Collection, Hit, IndexError, Snapshot, StoredDoc};
use crate::model::{Cancel, Neighbours};
use crate::preselect::Selector;
use crate::progress::{Progress, Unit};
use crate::segment::SegmentOptions;

/// What `Engine::embed_documents` does with each document it is handed.
type EachDocument<'a> = dyn FnMut(StoredDoc) -> Result<(), RankError> + 'a;

pub use api::{
    json_arg, BatchParams, BestSegment, CollectionInfo, DocumentResponse, EmbedRequest, Embeddings, ExpansionTerm,
    ModelTiming, Pipeline, PipelineInfo, RankParams, RerankDocument, RerankRequest, RerankResponse, ScoredSegment,
    SearchHit, SearchRequest, SearchResponse, Timing,
};
pub use batch::{BatchPlan, TopicRun};
pub use dense::SegmentVectors;
pub use error::RankError;
pub use first_stage::{FirstStageKind, Fusion, Listed, Normalize, Sources};
pub use models::{LoadedModel, ModelStatus, Models, DEFAULT as DEFAULT_MODEL};
pub use options::{RankOptions, RerankOptions, Usage, DEFAULT_BATCH_K, FIRST_STAGE_FIELDS, MAX_K1};
pub use rerank::{aggregate, interpolate, Evidence};
pub use snippet::snippet;

/// A first stage's answer (`Engine::retrieve`).
pub struct Retrieved {
    pub hits: Vec<Hit>,
    /// RM3's expansion terms (`bm25+rm3`).
    pub expansion: Option<Vec<ExpansionTerm>>,
    /// The dense and hybrid first stages: each hit's rank and score in each list.
    pub sources: std::collections::HashMap<String, Sources>,
}

/// A topic's ranked documents and what the model's passes cost.
pub struct Ranking {
    pub ranked: Vec<Ranked>,
    /// As `ModelTiming::flops`; `None` for first-stage pipelines and models without a FLOPs count.
    pub flops: Option<f64>,
    /// As `ModelTiming::pairs` and `ModelTiming::segments` (0 for first-stage pipelines).
    pub pairs: usize,
    pub segments: usize,
}

impl From<rerank::Reranked> for Ranking {
    fn from(reranked: rerank::Reranked) -> Ranking {
        let (pairs, segments) = (reranked.pairs, reranked.segments);
        Ranking { flops: reranked.scores.flops, ranked: reranked.ranked, pairs, segments }
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

impl ModelTiming {
    fn of(reranked: &rerank::Reranked) -> ModelTiming {
        ModelTiming {
            queue_ms: reranked.scores.queue_ms(),
            inference_ms: reranked.scores.inference_ms(),
            segments: reranked.segments,
            pairs: reranked.pairs,
            computed: reranked.scores.computed,
            flops: reranked.scores.flops,
        }
    }
}

/// Runs requests against the catalog under the configured limits.
pub struct Engine {
    catalog: Arc<Catalog>,
    limits: Limits,
    bm25: Bm25Params,
    default_collection: Option<String>,
    models: Models,
    default_segments: SegmentOptions,
    default_preselect: crate::preselect::Preselect,
    bi_encoder_interpolate: f32,
    segments: rerank::SegmentCache,
    vectors: dense::VectorsCache,
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
            default_preselect: config.model.preselect.clone(),
            bi_encoder_interpolate: config.model.bi_encoder_interpolate,
            segments: rerank::SegmentCache::default(),
            vectors: dense::VectorsCache::default(),
        }
    }

    pub fn models(&self) -> &Models {
        &self.models
    }

    /// The model a validated re-ranking uses (loaded on first use), checked against its pipeline: a model
    /// that could not be loaded, or `cobert` with a model that is not Co-BERT, makes the pipeline unavailable
    /// (before any work).
    pub fn model_for(&self, options: &RankOptions) -> Result<Option<Arc<LoadedModel>>, RankError> {
        let Some(rerank) = &options.rerank else { return Ok(None) };
        let unavailable = |reason: String| RankError::PipelineUnavailable {
            pipeline: options.pipeline.name(),
            model: rerank.model.clone(),
            reason,
        };
        let model = match self.models.get(&rerank.model, options.pipeline.name()) {
            Err(RankError::ModelUnavailable { reason, .. }) => return Err(unavailable(reason)),
            result => result?,
        };
        if options.pipeline == Pipeline::CoBert && !matches!(model.served.model(), crate::model::Reranker::CoBert(_)) {
            return Err(unavailable(format!(
                "it needs a Co-BERT model (a directory with {}), and this is a {}",
                crate::model::cobert::CONFIG_FILE,
                model.kind()
            )));
        }
        let preselect = &rerank.preselect;
        if let (Selector::BiEncoder(name), true) = (&preselect.selector, preselect.active()) {
            let selector = self.models.get(name, "preselect")?;
            if !matches!(selector.served.model(), crate::model::Reranker::Bi(_)) {
                return Err(RankError::NotABiEncoder { name: name.clone(), kind: selector.kind() });
            }
        }
        Ok(Some(model))
    }

    /// Every pipeline, and whether a request can use it now with the default model (why not, if not).
    pub fn pipelines(&self) -> Vec<PipelineInfo> {
        Pipeline::ALL
            .iter()
            .map(|&pipeline| {
                let params = RankParams { pipeline: Some(pipeline.name().into()), ..Default::default() };
                let reason =
                    self.options(&params, Usage::Search).and_then(|options| self.model_for(&options)).err().map(|e| {
                        match e {
                            RankError::PipelineUnavailable { reason, .. } => reason,
                            e => e.to_string(),
                        }
                    });
                PipelineInfo {
                    name: pipeline.name(),
                    needs_model: pipeline.needs_model(),
                    available: reason.is_none(),
                    reason,
                }
            })
            .collect()
    }

    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    pub fn search(&self, request: SearchRequest, cancel: &Cancel) -> Result<SearchResponse, RankError> {
        let started = Instant::now();
        let query = self.check_query(&request.query)?;
        let mut options = self.options(&request.params, Usage::Search)?;
        // A page is the ranking's top `offset + k`, less its first `offset`.
        let (page, offset) = (options.k, options::offset(request.offset, options.k, self.limits.max_k)?);
        options.k += offset;
        let collection = self.collection(request.params.collection.as_deref())?;
        // The model first: an unavailable one fails before any work.
        let model = self.model_for(&options)?;
        // Every read of the request through one view of the collection.
        let snapshot = collection.snapshot().cancellable(cancel);
        let Retrieved { hits, expansion, sources } = self.retrieve(&snapshot, query, &options, cancel)?;
        let retrieve_ms = ms(started);
        let (ranked, model_timing) = match &model {
            Some(model) => {
                let reranked = self.rerank_hits(&snapshot, model, query, &options, hits, cancel)?;
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
            .skip(offset)
            .take(page)
            .map(|(i, ranked)| {
                let mut hit = self.search_hit(i + 1, ranked, Some(&snapshot), &query_terms, request.segment_text)?;
                hit.first_stages = sources.get(&hit.docid).cloned();
                Ok(hit)
            })
            .collect::<Result<Vec<_>, RankError>>()?;
        let total_ms = ms(started);
        Ok(SearchResponse {
            query: request.query,
            collection: collection.name().to_string(),
            pipeline: options.pipeline,
            model: model.map(|m| m.name.clone()),
            took_ms: total_ms,
            timing: Timing { retrieve_ms, rerank_ms, model: model_timing, total_ms },
            expansion,
            preselect: options.rerank.map(|r| r.preselect),
            results,
        })
    }

    /// Re-ranks the client's documents (texts, or docids of a collection) with the model.
    pub fn rerank_documents(&self, request: RerankRequest, cancel: &Cancel) -> Result<RerankResponse, RankError> {
        let started = Instant::now();
        let query = self.check_query(&request.query)?;
        let options = self.options(&request.params, Usage::Rerank)?;
        let model = self.model_for(&options)?.expect("re-ranking pipelines have a model");
        // Docids name documents of a collection, read through one view of it.
        let collection = request.docids.is_some().then(|| self.collection(request.params.collection.as_deref()));
        let collection = collection.transpose()?;
        let snapshot = collection.as_ref().map(|c| c.snapshot().cancellable(cancel));
        let store = collection.as_ref().map(|c| self.models.store(c, &model)).transpose()?.flatten();
        let candidates: Vec<rerank::Candidate> = match (request.documents, request.docids, &snapshot) {
            (Some(documents), None, _) => documents
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
            (None, Some(docids), Some(snapshot)) => docids
                .into_iter()
                .map(|docid| match snapshot.get(&docid)? {
                    Some(doc) => Ok(rerank::Candidate { first_stage_score: None, doc }),
                    None => Err(RankError::UnknownDocument {
                        docid,
                        collection: Some(snapshot.collection().name().to_string()),
                    }),
                })
                .collect::<Result<_, RankError>>()?,
            _ => return Err(RankError::DocumentsOrDocids),
        };
        let count = candidates.len();
        if count == 0 || count > self.limits.max_depth {
            let max = self.limits.max_depth as f64;
            return Err(RankError::OutOfRange { field: "documents", value: count as f64, min: 1.0, max });
        }
        let k = options::in_range("k", request.params.k, count, self.limits.max_k)?;
        let mut candidates = candidates;
        if request.max_tokens_per_doc.is_some() {
            let n = options::in_range("max_tokens_per_doc", request.max_tokens_per_doc, 0, usize::MAX)?;
            for candidate in &mut candidates {
                let text = &mut candidate.doc.text;
                text.truncate(model.served.model().prefix_bytes(text, n).map_err(RankError::Model)?);
            }
        }
        let reranked =
            self.rerank_with(&model, store.as_deref(), snapshot.as_ref(), query, &options, candidates, cancel)?;
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
        let preselect = options.rerank.map(|r| r.preselect).unwrap_or_default();
        Ok(RerankResponse { query: request.query, pipeline, model, took_ms: ms(started), timing, preselect, results })
    }

    /// Re-ranks a topic's documents of an existing run (its top `depth`, in trec_eval's order).
    pub fn rerank_run(
        &self,
        snapshot: &Snapshot,
        query: &str,
        options: &RankOptions,
        given: &[crate::eval::Scored],
        cancel: &Cancel,
    ) -> Result<Ranking, RankError> {
        let Some(model) = self.model_for(options)? else {
            return Err(RankError::RerankingPipelineRequired {
                what: "re-ranking a run",
                pipeline: options.pipeline.name(),
            });
        };
        let depth = options.rerank.as_ref().map_or(0, |r| r.depth);
        let given = crate::eval::formats::ranked(given);
        let tail: Vec<Ranked> = given
            .iter()
            .skip(depth)
            .take(options.k.saturating_sub(depth))
            .map(|d| Ranked {
                docid: d.docid.clone(),
                first_stage_score: Some(d.score as f32),
                address: None,
                score: d.score as f32,
                evidence: None,
            })
            .collect();
        let candidates = given
            .into_iter()
            .take(depth)
            .map(|d| match snapshot.get(&d.docid)? {
                Some(doc) => Ok(rerank::Candidate { first_stage_score: Some(d.score as f32), doc }),
                None => Err(RankError::UnknownDocument {
                    docid: d.docid.clone(),
                    collection: Some(snapshot.collection().name().to_string()),
                }),
            })
            .collect::<Result<Vec<_>, RankError>>()?;
        let store = self.models.store(snapshot.collection(), &model)?;
        let mut reranked =
            self.rerank_with(&model, store.as_deref(), Some(snapshot), query, options, candidates, cancel)?;
        continue_below(&mut reranked.ranked, tail);
        Ok(reranked.into())
    }

    /// Computes a bi-encoder's segment embeddings for every document of a collection ahead of queries, into
    /// the collection's embedding file (what is there already is skipped, so an interrupted run resumes): of
    /// its own segments, or of those the model `reader` reads (a `bi-encoder:NAME` preselection's); then the
    /// vector index over them (`model::Neighbours`), brought up to date. Returns the embeddings computed, those
    /// the file holds, and those the index holds.
    pub fn embed_collection(
        &self,
        collection: &Collection,
        model: Option<&str>,
        reader: Option<&str>,
        progress: &dyn Progress,
    ) -> Result<(usize, usize, u64), RankError> {
        let snapshot = collection.snapshot();
        self.embed_documents(collection, model, reader, progress, 0, &mut |each| {
            snapshot.for_each_document(|_, doc| each(doc))
        })
    }

    /// `embed_collection` over the documents `visit` hands its argument, the index brought up to date once at
    /// least `least` records are missing from it.
    fn embed_documents(
        &self,
        collection: &Collection,
        model: Option<&str>,
        reader: Option<&str>,
        progress: &dyn Progress,
        least: u64,
        visit: &mut dyn FnMut(&mut EachDocument) -> Result<(), RankError>,
    ) -> Result<(usize, usize, u64), RankError> {
        let name = self.models.check(model)?;
        let model = self.models.get(&name, "embeddings")?;
        let reader = reader.map(|r| self.models.get(&self.models.check(Some(r))?, "embeddings")).transpose()?;
        let segmenter = &reader.as_ref().unwrap_or(&model).served;
        let store = match model.served.model() {
            crate::model::Reranker::Bi(_) => self.models.store_to_fill(collection, &model)?,
            _ => None,
        };
        let Some(vectors) = store else {
            return Err(RankError::NotABiEncoder { name, kind: model.kind() });
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
        visit(&mut |doc| {
            let inputs = self.segments.inputs(segmenter, &self.default_segments, &doc, usize::MAX);
            pending.extend(inputs.into_iter().map(|(_, text)| text.into_owned()));
            if pending.len() >= CHUNK {
                flush(&mut pending)?;
            }
            done += 1;
            progress.set(done, "");
            Ok(())
        })?;
        flush(&mut pending)?;
        // The vector index, brought up to what the file holds now.
        progress.phase("segments in the vector index", vectors.records().map_err(RankError::Model)?, Unit::Items);
        let done = |covered| progress.set(covered, "");
        let (_, indexed) = Neighbours::update(&vectors, &model.name, least, &done).map_err(RankError::Model)?;
        Ok((computed, vectors.len(), indexed))
    }

    /// After the documents `docids` names were added to the collection in `dir` (or replaced there; on a cluster, the
    /// staged copy about to be published): for each served bi-encoder whose vector index the collection holds, their
    /// segments embedded, so that dense search goes on serving the collection (it refuses one with segments missing),
    /// and the index brought up to date once `approximate_from` segments are missing from it (searches score those
    /// exactly; each update rewrites the graph). Only those documents are read and cut, not the collection. A failure
    /// is logged, not raised: the change stands, and a dense request says what to run.
    pub fn keep_vectors_current(&self, dir: &std::path::Path, docids: impl FnOnce() -> Vec<String>) {
        // The collection is opened only where an index asks for it: most have none.
        let models = self.models.indexed_bi_encoders(dir);
        if models.is_empty() {
            return;
        }
        let collection = match Collection::open(dir) {
            Ok(collection) => collection,
            Err(e) => return tracing::warn!("{}: embeddings not kept current: {e}", dir.display()),
        };
        let (name, snapshot, docids) = (collection.name(), collection.snapshot(), docids());
        let least = self.models.approximate_from() as u64;
        for model in models {
            let mut uploaded = |each: &mut EachDocument| {
                // A docid the upload skipped (malformed, empty) is not in the collection.
                docids.iter().filter_map(|id| snapshot.get(id).transpose()).try_for_each(|doc| each(doc?))
            };
            let silent = &crate::progress::Silent;
            match self.embed_documents(&collection, Some(&model.name), None, silent, least, &mut uploaded) {
                Ok((computed, _, indexed)) => {
                    tracing::info!(collection = name, model = model.name, computed, indexed, "embeddings kept current")
                }
                Err(e) => tracing::warn!("collection {name}, model {}: embeddings not kept current: {e}", model.name),
            }
        }
    }

    /// Embeddings of the client's texts by a served bi-encoder: 1 to `limits.max_depth` texts, each within the
    /// model's input unless `truncate` (as text-embeddings-inference refuses or cuts it).
    pub fn embed(&self, request: EmbedRequest, cancel: &Cancel) -> Result<Embeddings, RankError> {
        let count = request.inputs.len();
        if count == 0 || count > self.limits.max_depth {
            let max = self.limits.max_depth as f64;
            return Err(RankError::OutOfRange { field: "inputs", value: count as f64, min: 1.0, max });
        }
        let name = request.model.unwrap_or_else(|| models::DEFAULT.to_string());
        let model = self.models.get(&name, "embeddings")?;
        let crate::model::Reranker::Bi(encoder) = model.served.model() else {
            return Err(RankError::NotABiEncoder { name, kind: model.kind() });
        };
        let mut tokens = 0;
        for (index, text) in request.inputs.iter().enumerate() {
            let (len, max) = encoder.input_len(text).map_err(RankError::Model)?;
            if len > max && !request.truncate {
                return Err(RankError::InputTooLong { index, tokens: len, max, model: name });
            }
            tokens += len.min(max);
        }
        let texts: Vec<&str> = request.inputs.iter().map(String::as_str).collect();
        let embedded = model.served.embed(&texts, cancel).map_err(RankError::Model)?;
        let unit = |v: &[f32]| {
            let norm = crate::model::norm(v).max(1e-12);
            v.iter().map(|x| x / norm).collect()
        };
        let vectors = embedded.iter().map(|v| if request.normalize { unit(v) } else { v.to_vec() }).collect();
        Ok(Embeddings { model: name, vectors, tokens })
    }

    /// First stage, then the model for re-ranking pipelines: the candidates, best first.
    pub fn rank(
        &self,
        snapshot: &Snapshot,
        query: &str,
        options: &RankOptions,
        cancel: &Cancel,
    ) -> Result<Ranking, RankError> {
        let model = self.model_for(options)?;
        let hits = self.retrieve(snapshot, query, options, cancel)?.hits;
        match model {
            Some(model) => Ok(self.rerank_hits(snapshot, &model, query, options, hits, cancel)?.into()),
            None => Ok(Ranking { ranked: first_stage(hits), flops: None, pairs: 0, segments: 0 }),
        }
    }

    fn rerank_hits(
        &self,
        snapshot: &Snapshot,
        model: &LoadedModel,
        query: &str,
        options: &RankOptions,
        hits: Vec<Hit>,
        cancel: &Cancel,
    ) -> Result<rerank::Reranked, RankError> {
        let depth = options.rerank.as_ref().map_or(0, |r| r.depth);
        let mut hits = hits.into_iter();
        let candidates = hits
            .by_ref()
            .take(depth)
            .map(|hit| {
                Ok(rerank::Candidate { first_stage_score: Some(hit.score), doc: snapshot.document(hit.address)? })
            })
            .collect::<Result<Vec<_>, IndexError>>()?;
        let store = self.models.store(snapshot.collection(), model)?;
        let mut reranked =
            self.rerank_with(model, store.as_deref(), Some(snapshot), query, options, candidates, cancel)?;
        continue_below(&mut reranked.ranked, first_stage(hits.take(options.k.saturating_sub(depth)).collect()));
        Ok(reranked)
    }

    /// Re-ranks candidates with the model (and its preselection); `snapshot` is the candidates' collection,
    /// when they come from one (the `bm25` selector's statistics, a selector model's stored outputs).
    #[allow(clippy::too_many_arguments)]
    fn rerank_with(
        &self,
        model: &LoadedModel,
        store: Option<&crate::model::VectorFile>,
        snapshot: Option<&Snapshot>,
        query: &str,
        options: &RankOptions,
        candidates: Vec<rerank::Candidate>,
        cancel: &Cancel,
    ) -> Result<rerank::Reranked, RankError> {
        let rerank_options = options.rerank.as_ref().expect("a re-ranking pipeline has re-ranking options");
        let preselect = &rerank_options.preselect;
        let selector_model = match preselect.selector.model().filter(|_| preselect.active()) {
            Some(name) => {
                let selector = self.models.get(name, "preselect")?;
                let store = snapshot.map(|s| self.models.store(s.collection(), &selector)).transpose()?.flatten();
                Some((selector, store))
            }
            None => None,
        };
        let scorer = match &selector_model {
            Some((selector, store)) => {
                rerank::SelectorScorer::Model { served: &selector.served, store: store.as_deref() }
            }
            None => rerank::SelectorScorer::Bm25 { snapshot, params: options.bm25 },
        };
        let job = rerank::Reranking {
            name: &model.name,
            served: &model.served,
            store,
            segments: &self.segments,
            pipeline: options.pipeline,
            options: rerank_options,
            query,
            cancel,
            preselect: preselect.active().then_some(rerank::Selecting { options: preselect, scorer }),
        };
        rerank::rerank(&job, candidates)
    }

    fn search_hit(
        &self,
        rank: usize,
        ranked: Ranked,
        snapshot: Option<&Snapshot>,
        query_terms: &[String],
        segment_text: bool,
    ) -> Result<SearchHit, RankError> {
        let Ranked { docid, first_stage_score, address, score, evidence } = ranked;
        let Some(evidence) = evidence else {
            let (Some(snapshot), Some(address)) = (snapshot, address) else {
                unreachable!("first-stage results come from a collection");
            };
            let doc = snapshot.document(address)?;
            return Ok(SearchHit {
                rank,
                snippet: snippet(&doc.text, query_terms),
                docid,
                score,
                first_stage_score,
                first_stages: None,
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
            score: b.score.expect("the best segment is a scored one"),
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
            first_stages: None,
            model_score: evidence.model_score,
            title: evidence.doc.title,
            best_segment: best,
            segments: Some(segments),
        })
    }

    /// The first stage of a pipeline: at least `k` (and `depth`) hits, best first, with RM3's expanded query
    /// for `bm25+rm3` and, for the dense and hybrid first stages, where each hit came from.
    pub fn retrieve(
        &self,
        snapshot: &Snapshot,
        query: &str,
        options: &RankOptions,
        cancel: &Cancel,
    ) -> Result<Retrieved, RankError> {
        let n = options.rerank.as_ref().map_or(options.k, |r| r.depth.max(options.k));
        let bm25 = || -> Result<_, RankError> {
            Ok(match options.pipeline == Pipeline::Bm25Rm3 {
                true => {
                    let expanded = snapshot.search_rm3(query, n, options.bm25, options.rm3)?;
                    let terms = expanded.terms.into_iter().map(|(term, weight)| ExpansionTerm { term, weight });
                    (expanded.hits, Some(terms.collect()))
                }
                false => (snapshot.search(query, n, options.bm25)?, None),
            })
        };
        let dense = || self.dense(snapshot, query, options, n, cancel);
        Ok(match options.first_stage {
            FirstStageKind::Bm25 => {
                let (hits, expansion) = bm25()?;
                Retrieved { hits, expansion, sources: Default::default() }
            }
            FirstStageKind::Dense => {
                let dense = dense()?;
                let sources = dense.iter().enumerate().map(|(i, hit)| {
                    let listed = Listed { rank: i + 1, score: hit.score };
                    (hit.docid.clone(), Sources { bm25: None, dense: Some(listed) })
                });
                Retrieved { sources: sources.collect(), hits: dense, expansion: None }
            }
            FirstStageKind::Hybrid => {
                // Both lists at once: a hybrid query waits for the slower, not for their sum.
                let (bm25, dense) = std::thread::scope(|s| {
                    let dense = s.spawn(dense);
                    (bm25(), dense.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
                });
                let ((bm25, expansion), dense) = (bm25?, dense?);
                let (hits, sources) = first_stage::fuse(bm25, dense, options.hybrid.unwrap_or_default());
                Retrieved { hits, expansion, sources }
            }
        })
    }

    /// The dense first stage's top `n`: documents by their best segment's cosine with the query.
    fn dense(
        &self,
        snapshot: &Snapshot,
        query: &str,
        options: &RankOptions,
        n: usize,
        cancel: &Cancel,
    ) -> Result<Vec<Hit>, RankError> {
        let mut tried = vec![];
        for name in &options.dense_models {
            let model = self.models.get(name, "the dense first stage")?;
            if !matches!(model.served.model(), crate::model::Reranker::Bi(_)) {
                tried.push((name.clone(), model.kind()));
                continue;
            }
            let store = self.models.store(snapshot.collection(), &model)?.expect("a bi-encoder has a store");
            let from = self.models.approximate_from();
            let vectors = self.vectors.get(snapshot, &model, &store, &self.segments, &self.default_segments, from)?;
            let embedded = model.served.embed(&[query], cancel).map_err(RankError::Model)?;
            return vectors.search(&embedded[0], n);
        }
        Err(RankError::DenseModelRequired { tried })
    }

    /// A stored document; without a collection, every collection is searched (two matches: ambiguous).
    pub fn document(&self, docid: &str, collection: Option<&str>) -> Result<DocumentResponse, RankError> {
        let candidates = match collection {
            Some(name) => vec![self.collection(Some(name))?],
            None => self.catalog.all(),
        };
        let mut found = Vec::new();
        for c in candidates {
            if let Some(doc) = c.snapshot().get(docid)? {
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
                let snapshot = c.snapshot();
                let stats = snapshot.stats()?;
                Ok(CollectionInfo {
                    name: c.name().to_string(),
                    documents: snapshot.num_docs(),
                    average_length: stats.avg_len,
                    size_bytes: c.size_bytes(),
                    fingerprint: c.fingerprint().ok(),
                    bm25: self.bm25,
                })
            })
            .collect()
    }

    /// The fingerprint of each collection served (one that cannot be read is left out, with a warning).
    pub fn fingerprints(&self) -> std::collections::BTreeMap<String, String> {
        let fingerprint = |c: &Arc<Collection>| match c.fingerprint() {
            Ok(f) => Some((c.name().to_string(), f)),
            Err(e) => {
                tracing::warn!("fingerprint of {}: {e}", c.name());
                None
            }
        };
        self.catalog.all().iter().filter_map(fingerprint).collect()
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

/// Appends the first stage's documents after the re-ranked ones, in their order, each scored strictly below the
/// one before (1 apart where a float allows), so that trec_eval, which sorts by score, keeps them there.
fn continue_below(ranked: &mut Vec<Ranked>, tail: Vec<Ranked>) {
    let last = ranked.last().map_or(0.0, |r| r.score);
    let base = if last.is_finite() { last } else { f32::MIN / 2.0 };
    let mut previous = base;
    for (i, mut doc) in tail.into_iter().enumerate() {
        doc.score = (base - (i + 1) as f32).min(previous.next_down());
        previous = doc.score;
        ranked.push(doc);
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

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

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
