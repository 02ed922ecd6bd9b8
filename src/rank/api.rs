//! The pipeline's public types: what requests give (`RankParams`, the one declaration of every ranking
//! parameter, embedded in `SearchRequest`, `RerankRequest` and `BatchParams`, whose serde, utoipa and clap
//! derives serve JSON bodies, multipart forms, query strings and the CLI alike) and what responses carry.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::first_stage::{FirstStageKind, Fusion, Sources};
use crate::eval::TopicField;
use crate::index::{Bm25Params, Rm3Params};
use crate::preselect::Preselect;
use crate::segment::SegmentOptions;

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

    pub fn parse(name: &str) -> Result<Pipeline, super::RankError> {
        Pipeline::ALL.into_iter().find(|p| p.name() == name).ok_or_else(|| super::RankError::UnknownPipeline {
            name: name.to_string(),
            available: Pipeline::ALL.iter().map(|p| p.name().to_string()).collect(),
        })
    }

    /// The names, for the CLI's `--pipeline` (which lists them in `--help`).
    fn names() -> clap::builder::PossibleValuesParser {
        clap::builder::PossibleValuesParser::new(Pipeline::ALL.map(Pipeline::name))
    }
}

/// A pipeline as `/pipelines` lists it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PipelineInfo {
    pub name: &'static str,
    /// Whether the pipeline re-ranks with a model.
    pub needs_model: bool,
    /// Whether a request can use it now (with the default model, for re-ranking pipelines).
    pub available: bool,
    /// Why not, when it is unavailable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// How to rank: every ranking parameter, declared once. `/search`, `/rerank` and `/batch` take these fields
/// at the top level of their JSON body (a multipart `/batch` as parts, `GET /search` the scalar ones as
/// query parameters); `longrank search` and `longrank batch` take each as a `--kebab-case` flag, object-valued
/// ones as JSON text. Unset fields take the configured defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema, clap::Args)]
pub struct RankParams {
    /// Collection name; may be left out when there is one collection or `default_collection` is configured.
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "cranfield")]
    pub collection: Option<String>,
    /// Pipeline: bm25, bm25+rm3, firstp, maxp, sump, avgp or cobert (`GET /pipelines` lists them with their
    /// state). Default: bm25 (maxp for `/rerank`).
    #[arg(long, value_parser = Pipeline::names())]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "maxp")]
    pub pipeline: Option<String>,
    /// Results per query, at most `limits.max_k`. Default: `limits.default_k` (configuration); 1000 in a batch
    /// (trec_eval's depth); every candidate for `/rerank`.
    #[arg(short, long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = 5)]
    pub k: Option<i64>,
    /// First-stage candidates the re-ranking pipelines re-score, at most `limits.max_depth`. Default:
    /// `limits.default_depth` (configuration), whatever k is: with k larger, the ranking goes on with the first
    /// stage's next documents, in its order and scored below the re-ranked ones.
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = 7)]
    pub depth: Option<i64>,
    /// The first stage: bm25 (BM25, RM3's expanded query under bm25+rm3), dense (documents by their best
    /// segment's cosine with the query under a bi-encoder, over the segment embeddings `longrank embed` stored)
    /// or hybrid (both, each cut at its own depth, fused as `hybrid` says). Default: bm25.
    #[arg(long, value_enum)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_stage: Option<FirstStageKind>,
    /// The bi-encoder of the dense and hybrid first stages, by name. Default: the request's model when it is a
    /// bi-encoder, else the default model when it is one.
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "minilm")]
    pub dense_model: Option<String>,
    /// How the hybrid first stage fuses BM25 and dense, as JSON on the command line: `{"fusion": "rrf",
    /// "rrf_k": 60}` (the default) or `{"fusion": "linear", "weight": 0.5, "normalize": "minmax"}` (`weight` is
    /// dense's, 0 to 1; `normalize`: minmax or l2).
    #[arg(long, value_parser = json_arg::<Fusion>, value_name = "JSON")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hybrid: Option<Fusion>,
    /// BM25 parameters, as JSON on the command line. Default: `[bm25]` (configuration).
    #[arg(long, value_parser = json_arg::<Bm25Params>, value_name = "JSON")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bm25: Option<Bm25Params>,
    /// RM3 parameters of `bm25+rm3`, as JSON on the command line. Default: Anserini's (10 feedback
    /// documents, 10 terms, original query weight 0.5).
    #[arg(long, value_parser = json_arg::<Rm3Params>, value_name = "JSON")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rm3: Option<Rm3Params>,
    /// The model of the re-ranking pipelines, by name (`GET /pipelines` lists them). Default: `default`
    /// (`[model] path`). On the command line, the global `--model` (which also takes a directory or hub id).
    #[arg(skip)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "default")]
    pub model: Option<String>,
    /// How documents are cut into segments, as JSON on the command line. Default: `[model.segments]`
    /// (configuration).
    #[arg(long, value_parser = json_arg::<SegmentOptions>, value_name = "JSON")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segments: Option<SegmentOptions>,
    /// Weight (0 to 1) of the min-max normalized first-stage score mixed into the re-ranked score
    /// (re-ranking pipelines); 0 mixes nothing. Default: `[model] bi_encoder_interpolate` (0.5) when the model
    /// is a bi-encoder, none for the others.
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = 0.25)]
    pub interpolate: Option<f32>,
    /// Which segments the model reads (maxp, sump, avgp, cobert's first round; FirstP reads one): a cheap
    /// selector's best per candidate and/or a budget of pairs per query, as JSON on the command line.
    /// `{"selector": "none"}` reads every segment. Default: `[model.preselect]` (configuration) for maxp
    /// (each candidate's two best segments by BM25), every segment for the others.
    #[arg(long, value_parser = json_arg::<Preselect>, value_name = "JSON")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preselect: Option<Preselect>,
    /// A decoder reranker's instruction, where its recipe reads one (Qwen3-Reranker's `<Instruct>` line,
    /// mxbai-rerank-v2's instruction line, bge-reranker-v2-gemma's prompt); `instruct` too (sglang's name).
    /// Default: the recipe's own. Encoders have no place for one and refuse it.
    #[arg(long)]
    #[serde(default, alias = "instruct", skip_serializing_if = "Option::is_none")]
    #[schema(example = "Given a web search query, retrieve relevant passages that answer the query")]
    pub instruction: Option<String>,
}

