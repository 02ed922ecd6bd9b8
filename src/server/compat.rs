//! Other servers' rerank APIs over longrank's `/rerank`: Cohere's v2 (`/v2/rerank`), Cohere's and Jina's v1
//! (`/v1/rerank`) and text-embeddings-inference's (`/tei/rerank`). Each request becomes one `RerankRequest`
//! (every document segmented and scored MaxP by a longrank model) and its answer takes the other API's shape,
//! with the best segment in an extra field those clients ignore. Their error bodies are `error::Dialect`'s.
//! And their embedding APIs over a served bi-encoder: text-embeddings-inference's `/embed` and OpenAI's
//! `/v1/embeddings`, each one `EmbedRequest`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::rank::{
    BestSegment, EmbedRequest, Embeddings, RankParams, RerankDocument, RerankRequest, RerankResponse, SearchHit,
};

/// The compatible routes, where their handlers and their errors' dialect find them.
pub mod paths {
    pub const COHERE_V1: &str = "/v1/rerank";
    pub const COHERE_V2: &str = "/v2/rerank";
    pub const TEI: &str = "/tei/rerank";
    pub const TEI_EMBED: &str = "/embed";
    pub const OPENAI_EMBEDDINGS: &str = "/v1/embeddings";
}

/// `POST /v2/rerank`: Cohere's rerank API v2.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CohereV2Request {
    /// A longrank model's name (`GET /pipelines` lists them); the default model answers when it is absent or
    /// not one of longrank's, and `meta.warnings` says so.
    #[serde(default)]
    #[schema(example = "default")]
    pub model: Option<String>,
    #[schema(example = "what is the capital of the united states")]
    pub query: String,
    /// Texts, of any length: each is segmented and scored MaxP.
    pub documents: Vec<String>,
    /// Results to return (default: all).
    #[serde(default)]
    pub top_n: Option<i64>,
    /// Cut each document after this many of the model's word pieces before segmenting (default: none).
    #[serde(default)]
    pub max_tokens_per_doc: Option<i64>,
    /// A decoder reranker's instruction (vLLM's and llama.cpp's name; `instruct`, sglang's, too).
    #[serde(default, alias = "instruct")]
    pub instruction: Option<String>,
    /// Accepted and ignored: requests are served in their turn.
    #[serde(default)]
    #[allow(dead_code, reason = "accepted for Cohere's clients, which send it")]
    pub priority: Option<i64>,
}

/// `POST /v1/rerank`: Cohere's v1 and Jina's rerank API.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct V1Request {
    /// As in `/v2/rerank`.
    #[serde(default)]
    #[schema(example = "default")]
    pub model: Option<String>,
    #[schema(example = "what is the capital of the united states")]
    pub query: String,
    pub documents: Vec<V1Document>,
    #[serde(default)]
    pub top_n: Option<i64>,
    /// Echo each document's text in its result (default false).
    #[serde(default)]
    pub return_documents: Option<bool>,
    /// A decoder reranker's instruction (vLLM's and llama.cpp's name; `instruct`, sglang's, too).
    #[serde(default, alias = "instruct")]
    pub instruction: Option<String>,
}

/// A v1 document: a text, or an object with one.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum V1Document {
    Text(String),
    Object { text: String },
}

impl V1Document {
    fn into_text(self) -> String {
        match self {
            V1Document::Text(text) | V1Document::Object { text } => text,
        }
    }
}

/// `POST /tei/rerank`: text-embeddings-inference's `/rerank`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TeiRequest {
    #[schema(example = "What is Deep Learning?")]
    pub query: String,
    #[schema(example = json!(["Deep Learning is not...", "Deep learning is..."]))]
    pub texts: Vec<String>,
    /// The model's MaxP logit instead of its sigmoid (default false).
    #[serde(default)]
    pub raw_scores: bool,
    /// Echo each text in its result (default false).
    #[serde(default)]
    pub return_text: bool,
    /// Score only what fits the model's input, the first segment (FirstP), as TEI does; default false: every
    /// segment (MaxP), where TEI would refuse a text longer than its input.
    #[serde(default)]
    pub truncate: bool,
    /// A decoder reranker's instruction (vLLM's and llama.cpp's name; `instruct`, sglang's, too).
    #[serde(default, alias = "instruct")]
    pub instruction: Option<String>,
    /// Only `Right` (the start of the text is kept).
    #[serde(default)]
    #[allow(dead_code, reason = "one direction: deserializing it is the check")]
    pub truncation_direction: Option<TruncationDirection>,
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
pub enum TruncationDirection {
    Right,
}

