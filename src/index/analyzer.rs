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
        .map(|(span, piece)| {
            let mut term = String::new();
            term_of(piece, &mut term);
            Token { term, span }
        })
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

/// UAX #29 words with their byte offsets, as unicode-segmentation's `unicode_word_indices` gives them. An ASCII
/// text is scanned by hand: the crate's ASCII path yields every space and punctuation mark as a segment of its
/// own and filters them out after, and the analyzer reads every document twice (its length is counted before
/// indexing), so this loop is a large share of indexing. The rules are the crate's ASCII rules (WB5-WB13 over
/// letters, digits, `_` and the infixes `.` `'` `:` `,` `;`); the test below compares the two on random text.
enum Words<'a> {
    Ascii { text: &'a str, at: usize },
    Unicode(unicode_segmentation::UnicodeWordIndices<'a>),
}

impl<'a> Words<'a> {
    fn new(text: &'a str) -> Self {
        match text.is_ascii() {
            true => Words::Ascii { text, at: 0 },
            false => Words::Unicode(text.unicode_word_indices()),
        }
    }
}

impl<'a> Iterator for Words<'a> {
    type Item = (usize, &'a str);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        let (text, at) = match self {
            Words::Unicode(words) => return words.next(),
            Words::Ascii { text, at } => (*text, at),
        };
        let bytes = text.as_bytes();
        let core = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
        loop {
            // Anything else is a segment of its own (or a run of spaces, or CR LF) and never a word.
            let start = *at + bytes[*at..].iter().position(|&b| core(b))?;
            let mut end = start + 1;
            while end < bytes.len() {
                let b = bytes[end];
                let joins = core(b)
                    || bytes.get(end + 1).is_some_and(|&next| {
                        let prev = bytes[end - 1];
                        match b {
                            // WB11/WB12: "3.14", "1,000"; WB6/WB7: "e.g", "o'neil", "a:b".
                            b'.' | b',' | b';' | b'\'' if prev.is_ascii_digit() && next.is_ascii_digit() => true,
                            b'\'' | b'.' | b':' => prev.is_ascii_alphabetic() && next.is_ascii_alphabetic(),
                            _ => false,
                        }
                    });
                if !joins {
                    break;
                }
                end += 1;
            }
            *at = end;
            // A run of underscores alone is not a word.
            if bytes[start..end].iter().any(u8::is_ascii_alphanumeric) {
                return Some((start, &text[start..end]));
            }
        }
    }
}

/// Word pieces before the stop list: UAX #29 words, possessive removed, cut every `MAX_TOKEN_CHARS`.
struct Pieces<'a> {
    words: Words<'a>,
    /// The rest of a word longer than `MAX_TOKEN_CHARS`, with its offset.
    rest: Option<(usize, &'a str)>,
}

impl<'a> Pieces<'a> {
    fn new(text: &'a str) -> Self {
        Pieces { words: Words::new(text), rest: None }
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
    type TokenStream<'a> = AnalyzedStream<'a>;

    fn token_stream<'a>(&'a mut self, text: &'a str) -> AnalyzedStream<'a> {
        AnalyzedStream { pieces: Pieces::new(text), token: tantivy::tokenizer::Token::default(), terms: 0 }
    }
}

/// Terms one at a time into one token, its text buffer reused: an indexing thread allocates nothing per term.
pub struct AnalyzedStream<'a> {
    pieces: Pieces<'a>,
    token: tantivy::tokenizer::Token,
    /// Terms given so far.
    terms: usize,
}

impl tantivy::tokenizer::TokenStream for AnalyzedStream<'_> {
    fn advance(&mut self) -> bool {
        let Some((span, piece)) = self.pieces.by_ref().find(|(_, piece)| !is_stop(piece)) else { return false };
        self.token.offset_from = span.start;
        self.token.offset_to = span.end;
        self.token.position = self.terms;
        self.token.position_length = 1;
        term_of(piece, &mut self.token.text);
        self.terms += 1;
        true
    }

    fn token(&self) -> &tantivy::tokenizer::Token {
        &self.token
    }

    fn token_mut(&mut self) -> &mut tantivy::tokenizer::Token {
        &mut self.token
    }
}

/// Words (lower-cased) and their stems kept per thread, inline in one table indexed by the word's hash (a word
/// found costs one hash and one memory access, no pointer followed, no allocation): word frequencies are
/// Zipfian, so most words are found, and the stemmer is a pure function. A word longer than a slot is stemmed
/// each time; two words of one slot take it in turn.
struct Stems {
    slots: Vec<Slot>,
    /// The word being looked up, lower-cased.
    lower: String,
}

/// Bytes of a word or stem a slot holds.
const INLINE: usize = 23;
/// Slots per thread (48 bytes each: 3 MB).
const SLOTS: usize = 1 << 16;

#[derive(Clone, Copy)]
struct Slot {
    /// 0: empty (words are never empty).
    word_len: u8,
    stem_len: u8,
    word: [u8; INLINE],
    stem: [u8; INLINE],
}

