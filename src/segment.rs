//! Documents into segments for models that read a few hundred tokens at a time. Segments are UTF-8 byte
//! ranges of the stored `text` (never of a repeated title), so they do not depend on the query and a client
//! can highlight them.

use std::borrow::Cow;
use std::ops::Range;

use serde::{Deserialize, Serialize};
use unicode_segmentation::UnicodeSegmentation;

/// One segment: its position in the document and its byte range in the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Segment {
    pub index: usize,
    pub start: usize,
    pub end: usize,
}

impl Segment {
    pub fn text<'a>(&self, text: &'a str) -> &'a str {
        &text[self.start..self.end]
    }
}

/// Counts tokens the way the model will (its tokenizer, without special tokens).
pub trait TokenCounter {
    fn count(&self, text: &str) -> usize;
}

/// How to cut documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Strategy {
    /// Whole sentences packed into segments of at most `max_tokens` tokens (the BeST paper's segments); a
    /// sentence longer than that is cut between words.
    Sentences { max_tokens: usize },
    /// Windows of `words` whitespace-separated words every `stride` words (Co-BERT and Dai & Callan use
    /// 150 / 75; `stride == words` gives non-overlapping windows).
    Windows { words: usize, stride: usize },
}

/// The segmenting a request or the configuration asks for; the sentence budget comes from the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default, deny_unknown_fields)]
#[schema(example = json!({"strategy": "windows", "words": 40, "stride": 20}))]
pub struct SegmentOptions {
    /// `sentences` (whole sentences up to the model's token budget) or `windows` (fixed word windows).
    pub strategy: StrategyKind,
    /// Sentences: a smaller token budget than the model allows (0: the model's).
    pub max_tokens: usize,
    /// Windows: words per window.
    pub words: usize,
    /// Windows: words between window starts, 1 to `words` (equal to `words`: no overlap).
    pub stride: usize,
    /// Repeat the document's title at the start of every segment the model reads (offsets still point into
    /// the text only).
    pub repeat_title: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StrategyKind {
    #[default]
    Sentences,
    Windows,
}

impl Default for SegmentOptions {
    fn default() -> Self {
        SegmentOptions { strategy: StrategyKind::Sentences, max_tokens: 0, words: 150, stride: 75, repeat_title: false }
    }
}

impl SegmentOptions {
    /// The strategy for a document, given the model's segment budget in tokens (already less the title's
    /// tokens when the title is repeated).
    pub fn strategy(&self, budget: usize) -> Strategy {
        match self.strategy {
            StrategyKind::Sentences => {
                let max_tokens = if self.max_tokens == 0 { budget } else { self.max_tokens.min(budget) };
                Strategy::Sentences { max_tokens: max_tokens.max(1) }
            }
            StrategyKind::Windows => Strategy::Windows { words: self.words, stride: self.stride },
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.strategy == StrategyKind::Windows && (self.words == 0 || self.stride == 0 || self.stride > self.words) {
            return Err(format!("windows need 1 <= stride <= words, got words={} stride={}", self.words, self.stride));
        }
        Ok(())
    }
}

/// Cuts `text` into segments, at most `max_segments` of them (all by default).
pub fn segment(
    text: &str,
    strategy: Strategy,
    counter: &dyn TokenCounter,
    max_segments: Option<usize>,
) -> Vec<Segment> {
    let ranges = match strategy {
        Strategy::Sentences { max_tokens } => sentence_segments(text, max_tokens.max(1), counter),
        Strategy::Windows { words, stride } => windows(text, words.max(1), stride.max(1)),
    };
    ranges
        .into_iter()
        .take(max_segments.unwrap_or(usize::MAX))
        .enumerate()
        .map(|(index, r)| Segment { index, start: r.start, end: r.end })
        .collect()
}

fn sentence_segments(text: &str, max_tokens: usize, counter: &dyn TokenCounter) -> Vec<Range<usize>> {
    packed(text, max_tokens, counter, &mut || max_tokens).into_iter().map(|(range, _)| range).collect()
}

/// Whole sentences packed into segments, each up to its own budget from `budgets` (at most `max_tokens`),
/// with their token counts.
fn packed(
    text: &str,
    max_tokens: usize,
    counter: &dyn TokenCounter,
    budgets: &mut dyn FnMut() -> usize,
) -> Vec<(Range<usize>, usize)> {
    let mut out = Vec::new();
    let mut current: Option<(Range<usize>, usize)> = None;
    let mut budget = budgets().clamp(1, max_tokens);
    // Sentences are whitespace-separated, and word-piece tokenizers split on whitespace first, so a
    // segment's token count is the sum of its sentences' counts: each sentence is tokenized once.
    for (piece, tokens) in sentences(text, max_tokens, counter) {
        current = match current {
            Some((range, n)) if n + tokens <= budget => Some((range.start..piece.end, n + tokens)),
            Some(done) => {
                out.push(done);
                budget = budgets().clamp(1, max_tokens);
                Some((piece, tokens))
            }
            None => Some((piece, tokens)),
        };
    }
    out.extend(current);
    out
}

/// Training segments: sentences packed into segments whose budgets are drawn from `budgets` (so that length
/// says nothing about relevance), only the leading ones whose tokens add up to `doc_tokens` (at least one).
pub fn training_segments(
    text: &str,
    max_tokens: usize,
    counter: &dyn TokenCounter,
    doc_tokens: Option<usize>,
    budgets: &mut dyn FnMut() -> usize,
) -> Vec<Segment> {
    let mut total = 0;
    packed(text, max_tokens.max(1), counter, budgets)
        .into_iter()
        .take_while(|(_, tokens)| {
            total += tokens;
            doc_tokens.is_none_or(|budget| total <= budget || total == *tokens)
        })
        .enumerate()
        .map(|(index, (r, _))| Segment { index, start: r.start, end: r.end })
        .collect()
}

/// What the model reads for each segment: the segment, after the title when titles are repeated.
pub fn model_input<'d>(title_prefix: Option<&str>, text: &'d str, segment: &Segment) -> Cow<'d, str> {
    match title_prefix {
        Some(prefix) => Cow::Owned(format!("{prefix}{}", segment.text(text))),
        None => Cow::Borrowed(segment.text(text)),
    }
}