/// Texts to embed: one, or a list (text-embeddings-inference's and OpenAI's `input(s)`).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged, expecting = "a text or a list of texts")]
pub enum Inputs {
    One(String),
    Many(Vec<String>),
}

impl Inputs {
    fn into_texts(self) -> Vec<String> {
        match self {
            Inputs::One(text) => vec![text],
            Inputs::Many(texts) => texts,
        }
    }
}

/// `POST /embed`: text-embeddings-inference's `/embed`, answered with one embedding per input.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TeiEmbedRequest {
    #[schema(example = "What is Deep Learning?")]
    pub inputs: Inputs,
    /// Scale each embedding to unit length (default true); false: as the model gives it (normalized when its
    /// sentence-transformers modules end in `Normalize`, as sentence-transformers' `encode` does).
    #[serde(default = "yes")]
    pub normalize: bool,
    /// Cut an input longer than the model reads to its start (default false: refused, `input_too_long`).
    #[serde(default)]
    pub truncate: bool,
    /// Only `Right` (the start of the text is kept).
    #[serde(default)]
    #[allow(dead_code, reason = "one direction: deserializing it is the check")]
    pub truncation_direction: Option<TruncationDirection>,
    /// longrank's: the bi-encoder, by a served model's name (`GET /pipelines` lists them). Default: `default`.
    #[serde(default)]
    #[schema(example = "default")]
    pub model: Option<String>,
}

fn yes() -> bool {
    true
}

impl From<TeiEmbedRequest> for EmbedRequest {
    fn from(request: TeiEmbedRequest) -> EmbedRequest {
        let TeiEmbedRequest { inputs, normalize, truncate, model, .. } = request;
        EmbedRequest { inputs: inputs.into_texts(), model, normalize, truncate }
    }
}

/// `POST /v1/embeddings`: OpenAI's embeddings API, with a served bi-encoder; embeddings of unit length, as
/// OpenAI's are, and an input longer than the model reads refused (`input_too_long`), as OpenAI refuses one.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenAiEmbeddingsRequest {
    #[schema(example = "What is Deep Learning?")]
    pub input: Inputs,
    /// A served model's name (`GET /pipelines` lists them); another name is refused (`unknown_model`): vectors
    /// of another model than the one asked for would not compare with the client's. Default: `default`.
    #[serde(default)]
    #[schema(example = "default")]
    pub model: Option<String>,
    /// `float` (default) or `base64` (little-endian 32-bit floats, as OpenAI's Python client asks for).
    #[serde(default)]
    pub encoding_format: EncodingFormat,
    /// Accepted and ignored: OpenAI's end-user id.
    #[serde(default)]
    #[allow(dead_code, reason = "accepted for OpenAI's clients, which may send it")]
    pub user: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EncodingFormat {
    #[default]
    Float,
    Base64,
}