/// Parses an object-valued flag's JSON text (`--bm25 '{"k1": 1.2}'`).
pub fn json_arg<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
    serde_json::from_str(text).map_err(|e| format!("not valid JSON for this option: {e}"))
}

/// A search request (`POST /search` body; `GET /search` takes its scalar fields, `q` for `query`).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct SearchRequest {
    /// Free text; a bag of words (no operators).
    #[schema(example = "waggle dance of honey bees")]
    pub query: String,
    #[serde(flatten)]
    pub params: RankParams,
    /// Results to skip before the `k` returned (paging, as Elasticsearch's `from` beside `size`): ranks
    /// `offset + 1` to `offset + k`, with `offset + k` at most `limits.max_k`. Default: 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = 0)]
    pub offset: Option<i64>,
    /// Include every segment's text in `segments` (default false: offsets only).
    #[serde(default)]
    #[schema(example = false)]
    pub segment_text: bool,
}

/// How to run a batch: the ranking parameters and what only a batch has (everything but the files).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema, clap::Args)]
pub struct BatchParams {
    #[serde(flatten)]
    #[command(flatten)]
    pub params: RankParams,
    /// Topic field used as the query: title, desc or title+desc. Default: title.
    #[arg(long, value_enum, default_value_t, hide_default_value = true)]
    #[serde(default)]
    pub field: TopicField,
    /// Run tag, the run file's last column (one word). Default: `longrank-PIPELINE`.
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "my-run")]
    pub tag: Option<String>,
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
    /// The query RM3 searched with (`bm25+rm3`): the original terms and the expansion terms, as the index
    /// holds them (stemmed), with their weights, heaviest first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expansion: Option<Vec<ExpansionTerm>>,
    /// Which segments the model read, for re-ranking pipelines: the preselection in effect (`selector: none`:
    /// every segment; FirstP reads the first). Each hit's `segments` say which ones (`scored`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preselect: Option<Preselect>,
    pub results: Vec<SearchHit>,
}

/// One term of RM3's weighted query.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ExpansionTerm {
    #[schema(example = "flutter")]
    pub term: String,
    #[schema(example = 0.31)]
    pub weight: f32,
}

