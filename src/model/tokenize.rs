//! A model's pieces: its `tokenizer.json` (WordPiece, SentencePiece-Unigram or byte-level BPE) with the pair and
//! single templates of its post-processor (BERT's `[CLS] q [SEP] d [SEP]` with token types, RoBERTa's
//! `<s> q </s></s> d </s>` without, or any template), truncation done here (the file's own truncation and
//! padding are switched off).

use std::path::Path;

use tokenizers::processors::bert::BertProcessing;
use tokenizers::{Encoding, PostProcessor, Tokenizer, TruncationDirection};

use super::error::{load_err, ModelError};

/// A model input: token ids with their token types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    pub ids: Vec<u32>,
    pub type_ids: Vec<u32>,
    /// Leading tokens that every input of the same query shares (a decoder prompt's query side), which a
    /// decoder computes once for all of them; 0 where none.
    pub shared_prefix: usize,
}

#[derive(Clone)]
pub(super) struct Pieces {
    tokenizer: Tokenizer,
    /// Special tokens the template adds to a pair, and to one text.
    pair_added: usize,
    single_added: usize,
    pub(super) pad_id: u32,
    /// The model's longest input (its positions).
    pub(super) max_len: usize,
    /// FNV-1a of the tokenizer as loaded (its file with our post-processor, padding and truncation): two
    /// models count and template text alike exactly when theirs are equal.
    fingerprint: u64,
}

impl Pieces {
    /// The tokenizer at `path` for a model of `max_len` positions; `pad_id` is the model's (`config.json`),
    /// else the tokenizer's padding token, `[PAD]` or `<pad>`. A tokenizer without a post-processor gets
    /// BERT's, from its `[CLS]` and `[SEP]`, unless it is a decoder's (`templated`: its recipe builds inputs).
    pub(super) fn load(
        path: &Path,
        max_len: usize,
        pad_id: Option<u32>,
        templated: bool,
    ) -> Result<Pieces, ModelError> {
        let mut tokenizer = Tokenizer::from_file(path).map_err(|e| load_err(path, e))?;
        let id = |token: &str| tokenizer.token_to_id(token);
        let pad_id = pad_id
            .or_else(|| tokenizer.get_padding().map(|p| p.pad_id))
            .or_else(|| id("[PAD]"))
            .or_else(|| id("<pad>"))
            .ok_or_else(|| load_err(path, "no padding token (config.json's pad_token_id, [PAD] or <pad>)"))?;
        if tokenizer.get_post_processor().is_none() && !templated {
            let (Some(cls), Some(sep)) = (id("[CLS]"), id("[SEP]")) else {
                return Err(load_err(path, "no post-processor, and no [CLS] and [SEP] to build BERT's"));
            };
            tokenizer.with_post_processor(Some(BertProcessing::new(("[SEP]".into(), sep), ("[CLS]".into(), cls))));
        }
        tokenizer.with_padding(None);
        tokenizer.with_truncation(None).map_err(|e| load_err(path, e))?;
        let added = |pair| tokenizer.get_post_processor().map_or(0, |p| p.added_tokens(pair));
        let (pair_added, single_added) = (added(true), added(false));
        let serialized = tokenizer.to_string(false).map_err(|e| load_err(path, e))?;
        let mut fingerprint = crate::hash::Fnv::default();
        fingerprint.write(serialized.as_bytes());
        let fingerprint = fingerprint.0;
        Ok(Pieces { tokenizer, pair_added, single_added, pad_id, max_len, fingerprint })
    }

    /// What the pieces depend on (see the field): a cache of anything cut or counted by them keys by it.
    pub(super) fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// The ids of `text` without special tokens added (`tokenizer(text, add_special_tokens=False)`).
    pub(super) fn ids(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        Ok(self.encoding(text)?.get_ids().to_vec())
    }

    /// The id of one token of the vocabulary (`convert_tokens_to_ids`).
    pub(super) fn token_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// Token ids the tokenizer can give (added tokens included).
    pub(super) fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    fn encoding(&self, text: &str) -> Result<Encoding, ModelError> {
        self.tokenizer.encode(text, false).map_err(|e| ModelError::Tokenizer(e.to_string()))
    }

    pub(super) fn count(&self, text: &str) -> Result<usize, ModelError> {
        Ok(self.encoding(text)?.len())
    }

    /// `text`'s pieces as one sequence with its special tokens (before `single` cuts any), and the most
    /// `single` keeps of them with `max_len`.
    pub(super) fn single_len(&self, text: &str, max_len: usize) -> Result<(usize, usize), ModelError> {
        Ok((self.count(text)? + self.single_added, max_len.min(self.max_len)))
    }

    /// The bytes of `text` that hold its first `n` pieces (all of it when it has no more).
    pub(super) fn prefix_bytes(&self, text: &str, n: usize) -> Result<usize, ModelError> {
        let encoding = self.encoding(text)?;
        let offsets = encoding.get_offsets();
        Ok(if offsets.len() <= n { text.len() } else { offsets[..n].iter().map(|&(_, end)| end).max().unwrap_or(0) })
    }

    /// The most pieces a segment may have so that `pair` never cuts it: what is left of the input after the
    /// query budget and the template's special tokens.
    pub(super) fn segment_budget(&self, max_len: usize, max_query_tokens: usize) -> usize {
        max_len.min(self.max_len).saturating_sub(max_query_tokens + self.pair_added).max(1)
    }

    /// The pair template over the query, cut to `max_query_tokens`, and the segment, cut so the whole fits
    /// `max_len` (only the segment side is cut for that).
    pub(super) fn pair(
        &self,
        query: &str,
        segment: &str,
        max_len: usize,
        max_query_tokens: usize,
    ) -> Result<Encoded, ModelError> {
        let max_len = max_len.min(self.max_len);
        let query = cut(self.encoding(query)?, max_query_tokens.min(max_len.saturating_sub(self.pair_added + 1)));
        let room = max_len.saturating_sub(query.len() + self.pair_added);
        let segment = cut(self.encoding(segment)?, room);
        self.template(query, Some(segment))
    }

    /// The single template over `text`, cut to fit `max_len`.
    pub(super) fn single(&self, text: &str, max_len: usize) -> Result<Encoded, ModelError> {
        let text = cut(self.encoding(text)?, max_len.min(self.max_len).saturating_sub(self.single_added));
        self.template(text, None)
    }

    fn template(&self, first: Encoding, second: Option<Encoding>) -> Result<Encoded, ModelError> {
        let encoding =
            self.tokenizer.post_process(first, second, true).map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        Ok(Encoded { ids: encoding.get_ids().to_vec(), type_ids: encoding.get_type_ids().to_vec(), shared_prefix: 0 })
    }
}

/// The first `n` pieces of an encoding (what is cut off is dropped, not kept as an overflow).
fn cut(mut encoding: Encoding, n: usize) -> Encoding {
    if encoding.len() > n {
        encoding.truncate(n, 0, TruncationDirection::Right);
        encoding.take_overflowing();
    }
    encoding
}