/// The prefix a repeated title puts before every segment (`None` when titles are not repeated or empty).
pub fn title_prefix(title: &str, repeat: bool) -> Option<String> {
    let title = title.trim();
    (repeat && !title.is_empty()).then(|| format!("{title} "))
}

/// Sentence ranges (trimmed of surrounding whitespace) with their token counts; a sentence over the budget
/// comes back as pieces that fit, cut between words.
fn sentences(text: &str, max_tokens: usize, counter: &dyn TokenCounter) -> Vec<(Range<usize>, usize)> {
    let mut out = Vec::new();
    for (start, sentence) in text.split_sentence_bound_indices() {
        let Some(range) = trimmed(text, start..start + sentence.len()) else { continue };
        let tokens = counter.count(&text[range.clone()]);
        if tokens <= max_tokens {
            out.push((range, tokens));
            continue;
        }
        let mut piece: Option<(Range<usize>, usize)> = None;
        for word in word_ranges(&text[range.clone()]).map(|w| w.start + range.start..w.end + range.start) {
            let n = counter.count(&text[word.clone()]);
            piece = match piece {
                Some((p, m)) if m + n <= max_tokens => Some((p.start..word.end, m + n)),
                Some(p) => {
                    out.push(p);
                    Some((word, n))
                }
                None => Some((word, n)),
            };
        }
        out.extend(piece);
    }
    out
}

fn trimmed(text: &str, range: Range<usize>) -> Option<Range<usize>> {
    let s = &text[range.clone()];
    let start = range.start + (s.len() - s.trim_start().len());
    let end = range.end - (s.len() - s.trim_end().len());
    (start < end).then_some(start..end)
}

/// Byte ranges of whitespace-separated words.
fn word_ranges(text: &str) -> impl Iterator<Item = Range<usize>> + '_ {
    text.split_whitespace().map(move |w| {
        let start = w.as_ptr() as usize - text.as_ptr() as usize;
        start..start + w.len()
    })
}

