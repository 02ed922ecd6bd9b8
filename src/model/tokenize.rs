//! Word pieces for BERT inputs, with truncation done here (the `tokenizer.json` settings are switched off).

use std::path::Path;

use tokenizers::Tokenizer;

use super::{load_err, ModelError};

/// A model input: word-piece ids with their token types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    pub ids: Vec<u32>,
    pub type_ids: Vec<u32>,
}

#[derive(Clone)]
pub(super) struct WordPieces {
    tokenizer: Tokenizer,
    cls_id: u32,
    sep_id: u32,
    pub(super) pad_id: u32,
    /// The model's longest input (position embeddings).
    pub(super) max_len: usize,
}

impl WordPieces {
    pub(super) fn load(path: &Path, max_len: usize) -> Result<WordPieces, ModelError> {
        let mut tokenizer = Tokenizer::from_file(path).map_err(|e| load_err(path, e))?;
        tokenizer.with_padding(None);
        tokenizer.with_truncation(None).map_err(|e| load_err(path, e))?;
        let id = |token: &str| tokenizer.token_to_id(token).ok_or_else(|| load_err(path, format!("no {token} token")));
        Ok(WordPieces { cls_id: id("[CLS]")?, sep_id: id("[SEP]")?, pad_id: id("[PAD]")?, tokenizer, max_len })
    }

    fn pieces(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        let encoding = self.tokenizer.encode(text, false).map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    pub(super) fn count(&self, text: &str) -> Result<usize, ModelError> {
        Ok(self.pieces(text)?.len())
    }

    /// The bytes of `text` that hold its first `n` word pieces (all of it when it has no more).
    pub(super) fn prefix_bytes(&self, text: &str, n: usize) -> Result<usize, ModelError> {
        let encoding = self.tokenizer.encode(text, false).map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        let offsets = encoding.get_offsets();
        Ok(if offsets.len() <= n { text.len() } else { offsets[..n].iter().map(|&(_, end)| end).max().unwrap_or(0) })
    }

    /// The most word pieces a segment may have so that `pair` never cuts it: what is left of the input after
    /// the query budget and the three special tokens.
    pub(super) fn segment_budget(&self, max_len: usize, max_query_tokens: usize) -> usize {
        max_len.min(self.max_len).saturating_sub(max_query_tokens + 3).max(1)
    }

    /// `[CLS] query [SEP] segment [SEP]`, token types 0 then 1; only the segment side is cut to fit.
    pub(super) fn pair(
        &self,
        query: &str,
        segment: &str,
        max_len: usize,
        max_query_tokens: usize,
    ) -> Result<Encoded, ModelError> {
        let max_len = max_len.min(self.max_len);
        let mut query = self.pieces(query)?;
        query.truncate(max_query_tokens.min(max_len.saturating_sub(4)));
        let mut segment = self.pieces(segment)?;
        segment.truncate(max_len.saturating_sub(query.len() + 3));
        let mut ids = Vec::with_capacity(query.len() + segment.len() + 3);
        ids.push(self.cls_id);
        ids.extend(&query);
        ids.push(self.sep_id);
        let first = ids.len();
        ids.extend(&segment);
        ids.push(self.sep_id);
        let type_ids = (0..ids.len()).map(|i| (i >= first) as u32).collect();
        Ok(Encoded { ids, type_ids })
    }

    /// `[CLS] text [SEP]`, cut to `max_len`.
    pub(super) fn single(&self, text: &str, max_len: usize) -> Result<Encoded, ModelError> {
        let mut pieces = self.pieces(text)?;
        pieces.truncate(max_len.min(self.max_len).saturating_sub(2));
        let mut ids = Vec::with_capacity(pieces.len() + 2);
        ids.push(self.cls_id);
        ids.extend(pieces);
        ids.push(self.sep_id);
        let type_ids = vec![0; ids.len()];
        Ok(Encoded { ids, type_ids })
    }
}
