//! Decoder rerankers' recipes, pinned as data in one place: how each model line's authors build its input (the
//! prompt template, its default instruction, how the query and the document are cut) and which answer logits
//! make the score, each from the model's own published reference code (named beside it). A recipe is checked
//! against the model's tokenizer at load: a tokenizer without the template's special tokens or the answer tokens
//! is refused with the reason.
//!
//! The score is a logit difference (or one logit), which does not saturate: the answer rows of the output layer
//! are folded into one vector at load (`answer`), so a pair costs the decoder and one dot product.

use candle_core::{DType, IndexOp, Tensor};
use candle_nn::VarBuilder;
use serde::{Deserialize, Serialize};

use super::family::Family;
use super::tokenize::{Encoded, Pieces};
use super::ModelError;

/// A model line's recipe (`recipe` in `[model]` and `[model.named]` entries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Recipe {
    /// `Qwen/Qwen3-Reranker-0.6B`, `-4B`, `-8B` (and their sequence-classification conversions): the model
    /// card's usage code (`format_instruction`, `process_inputs`, `compute_logits`).
    Qwen3Reranker,
    /// `mixedbread-ai/mxbai-rerank-base-v2`, `-large-v2`: the `mxbai-rerank` package (`mxbai_rerank_v2.py`,
    /// `MxbaiRerankV2.prepare_inputs` and `forward`).
    MxbaiRerankV2,
    /// `BAAI/bge-reranker-v2-gemma`: FlagEmbedding's decoder-only reranker
    /// (`FlagEmbedding/inference/reranker/decoder_only/base.py`, `BaseLLMReranker.compute_score_single_gpu`).
    BgeRerankerGemma,
}

/// Every recipe, as a refusal lists them.
pub const RECIPES: &str = "qwen3-reranker, mxbai-rerank-v2, bge-reranker-gemma";

const QWEN3_PREFIX: &str = "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query \
                            and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n\
                            <|im_start|>user\n";
const QWEN3_SUFFIX: &str = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
const QWEN3_INSTRUCTION: &str = "Given a web search query, retrieve relevant passages that answer the query";

const MXBAI_PREFIX: &str =
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\n";
const MXBAI_SUFFIX: &str = "<|im_end|>\n<|im_start|>assistant\n";
const MXBAI_TASK: &str =
    "You are a search relevance expert who evaluates how well documents match search queries. For \
                          each query-document pair, carefully analyze the semantic relationship between them, then \
                          provide your binary relevance judgment (0 for not relevant, 1 for relevant).\nRelevance:";

const GEMMA_PROMPT: &str = "Given a query A and a passage B, determine whether the passage contains an answer to the \
                            query by providing a prediction of either 'Yes' or 'No'.";

/// The line between parts in mxbai's and FlagEmbedding's templates.
const SEP: &str = "\n";

impl Recipe {
    /// The decoder family the recipe's models are.
    pub fn family(self) -> Family {
        match self {
            Recipe::Qwen3Reranker => Family::Qwen3,
            Recipe::MxbaiRerankV2 => Family::Qwen2,
            Recipe::BgeRerankerGemma => Family::Gemma,
        }
    }

    /// The recipe of a hub id or a hub cache path naming a known model line, or of a converted checkpoint's
    /// architecture.
    pub(super) fn detect(source: &str, architectures: &[String]) -> Option<Recipe> {
        let name = source.to_ascii_lowercase().replace("--", "/");
        if name.contains("qwen3-reranker") || architectures.iter().any(|a| a == "Qwen3ForSequenceClassification") {
            Some(Recipe::Qwen3Reranker)
        } else if name.contains("mxbai-rerank-") && name.contains("-v2") {
            Some(Recipe::MxbaiRerankV2)
        } else if name.contains("bge-reranker-v2-gemma") {
            Some(Recipe::BgeRerankerGemma)
        } else {
            None
        }
    }

    /// The instruction used when a request gives none (Gemma's is its prompt; mxbai's is none).
    pub fn default_instruction(self) -> Option<&'static str> {
        match self {
            Recipe::Qwen3Reranker => Some(QWEN3_INSTRUCTION),
            Recipe::MxbaiRerankV2 => None,
            Recipe::BgeRerankerGemma => Some(GEMMA_PROMPT),
        }
    }
}