fn windows(text: &str, size: usize, stride: usize) -> Vec<Range<usize>> {
    let words: Vec<Range<usize>> = word_ranges(text).collect();
    let mut out = Vec::new();
    let mut first = 0;
    while first < words.len() {
        let last = (first + size).min(words.len()) - 1;
        out.push(words[first].start..words[last].end);
        if last + 1 == words.len() {
            break;
        }
        first += stride;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One token per whitespace-separated word.
    struct Words;

    impl TokenCounter for Words {
        fn count(&self, text: &str) -> usize {
            text.split_whitespace().count()
        }
    }

    fn texts<'a>(text: &'a str, segments: &[Segment]) -> Vec<&'a str> {
        segments.iter().map(|s| s.text(text)).collect()
    }

    #[test]
    fn sentences_are_packed_up_to_the_budget() {
        let text = "One two three. Four five. Six seven eight nine.\n\nTen eleven.";
        let segs = segment(text, Strategy::Sentences { max_tokens: 5 }, &Words, None);
        assert_eq!(texts(text, &segs), ["One two three. Four five.", "Six seven eight nine.", "Ten eleven."]);
        assert_eq!(segs.iter().map(|s| s.index).collect::<Vec<_>>(), [0, 1, 2]);
    }

    #[test]
    fn long_sentences_are_cut_between_words() {
        let text = "a b c d e f g h.";
        let segs = segment(text, Strategy::Sentences { max_tokens: 3 }, &Words, None);
        assert_eq!(texts(text, &segs), ["a b c", "d e f", "g h."]);
    }

    #[test]
    fn windows_with_stride_and_without_overlap() {
        let text = "w1 w2 w3 w4 w5 w6 w7";
        let segs = segment(text, Strategy::Windows { words: 4, stride: 2 }, &Words, None);
        assert_eq!(texts(text, &segs), ["w1 w2 w3 w4", "w3 w4 w5 w6", "w5 w6 w7"]);
        let segs = segment(text, Strategy::Windows { words: 3, stride: 3 }, &Words, Some(2));
        assert_eq!(texts(text, &segs), ["w1 w2 w3", "w4 w5 w6"]);
    }

    #[test]
    fn options_pick_the_strategy_within_the_model_budget() {
        let sentences = SegmentOptions::default();
        assert_eq!(sentences.strategy(445), Strategy::Sentences { max_tokens: 445 });
        let smaller = SegmentOptions { max_tokens: 100, ..sentences };
        assert_eq!(smaller.strategy(445), Strategy::Sentences { max_tokens: 100 });
        assert_eq!(smaller.strategy(50), Strategy::Sentences { max_tokens: 50 });
        let windows = SegmentOptions { strategy: StrategyKind::Windows, ..sentences };
        assert_eq!(windows.strategy(445), Strategy::Windows { words: 150, stride: 75 });
        assert!(windows.validate().is_ok());
        assert!(SegmentOptions { stride: 200, ..windows }.validate().is_err());
    }

    #[test]
    fn offsets_are_char_boundaries_of_the_text() {
        let text = "Ünïcödé façade — naïve café. Straße 東京 ok. «Quoted» words here.";
        for strategy in [Strategy::Sentences { max_tokens: 2 }, Strategy::Windows { words: 2, stride: 1 }] {
            for s in segment(text, strategy, &Words, None) {
                assert!(text.is_char_boundary(s.start) && text.is_char_boundary(s.end));
                assert!(!s.text(text).trim().is_empty());
            }
        }
        assert!(segment("", Strategy::Sentences { max_tokens: 5 }, &Words, None).is_empty());
    }

    #[test]
    fn training_segments_vary_in_length_and_stop_at_the_document_budget() {
        let text = "A b. C d. E f. G h. I j. K l. M n.";
        let mut budgets = [2usize, 4, 6, 2].into_iter().cycle();
        let segs = training_segments(text, 4, &Words, None, &mut || budgets.next().unwrap());
        // Budgets 2, 4, then 6 clamped to 4, then 2.
        assert_eq!(texts(text, &segs), ["A b.", "C d. E f.", "G h. I j.", "K l.", "M n."]);
        let mut four = || 4;
        let segs = training_segments(text, 4, &Words, Some(9), &mut four);
        assert_eq!(texts(text, &segs), ["A b. C d.", "E f. G h."]);
        // A first segment over the document budget is still taken.
        let segs = training_segments(text, 4, &Words, Some(1), &mut four);
        assert_eq!(texts(text, &segs), ["A b. C d."]);
        assert_eq!(model_input(title_prefix(" T ", true).as_deref(), text, &segs[0]), "T A b. C d.");
        assert_eq!(title_prefix("T", false), None);
    }
}