impl OpenAiEmbeddingsRequest {
    pub fn translate(self) -> (EmbedRequest, EncodingFormat) {
        let request =
            EmbedRequest { inputs: self.input.into_texts(), model: self.model, normalize: true, truncate: false };
        (request, self.encoding_format)
    }
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OpenAiEmbeddingsResponse {
    #[schema(example = "list")]
    pub object: &'static str,
    pub data: Vec<OpenAiEmbedding>,
    /// The longrank model that answered.
    pub model: String,
    pub usage: OpenAiUsage,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OpenAiEmbedding {
    #[schema(example = "embedding")]
    pub object: &'static str,
    /// The input's position in the request.
    pub index: usize,
    pub embedding: OpenAiVector,
}

/// The numbers, or their little-endian 32-bit floats in base64 (`encoding_format`).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(untagged)]
pub enum OpenAiVector {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OpenAiUsage {
    /// Word pieces the model read, special tokens included.
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

impl OpenAiEmbeddingsResponse {
    pub fn new(embeddings: Embeddings, format: EncodingFormat) -> OpenAiEmbeddingsResponse {
        use base64::Engine;
        let vector = |v: Vec<f32>| match format {
            EncodingFormat::Float => OpenAiVector::Float(v),
            EncodingFormat::Base64 => {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                OpenAiVector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
            }
        };
        let data = embeddings.vectors.into_iter().enumerate();
        let data = data.map(|(index, v)| OpenAiEmbedding { object: "embedding", index, embedding: vector(v) });
        let usage = OpenAiUsage { prompt_tokens: embeddings.tokens, total_tokens: embeddings.tokens };
        OpenAiEmbeddingsResponse { object: "list", data: data.collect(), model: embeddings.model, usage }
    }
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CohereV2Response {
    pub id: String,
    pub results: Vec<CohereResult>,
    pub meta: CohereMeta,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct V1Response {
    pub id: String,
    /// The longrank model that answered.
    pub model: String,
    pub results: Vec<CohereResult>,
    pub meta: CohereMeta,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CohereResult {
    /// The document's position in the request.
    pub index: usize,
    /// The model's MaxP score through a sigmoid, in [0, 1].
    pub relevance_score: f64,
    /// v1 with `return_documents`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub document: Option<CohereDocument>,
    /// longrank's evidence (clients ignore it).
    pub best_segment: Option<Evidence>,
}

/// longrank's evidence in a compatible answer: where the document's best segment is and its score; its text
/// only when the request asks for texts back (TEI's `return_text`, v1's `return_documents`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Evidence {
    pub index: usize,
    /// UTF-8 byte offsets into the document's text.
    pub start: usize,
    pub end: usize,
    pub score: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CohereDocument {
    pub text: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CohereMeta {
    pub api_version: CohereApiVersion,
    pub billed_units: CohereBilledUnits,
    /// Why the answer differs from what was asked (a model longrank does not have).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CohereApiVersion {
    #[schema(example = "2")]
    pub version: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CohereBilledUnits {
    /// One per request, as Cohere counts a search of up to 100 documents; nothing is billed.
    pub search_units: u64,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TeiResult {
    pub index: usize,
    /// The model's MaxP score through a sigmoid, or its logit with `raw_scores`.
    pub score: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// longrank's evidence (clients ignore it).
    pub best_segment: Option<Evidence>,
}

/// What a compatible request leaves for its answer once it is longrank's own: warnings, and the texts when
/// results echo them.
pub struct Translation {
    warnings: Vec<String>,
    echo: Option<Vec<String>>,
}

/// A compatible request as longrank's own: the documents by position, a model longrank has (or the default,
/// with a warning), MaxP unless said otherwise.
fn translate(
    query: String,
    texts: Vec<String>,
    model: Option<String>,
    instruction: Option<String>,
    models: &[String],
    echo: bool,
) -> (RerankRequest, Translation) {
    let mut warnings = Vec::new();
    let model = model.filter(|name| {
        let known = models.contains(name);
        if !known {
            warnings.push(format!(
                "model {name:?} is not one of longrank's ({}): the default model answered",
                models.join(", ")
            ));
        }
        known
    });
    let echo = echo.then(|| texts.clone());
    let documents = texts.into_iter().map(|text| RerankDocument { id: None, title: None, text }).collect();
    let params = RankParams { model, instruction, pipeline: Some("maxp".into()), ..RankParams::default() };
    let request = RerankRequest { query, documents: Some(documents), params, ..RerankRequest::default() };
    (request, Translation { warnings, echo })
}

impl CohereV2Request {
    pub fn translate(self, models: &[String]) -> (RerankRequest, Translation) {
        let (mut request, translation) =
            translate(self.query, self.documents, self.model, self.instruction, models, false);
        request.params.k = self.top_n;
        request.max_tokens_per_doc = self.max_tokens_per_doc;
        (request, translation)
    }
}

impl V1Request {
    pub fn translate(self, models: &[String]) -> (RerankRequest, Translation) {
        let texts = self.documents.into_iter().map(V1Document::into_text).collect();
        let echo = self.return_documents.unwrap_or(false);
        let (mut request, translation) = translate(self.query, texts, self.model, self.instruction, models, echo);
        request.params.k = self.top_n;
        (request, translation)
    }
}

impl TeiRequest {
    pub fn translate(self, models: &[String]) -> (RerankRequest, Translation) {
        let (mut request, translation) =
            translate(self.query, self.texts, None, self.instruction, models, self.return_text);
        if self.truncate {
            request.params.pipeline = Some("firstp".into());
        }
        (request, translation)
    }
}

impl Translation {
    /// Each result's position in the request, raw score, text when echoed, and best segment, in the
    /// ranking's order.
    fn ranked(
        &self,
        response: RerankResponse,
    ) -> impl Iterator<Item = (usize, f32, Option<String>, Option<Evidence>)> + '_ {
        response.results.into_iter().map(|hit: SearchHit| {
            // Documents were given by position: the docid is the index.
            let index: usize = hit.docid.parse().expect("compatible requests name documents by position");
            let text = self.echo.as_ref().map(|texts| texts[index].clone());
            let best = hit.best_segment.map(|b: BestSegment| Evidence {
                index: b.index,
                start: b.start,
                end: b.end,
                score: b.score,
                text: self.echo.is_some().then_some(b.text),
            });
            (index, hit.model_score.unwrap_or(hit.score), text, best)
        })
    }

    fn meta(&self, version: &str) -> CohereMeta {
        CohereMeta {
            api_version: CohereApiVersion { version: version.into() },
            billed_units: CohereBilledUnits { search_units: 1 },
            warnings: self.warnings.clone(),
        }
    }

    fn cohere_results(&self, response: RerankResponse) -> Vec<CohereResult> {
        self.ranked(response)
            .map(|(index, score, text, best_segment)| CohereResult {
                index,
                relevance_score: sigmoid(score),
                document: text.map(|text| CohereDocument { text }),
                best_segment,
            })
            .collect()
    }

    pub fn cohere_v2(&self, id: String, response: RerankResponse) -> CohereV2Response {
        CohereV2Response { id, results: self.cohere_results(response), meta: self.meta("2") }
    }

    pub fn v1(&self, id: String, response: RerankResponse) -> V1Response {
        let model = response.model.clone();
        V1Response { id, model, results: self.cohere_results(response), meta: self.meta("1") }
    }

    pub fn tei(&self, response: RerankResponse, raw_scores: bool) -> Vec<TeiResult> {
        self.ranked(response)
            .map(|(index, score, text, best_segment)| TeiResult {
                index,
                score: if raw_scores { f64::from(score) } else { sigmoid(score) },
                text,
                best_segment,
            })
            .collect()
    }
}

/// What Cohere and TEI call a relevance score: the logit's sigmoid.
fn sigmoid(logit: f32) -> f64 {
    1.0 / (1.0 + (-f64::from(logit)).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn models() -> Vec<String> {
        vec!["default".into(), "small".into()]
    }

    #[test]
    fn an_unknown_model_is_the_default_and_a_warning() {
        let request = |model: Option<&str>| CohereV2Request {
            model: model.map(String::from),
            query: "q".into(),
            documents: vec!["a".into(), "b".into()],
            top_n: Some(1),
            max_tokens_per_doc: Some(7),
            instruction: Some("judge".into()),
            priority: None,
        };
        let (known, translation) = request(Some("small")).translate(&models());
        assert_eq!(known.params.model.as_deref(), Some("small"));
        assert_eq!(known.params.instruction.as_deref(), Some("judge"));
        assert!(translation.warnings.is_empty() && translation.echo.is_none());
        let (unknown, translation) = request(Some("rerank-v3.5")).translate(&models());
        assert_eq!(unknown.params.model, None);
        assert!(translation.warnings[0].contains("\"rerank-v3.5\" is not one of longrank's (default, small)"));
        assert_eq!(unknown.params.k, Some(1));
        assert_eq!(unknown.max_tokens_per_doc, Some(7));
        assert_eq!(unknown.params.pipeline.as_deref(), Some("maxp"));
        let ids: Vec<_> = unknown.documents.unwrap().into_iter().map(|d| (d.id, d.text)).collect();
        assert_eq!(ids, vec![(None, "a".to_string()), (None, "b".to_string())], "documents go by position");
    }

    #[test]
    fn tei_truncation_reads_the_first_segment_and_v1_takes_texts_or_objects() {
        let tei: TeiRequest = serde_json::from_str(r#"{"query": "q", "texts": ["a"], "truncate": true}"#).unwrap();
        assert_eq!(tei.translate(&models()).0.params.pipeline.as_deref(), Some("firstp"));
        let v1: V1Request =
            serde_json::from_str(r#"{"query": "q", "documents": ["a", {"text": "b"}], "return_documents": true}"#)
                .unwrap();
        let (request, translation) = v1.translate(&models());
        assert_eq!(translation.echo, Some(vec!["a".to_string(), "b".to_string()]));
        assert_eq!(request.documents.unwrap()[1].text, "b");
        assert!(serde_json::from_str::<TeiRequest>(r#"{"query": "q", "texts": [], "truncation_direction": "Left"}"#)
            .is_err());
    }

    #[test]
    fn scores_are_sigmoids_of_the_logit() {
        assert_eq!(sigmoid(0.0), 0.5);
        assert!((sigmoid(2.0) - 0.880_797_077_977_882_3).abs() < 1e-12);
        assert!(sigmoid(-30.0) > 0.0 && sigmoid(30.0) <= 1.0);
    }
}