/// A recipe bound to a model's tokenizer: its fixed parts as token ids, and the answer tokens.
#[derive(Clone)]
pub(super) struct Prompt {
    pub(super) recipe: Recipe,
    prefix: Vec<u32>,
    suffix: Vec<u32>,
    sep: Vec<u32>,
    /// Gemma's beginning of sequence, when it is not the padding token.
    bos: Option<u32>,
    /// The answer tokens: the positive one, and the negative one the score subtracts.
    answer: (u32, Option<u32>),
    /// The tokens every input has besides the query side and the segment (for the segmenter's budget), with
    /// the default instruction.
    pub(super) fixed: usize,
}

impl Prompt {
    /// The recipe's parts through `pieces`, or why the tokenizer cannot carry it.
    pub(super) fn new(recipe: Recipe, pieces: &Pieces, pad_id: u32) -> Result<Prompt, String> {
        let ids = |text: &str| pieces.ids(text).map_err(|e| e.to_string());
        let token = |token: &str| {
            pieces
                .token_id(token)
                .ok_or_else(|| format!("the {recipe:?} recipe needs the token {token:?}, which the tokenizer lacks"))
        };
        // The first piece of a text, as `tokenizer(text)["input_ids"][0]` reads it.
        let first = |text: &str| -> Result<u32, String> {
            ids(text)?.first().copied().ok_or_else(|| format!("the tokenizer gives no piece for {text:?}"))
        };
        let chat = |prefix: &str, suffix: &str| -> Result<(Vec<u32>, Vec<u32>), String> {
            token("<|im_start|>")?;
            token("<|im_end|>")?;
            Ok((ids(prefix)?, ids(suffix)?))
        };
        let (prefix, suffix, bos, answer) = match recipe {
            Recipe::Qwen3Reranker => {
                let (prefix, suffix) = chat(QWEN3_PREFIX, QWEN3_SUFFIX)?;
                (prefix, suffix, None, (token("yes")?, Some(token("no")?)))
            }
            Recipe::MxbaiRerankV2 => {
                let (prefix, suffix) = chat(MXBAI_PREFIX, MXBAI_SUFFIX)?;
                let tail = [ids(SEP)?, ids(MXBAI_TASK)?, suffix].concat();
                (prefix, tail, None, (first("1")?, Some(first("0")?)))
            }
            Recipe::BgeRerankerGemma => {
                let bos = token("<bos>")?;
                (Vec::new(), Vec::new(), (bos != pad_id).then_some(bos), (first("Yes")?, None))
            }
        };
        let sep = ids(SEP)?;
        let (label, own) = match recipe {
            Recipe::Qwen3Reranker => ("<Document>: ", 0),
            Recipe::MxbaiRerankV2 => ("document: ", sep.len()),
            Recipe::BgeRerankerGemma => ("B: ", 2 * sep.len() + ids(GEMMA_PROMPT)?.len() + bos.map_or(0, |_| 1)),
        };
        let fixed = prefix.len() + suffix.len() + own + ids(label)?.len();
        Ok(Prompt { recipe, prefix, suffix, sep, bos, answer, fixed })
    }

    /// The answer vector `[hidden]`: a converted sequence classifier's `score` row, else the output layer's
    /// (the embeddings' where the checkpoint ties them) positive row less the negative one.
    pub(super) fn answer(&self, vb: &VarBuilder, hidden: usize) -> candle_core::Result<Tensor> {
        if vb.contains_tensor("score.weight") {
            return vb.get((1, hidden), "score.weight")?.i(0);
        }
        let name = ["lm_head.weight", "model.embed_tokens.weight", "embed_tokens.weight"]
            .into_iter()
            .find(|name| vb.contains_tensor(name))
            .unwrap_or("lm_head.weight");
        let rows = vb.get_unchecked(name)?;
        let (positive, negative) = self.answer;
        let positive = rows.i(positive as usize)?;
        let vector = match negative {
            Some(negative) => (positive.to_dtype(DType::F32)? - rows.i(negative as usize)?.to_dtype(DType::F32)?)?,
            None => positive.to_dtype(DType::F32)?,
        };
        vector.to_dtype(rows.dtype())
    }

