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
    let mut out = Vec::new();
    for (start, word) in text.unicode_word_indices() {
        let word = strip_possessive(word);
        let mut pieces = word.char_indices().step_by(MAX_TOKEN_CHARS).map(|(i, _)| i).peekable();
        while let Some(from) = pieces.next() {
            let to = pieces.peek().copied().unwrap_or(word.len());
            if let Some(term) = term(&word[from..to]) {
                out.push(Token { term, span: start + from..start + to });
            }
        }
    }
    out
}

/// Analyzes text into terms only.
pub fn terms(text: &str) -> Vec<String> {
    tokens(text).into_iter().map(|t| t.term).collect()
}

fn term(word: &str) -> Option<String> {
    let lower = word.to_lowercase();
    if STOP_WORDS.contains(&lower.as_str()) {
        return None;
    }
    Some(cached_stem(lower))
}

/// Stems through a per-thread cache: word frequencies are Zipfian, so most tokens are cache hits, and the
/// stemmer is a pure function.
fn cached_stem(word: String) -> String {
    const MAX_ENTRIES: usize = 200_000;
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
    fn offsets_point_at_the_words() {
        let text = "Évian's waters flow";
        let toks = tokens(text);
        assert_eq!(toks[0], Token { term: "évian".into(), span: 0..6 });
        assert_eq!(&text[toks[1].span.clone()], "waters");
        assert_eq!(toks[2].term, "flow");
    }
}