impl Default for Stems {
    fn default() -> Self {
        let empty = Slot { word_len: 0, stem_len: 0, word: [0; INLINE], stem: [0; INLINE] };
        Stems { slots: vec![empty; SLOTS], lower: String::new() }
    }
}

/// The term of a word piece (not a stop word), written into `term`: lower-cased, Porter-stemmed.
fn term_of(piece: &str, term: &mut String) {
    use std::hash::Hasher;
    thread_local! {
        static STEMS: std::cell::RefCell<Stems> = Default::default();
    }
    STEMS.with(|stems| {
        let Stems { slots, lower } = &mut *stems.borrow_mut();
        lower.clear();
        match piece.is_ascii() {
            true => lower.extend(piece.bytes().map(|b| char::from(b.to_ascii_lowercase()))),
            false => lower.push_str(&piece.to_lowercase()),
        }
        term.clear();
        let word = lower.as_bytes();
        if word.len() > INLINE {
            term.push_str(&porter::stem(lower));
            return;
        }
        let mut hash = rustc_hash::FxHasher::default();
        hash.write(word);
        let slot = &mut slots[(hash.finish() >> 48) as usize % SLOTS];
        if slot.word_len as usize == word.len() && &slot.word[..word.len()] == word {
            term.push_str(std::str::from_utf8(&slot.stem[..slot.stem_len as usize]).expect("stems are text"));
            return;
        }
        let stem = porter::stem(lower);
        if stem.len() <= INLINE {
            slot.word_len = word.len() as u8;
            slot.word[..word.len()].copy_from_slice(word);
            slot.stem_len = stem.len() as u8;
            slot.stem[..stem.len()].copy_from_slice(stem.as_bytes());
        }
        term.push_str(&stem);
    })
}

/// Lucene's EnglishPossessiveFilter: a trailing `'s` (straight, curly or full-width apostrophe) goes.
fn strip_possessive(word: &str) -> &str {
    word.strip_suffix(['s', 'S']).and_then(|rest| rest.strip_suffix(['\'', '\u{2019}', '\u{ff07}'])).unwrap_or(word)
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
        // Every apostrophe of the possessive filter, either case of `s`.
        assert_eq!(terms("Drake\u{2019}s JOHN\u{ff07}S boss's it's Its"), ["drake", "john", "boss", "it"]);
    }

    #[test]
    fn tantivy_sees_the_same_terms_positions_and_offsets() {
        use tantivy::tokenizer::{TokenStream, Tokenizer};
        let text = "The Wings of THE bird: Drake's AND ünïcödé Straße, wings again";
        let mut analyzer = TantivyAnalyzer;
        let mut stream = analyzer.token_stream(text);
        let mut seen = Vec::new();
        while stream.advance() {
            let t = stream.token();
            seen.push((t.position, t.text.clone(), t.offset_from..t.offset_to, t.position_length));
        }
        let expected: Vec<_> = tokens(text).into_iter().enumerate().map(|(i, t)| (i, t.term, t.span, 1)).collect();
        assert_eq!(seen, expected);
        assert_eq!(seen.len(), 7);
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
    fn ascii_words_are_unicode_segmentations_words() {
        // Random ASCII over the bytes the rules treat apart (letters, digits, `_`, each infix, spaces, CR LF,
        // other punctuation), from a fixed seed: tens of thousands of boundaries.
        let alphabet = b"aZx09_.,;':  \r\n\t-\"/(";
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..3000 {
            let text: String = (0..len % 97)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    char::from(alphabet[(state % alphabet.len() as u64) as usize])
                })
                .collect();
            let ours: Vec<_> = Words::new(&text).collect();
            let theirs: Vec<_> = text.unicode_word_indices().collect();
            assert_eq!(ours, theirs, "{text:?}");
        }
        let text = "e.g. U.S.A. 3.14 1,000,000 o'neil a:b _x_ __ x__y 2;3 a.1 1.a 'quoted' end.";
        assert_eq!(Words::new(text).collect::<Vec<_>>(), text.unicode_word_indices().collect::<Vec<_>>());
    }

    #[test]
    fn the_stem_table_gives_the_stemmers_stems() {
        // Far more words than slots, each met several times (found, or evicted by another of its slot), and
        // words longer than a slot: every term is the stemmer's.
        let words: Vec<String> = (0..200_000u32)
            .map(|i| match i % 5 {
                0 => format!("Relational{i}ities"),
                1 => format!("hoping{}", i % 3000),
                2 => ["running", "Flies", "generalizations", "ünïcödé", "ponies", "a"][i as usize % 6].to_string(),
                _ => format!("caresses{}", i % 70_000),
            })
            .collect();
        let mut term = String::new();
        for word in &words {
            term_of(word, &mut term);
            assert_eq!(term, porter::stem(&word.to_lowercase()), "{word}");
        }
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
