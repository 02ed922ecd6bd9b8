//! English analysis as Anserini's default analyzer does it: Unicode (UAX #29) word tokens as Lucene's
//! StandardTokenizer finds them, possessive `'s` removed, lower-cased, Lucene's English stop words dropped,
//! Porter-stemmed. Documents and queries go through the same function, so a query is a bag of these terms
//! and nothing in it is an operator.

use std::ops::Range;

use unicode_segmentation::UnicodeSegmentation;

use super::porter;

/// Lucene's `EnglishAnalyzer.ENGLISH_STOP_WORDS_SET`.
pub const STOP_WORDS: [&str; 33] = [
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it", "no", "not", "of",
    "on", "or", "such", "that", "the", "their", "then", "there", "these", "they", "this", "to", "was", "will", "with",
];

/// Lucene's StandardTokenizer default maximum token length; longer runs are cut into pieces.
const MAX_TOKEN_CHARS: usize = 255;

/// One analyzed term with the byte range of the word it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub term: String,
    pub span: Range<usize>,
}

/// Analyzes text into terms with their byte offsets.
pub fn tokens(text: &str) -> Vec<Token> {
    Pieces::new(text)
        .filter(|(_, piece)| !is_stop(piece))
        .map(|(span, piece)| Token { term: cached_stem(piece.to_lowercase()), span })
        .collect()
}

/// Analyzes text into terms only.
pub fn terms(text: &str) -> Vec<String> {
    tokens(text).into_iter().map(|t| t.term).collect()
}

/// How many terms `tokens` would give, without stemming or allocating (the exact document length BM25
/// uses, computed before tantivy's indexing threads analyze the text).
pub fn count_terms(text: &str) -> usize {
    Pieces::new(text).filter(|(_, piece)| !is_stop(piece)).count()
}

/// A stop word, compared without allocating (the list is ASCII; no non-ASCII letter lower-cases into it).
fn is_stop(piece: &str) -> bool {
    piece.len() <= 5 && STOP_WORDS.iter().any(|s| s.eq_ignore_ascii_case(piece))
}

/// Word pieces before the stop list: UAX #29 words, possessive removed, cut every `MAX_TOKEN_CHARS`.
struct Pieces<'a> {
    words: unicode_segmentation::UnicodeWordIndices<'a>,
    /// The rest of a word longer than `MAX_TOKEN_CHARS`, with its offset.
    rest: Option<(usize, &'a str)>,
}

impl<'a> Pieces<'a> {
    fn new(text: &'a str) -> Self {
        Pieces { words: text.unicode_word_indices(), rest: None }
    }
}

impl<'a> Iterator for Pieces<'a> {
    type Item = (Range<usize>, &'a str);

    fn next(&mut self) -> Option<Self::Item> {
        let (start, word) = match self.rest.take() {
            Some(rest) => rest,
            None => {
                let (start, word) = self.words.next()?;
                (start, strip_possessive(word))
            }
        };
        let cut = if word.len() <= MAX_TOKEN_CHARS {
            word.len()
        } else {
            word.char_indices().nth(MAX_TOKEN_CHARS).map_or(word.len(), |(i, _)| i)
        };
        if cut < word.len() {
            self.rest = Some((start + cut, &word[cut..]));
        }
        Some((start..start + cut, &word[..cut]))
    }
}

/// Our analyzer as a tantivy tokenizer, so that documents are analyzed in tantivy's indexing threads.
#[derive(Clone, Default)]
pub struct TantivyAnalyzer;

/// The name the schema gives the analyzer.
pub const TANTIVY_TOKENIZER: &str = "longrank_en";

impl tantivy::tokenizer::Tokenizer for TantivyAnalyzer {
    type TokenStream<'a> = AnalyzedStream;

    fn token_stream<'a>(&'a mut self, text: &'a str) -> AnalyzedStream {
        let tokens = tokens(text)
            .into_iter()
            .enumerate()
            .map(|(position, t)| tantivy::tokenizer::Token {
                offset_from: t.span.start,
                offset_to: t.span.end,
                position,
                text: t.term,
                position_length: 1,
            })
            .collect();
        AnalyzedStream { tokens, next: 0 }
    }
}

pub struct AnalyzedStream {
    tokens: Vec<tantivy::tokenizer::Token>,
    /// One past the current token.
    next: usize,
}

impl tantivy::tokenizer::TokenStream for AnalyzedStream {
    fn advance(&mut self) -> bool {
        if self.next < self.tokens.len() {
            self.next += 1;
            true
        } else {
            false
        }
    }

    fn token(&self) -> &tantivy::tokenizer::Token {
        &self.tokens[self.next - 1]
    }

    fn token_mut(&mut self) -> &mut tantivy::tokenizer::Token {
        &mut self.tokens[self.next - 1]
    }
}

/// Stems through a per-thread cache: word frequencies are Zipfian, so most tokens are cache hits, and the
/// stemmer is a pure function.
fn cached_stem(word: String) -> String {
    const MAX_ENTRIES: usize = 50_000;
    thread_local! {
        static CACHE: std::cell::RefCell<std::collections::HashMap<String, String>> = Default::default();
    }
    CACHE.with(|cache| {
        let mut cache = cache.borrow_mut();
        if let Some(stem) = cache.get(&word) {
            return stem.clone();
        }
        if cache.len() >= MAX_ENTRIES {
            cache.clear();
        }
        let stem = porter::stem(&word);
        cache.insert(word, stem.clone());
        stem
    })
}

/// Lucene's EnglishPossessiveFilter: a trailing `'s` (straight, curly or full-width apostrophe) goes.
fn strip_possessive(word: &str) -> &str {
    for apostrophe in ["'s", "'S", "\u{2019}s", "\u{2019}S", "\u{ff07}s", "\u{ff07}S"] {
        if let Some(stripped) = word.strip_suffix(apostrophe) {
            return stripped;
        }
    }
    word
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn analyzes_like_anserini() {
        assert_eq!(
            terms("The Aerodynamics of Wings, in a slip-stream: Drake's 1859 well (U.S.) -dash AND/OR"),
            ["aerodynam", "wing", "slip", "stream", "drake", "1859", "well", "u.", "dash"]
        );
    }

    #[test]
    fn counting_agrees_with_analysis() {
        let long = "x".repeat(600);
        for text in ["The Wings of THE bird", "Drake's AND the U.S. It's", long.as_str(), "", "ünïcödé wörds Straße"]
        {
            assert_eq!(count_terms(text), tokens(text).len(), "{text}");
        }
        assert_eq!(tokens(&long).len(), 3);
    }

    #[test]
    fn offsets_point_at_the_words() {
        let text = "Évian's waters flow";
        let toks = tokens(text);
        assert_eq!(toks[0], Token { term: "évian".into(), span: 0..6 });
        assert_eq!(&text[toks[1].span.clone()], "waters");
        assert_eq!(toks[2].term, "flow");
    }
}