/// Where the time went, milliseconds.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Timing {
    pub retrieve_ms: f64,
    /// Segmenting and model scoring, for re-ranking pipelines.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rerank_ms: Option<f64>,
    /// Re-ranking pipelines only. Documented as the object itself (its fields optional), not as a nullable
    /// alternative: generated clients drop the properties of an `allOf` part that may be null.
    #[serde(flatten)]
    #[schema(value_type = ModelTiming)]
    pub model: Option<ModelTiming>,
    pub total_ms: f64,
}

/// What the model cost a request. Its fields are optional in the schema because `/search` flattens them
/// into `timing` only for re-ranking pipelines; `/rerank` always has them.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelTiming {
    /// Waiting in the model's queue behind other requests.
    #[schema(required = false)]
    pub queue_ms: f64,
    /// Forward passes that carried this request's pairs.
    #[schema(required = false)]
    pub inference_ms: f64,
    /// Segments of the candidates seen.
    #[schema(required = false)]
    pub segments: usize,
    /// (query, segment) pairs sent to the model: every segment seen, or those a preselection picked.
    #[schema(required = false)]
    pub pairs: usize,
    /// Of those, pairs the model computed (the rest came from caches).
    #[schema(required = false)]
    pub computed: usize,
    /// FLOPs of the model passes behind the scores, from the model's shape and each pair's word pieces,
    /// cached pairs included (cross-encoders).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flops: Option<f64>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SearchHit {
    /// 1-based.
    pub rank: usize,
    pub docid: String,
    /// The pipeline's final score.
    pub score: f32,
    /// The first stage's score: BM25's, the best segment's cosine (dense), or the fused score (hybrid); absent
    /// for documents given to `/rerank` as text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_stage_score: Option<f32>,
    /// The dense and hybrid first stages: the document's rank and score in each list that held it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_stages: Option<Sources>,
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
    /// A hash of the committed index files: equal on every copy of the collection (replicas compare it); null
    /// when they cannot be read (the directory is being replaced or deleted).
    pub fingerprint: Option<String>,
    pub bm25: Bm25Params,
}

/// Texts to embed with a served bi-encoder (what `/embed` and `/v1/embeddings` ask for).
#[derive(Debug, Clone)]
pub struct EmbedRequest {
    pub inputs: Vec<String>,
    /// A served model's name (`GET /pipelines` lists them); the default model when absent.
    pub model: Option<String>,
    /// Scale each embedding to unit length (else as the model gives it).
    pub normalize: bool,
    /// Cut a text longer than the model's input to its start (else refuse it).
    pub truncate: bool,
}

/// Embeddings, one per input in order.
#[derive(Debug, Clone)]
pub struct Embeddings {
    /// The model's name.
    pub model: String,
    pub vectors: Vec<Vec<f32>>,
    /// Word pieces the model read, special tokens included.
    pub tokens: usize,
}

/// `POST /rerank`: the client's own candidates, re-ranked with evidence (text-embeddings-inference's
/// `/rerank` for long documents). Give either `documents` (texts) or `docids` (stored documents). Of the
/// ranking parameters, those of the first stage (`depth`, `bm25`, `rm3`, `interpolate`) do not apply.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct RerankRequest {
    #[schema(example = "who won super bowl 50")]
    pub query: String,
    #[serde(default)]
    pub documents: Option<Vec<RerankDocument>>,
    #[serde(default)]
    pub docids: Option<Vec<String>>,
    #[serde(flatten)]
    pub params: RankParams,
    /// Include every segment's text in `segments`.
    #[serde(default)]
    pub segment_text: bool,
    /// Cut each document after this many of the model's word pieces before segmenting (Cohere's
    /// `max_tokens_per_doc`). Default: the whole document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = 4096)]
    pub max_tokens_per_doc: Option<i64>,
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
    /// Which segments the model read: the preselection in effect (`selector: none`: every segment).
    pub preselect: Preselect,
    pub results: Vec<SearchHit>,
}

/// One segment with the model's score, and the selector's when a preselection ran.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ScoredSegment {
    pub index: usize,
    /// UTF-8 byte offsets into the document's text.
    pub start: usize,
    pub end: usize,
    /// Whether the model read the segment: a preselection sends it only some.
    pub scored: bool,
    /// The model's score; absent when the model did not read the segment (`scored: false`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub score: Option<f32>,
    /// The preselection's score, for every segment it saw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector_score: Option<f32>,
    /// The segment's text, when the request asks for it (`segment_text`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}