    /// The input for `query` and `segment` in at most `max_len` tokens, as the reference builds it. The query
    /// side (with the instruction where the template puts it there) is never cut: past `max_query_tokens` it is
    /// refused. The document is cut from its end, where the reference cuts it.
    pub(super) fn encode(
        &self,
        pieces: &Pieces,
        (instruction, query, segment): (Option<&str>, &str, &str),
        (max_len, max_query_tokens): (usize, usize),
    ) -> Result<Encoded, ModelError> {
        let over = |tokens: usize, budget: usize| -> Result<(), ModelError> {
            match tokens > budget {
                true => Err(ModelError::QueryOverBudget { tokens, budget }),
                false => Ok(()),
            }
        };
        let instruction = instruction.or(self.recipe.default_instruction());
        // The ids, and how many of them the query's other inputs share (the prompt up to the document).
        let (ids, shared) = match self.recipe {
            Recipe::Qwen3Reranker => {
                // The card tokenizes the instruction, query and document as one text and cuts its end: the query
                // side is shared where its tokens alone begin that text's (a token across the boundary: none).
                let instruction = instruction.unwrap_or_default();
                let head = format!("<Instruct>: {instruction}\n<Query>: {query}\n");
                let head = pieces.ids(&head)?;
                over(head.len(), max_query_tokens)?;
                let mut text =
                    pieces.ids(&format!("<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {segment}"))?;
                text.truncate(max_len.saturating_sub(self.prefix.len() + self.suffix.len()));
                let shared = if text.starts_with(&head) { self.prefix.len() + head.len() } else { 0 };
                ([&self.prefix[..], &text, &self.suffix].concat(), shared)
            }
            Recipe::MxbaiRerankV2 => {
                // `max_length` there is the input less the fixed parts; the query may take 3/4 of it, the
                // document what is left, cut first alone and then with the query (`only_second`).
                let content = max_len.saturating_sub(self.prefix.len() + self.suffix.len());
                let head = match instruction {
                    Some(instruction) => format!("instruction: {instruction}\nquery: {query}"),
                    None => format!("query: {query}"),
                };
                let head = pieces.ids(&head)?;
                over(head.len(), max_query_tokens.min(content * 3 / 4))?;
                let mut document = pieces.ids(&format!("document: {segment}"))?;
                document.truncate(content.saturating_sub(head.len() + self.sep.len()));
                let shared = self.prefix.len() + head.len() + self.sep.len();
                ([&self.prefix[..], &head, &self.sep, &document, &self.suffix].concat(), shared)
            }
            Recipe::BgeRerankerGemma => {
                // The prompt follows the pair, after a line; the query may take 3/4 of `max_length`, the input
                // less the fixed parts (counted twice there: FlagEmbedding cuts the pair to `max_length` plus
                // them, then adds them).
                let prompt = pieces.ids(instruction.unwrap_or_default())?;
                let tail = [&self.sep[..], &prompt].concat();
                let content = max_len.saturating_sub(2 * tail.len());
                let head = pieces.ids(&format!("A: {query}"))?;
                over(head.len(), max_query_tokens.min(content * 3 / 4))?;
                let mut passage = pieces.ids(&format!("B: {segment}"))?;
                passage.truncate(content);
                let bos = self.bos.as_slice();
                let mut pair = [bos, &head, &self.sep, &passage].concat();
                pair.truncate(content + tail.len());
                let shared = (bos.len() + head.len() + self.sep.len()).min(pair.len());
                ([&pair[..], &tail].concat(), shared)
            }
        };
        Ok(Encoded { type_ids: vec![0; ids.len()], ids, shared_prefix: shared })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipes_are_told_by_hub_ids_cache_paths_and_converted_architectures() {
        let none: &[String] = &[];
        assert_eq!(Recipe::detect("Qwen/Qwen3-Reranker-4B", none), Some(Recipe::Qwen3Reranker));
        let cached = "/root/.cache/huggingface/hub/models--mixedbread-ai--mxbai-rerank-large-v2/snapshots/0a1b";
        assert_eq!(Recipe::detect(cached, none), Some(Recipe::MxbaiRerankV2));
        assert_eq!(Recipe::detect("BAAI/bge-reranker-v2-gemma", none), Some(Recipe::BgeRerankerGemma));
        let converted = ["Qwen3ForSequenceClassification".to_string()];
        assert_eq!(Recipe::detect("/models/finetune", &converted), Some(Recipe::Qwen3Reranker));
        // mxbai's v1 rerankers are DeBERTa classifiers; a plain Qwen3 is a chat model, not a reranker.
        assert_eq!(Recipe::detect("mixedbread-ai/mxbai-rerank-base-v1", none), None);
        assert_eq!(Recipe::detect("Qwen/Qwen3-0.6B", &["Qwen3ForCausalLM".to_string()]), None);
    }

    #[test]
    fn recipe_names_are_the_configurations_and_the_refusals() {
        let names: Vec<String> = [Recipe::Qwen3Reranker, Recipe::MxbaiRerankV2, Recipe::BgeRerankerGemma]
            .iter()
            .map(|r| serde_json::to_value(r).unwrap().as_str().unwrap().to_string())
            .collect();
        assert_eq!(names.join(", "), RECIPES);
    }
}
