//! Preselection: a cheap selector scores every segment of every candidate, and only the segments it picks go
//! to the cross-encoder (IDCM's cascade, Hofstätter et al. 2021; BeST's premise that one segment carries the
//! evidence). This module holds the options and the choice itself, pure; `rank::rerank` runs the selectors.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use utoipa::ToSchema;

/// Which segments the cross-encoder reads (`preselect` of a request, `[model.preselect]` of the
/// configuration). Without `per_doc` and `budget`, every segment is read.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
#[schema(example = json!({"selector": "bm25", "per_doc": 2, "keep_first": true}))]
pub struct Preselect {
    /// `none` (every segment: full MaxP, whatever else is set), `bm25` (each segment against the query with
    /// the collection's analyzer and statistics), `bi-encoder:NAME` (a served bi-encoder's cosine) or
    /// `model:NAME` (any served model's score).
    #[schema(value_type = String, example = "bm25")]
    pub selector: Selector,
    /// Segments the cross-encoder reads per candidate: the selector's best.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_doc: Option<usize>,
    /// The first segment is always one of each candidate's (FirstP's evidence kept): the first, then the
    /// selector's best others.
    pub keep_first: bool,
    /// Pairs for the whole query, spent on candidates in first-stage order; a candidate it does not reach
    /// ranks after every scored one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<usize>,
}

/// What scores the segments before the cross-encoder.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Selector {
    #[default]
    None,
    Bm25,
    BiEncoder(String),
    Model(String),
}

impl Selector {
    pub fn parse(text: &str) -> Result<Selector, String> {
        let named = |prefix: &str| text.strip_prefix(prefix).filter(|n| !n.is_empty()).map(str::to_string);
        match text {
            "none" => Ok(Selector::None),
            "bm25" => Ok(Selector::Bm25),
            _ => named("bi-encoder:")
                .map(Selector::BiEncoder)
                .or_else(|| named("model:").map(Selector::Model))
                .ok_or_else(|| format!("unknown selector {text:?}: none, bm25, bi-encoder:NAME or model:NAME")),
        }
    }

    /// The served model it needs, if any.
    pub fn model(&self) -> Option<&str> {
        match self {
            Selector::BiEncoder(name) | Selector::Model(name) => Some(name),
            Selector::None | Selector::Bm25 => None,
        }
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Selector::None => f.write_str("none"),
            Selector::Bm25 => f.write_str("bm25"),
            Selector::BiEncoder(name) => write!(f, "bi-encoder:{name}"),
            Selector::Model(name) => write!(f, "model:{name}"),
        }
    }
}

impl Serialize for Selector {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Selector {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Selector, D::Error> {
        Selector::parse(&String::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

impl Preselect {
    /// Whether the selector runs at all (`none` reads every segment whatever the counts say).
    pub fn active(&self) -> bool {
        self.selector != Selector::None && (self.per_doc.is_some() || self.budget.is_some())
    }

    /// How many of a document's segments the model read and who chose them, for people ("2 of 31 segments
    /// read, BM25 preselection"); the web page words it the same way.
    pub fn read_note(&self, first_only: bool, read: usize, total: usize) -> String {
        let who = match (&self.selector, first_only) {
            _ if read == total => String::new(),
            (_, true) => ", FirstP (the first)".into(),
            (Selector::Bm25, false) => ", BM25 preselection".into(),
            (selector, false) if self.active() => format!(", preselection by {selector}"),
            _ => String::new(),
        };
        format!("{read} of {total} segments read{who}")
    }

    /// The segments the cross-encoder reads, per candidate (in first-stage order) and in document order, from
    /// the selector's score of every segment. Ties go to the earlier segment.
    pub fn choose(&self, selector_scores: &[Vec<f32>]) -> Vec<Vec<usize>> {
        let mut budget = self.budget.unwrap_or(usize::MAX);
        selector_scores
            .iter()
            .map(|scores| {
                let mut order = by_score(scores);
                if self.keep_first {
                    if let Some(first) = order.iter().position(|&i| i == 0) {
                        order[..=first].rotate_right(1);
                    }
                }
                let take = self.per_doc.unwrap_or(usize::MAX).min(order.len()).min(budget);
                budget -= take;
                let mut chosen = order[..take].to_vec();
                chosen.sort_unstable();
                chosen
            })
            .collect()
    }
}

/// The indices of segment scores, highest first (ties: the earlier segment first): the order a selector
/// offers segments in, and MaxP's pick of the best.
pub fn by_score(scores: &[f32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_says_how_many_segments_were_read_and_who_chose_them() {
        let bm25 = preselect(Some(2), false, None);
        assert_eq!(bm25.read_note(false, 2, 31), "2 of 31 segments read, BM25 preselection");
        assert_eq!(bm25.read_note(false, 2, 2), "2 of 2 segments read");
        assert_eq!(Preselect::default().read_note(true, 1, 31), "1 of 31 segments read, FirstP (the first)");
        let model = Preselect { selector: Selector::BiEncoder("small".into()), ..bm25 };
        assert_eq!(model.read_note(false, 3, 9), "3 of 9 segments read, preselection by bi-encoder:small");
    }

    fn preselect(per_doc: Option<usize>, keep_first: bool, budget: Option<usize>) -> Preselect {
        Preselect { selector: Selector::Bm25, per_doc, keep_first, budget }
    }

    #[test]
    fn selectors_read_and_print_the_same() {
        for text in ["none", "bm25", "bi-encoder:minilm", "model:small"] {
            assert_eq!(Selector::parse(text).unwrap().to_string(), text);
        }
        for bad in ["", "BM25", "model:", "bi-encoder", "cross:x"] {
            assert!(Selector::parse(bad).is_err(), "{bad}");
        }
        let p: Preselect = serde_json::from_str(r#"{"selector": "model:x", "per_doc": 1}"#).unwrap();
        assert_eq!(p.selector, Selector::Model("x".into()));
        assert!(serde_json::from_str::<Preselect>(r#"{"selector": "bm25", "perdoc": 1}"#).is_err());
    }

    #[test]
    fn scores_order_highest_first_and_ties_by_position() {
        assert_eq!(by_score(&[0.5, 0.9, 0.9, 0.1]), [1, 2, 0, 3]);
        assert_eq!(by_score(&[0.5]), [0]);
    }

    #[test]
    fn per_doc_takes_the_best_in_document_order_ties_to_the_earlier() {
        let scores = vec![vec![0.1, 0.9, 0.5, 0.9], vec![3.0]];
        assert_eq!(preselect(Some(2), false, None).choose(&scores), [vec![1, 3], vec![0]]);
        assert_eq!(preselect(Some(3), false, None).choose(&scores), [vec![1, 2, 3], vec![0]]);
    }

    #[test]
    fn keep_first_is_one_of_the_per_doc() {
        let scores = vec![vec![0.1, 0.9, 0.5, 0.8]];
        assert_eq!(preselect(Some(2), true, None).choose(&scores), [vec![0, 1]]);
        assert_eq!(preselect(Some(1), true, None).choose(&scores), [vec![0]]);
        let best_first = vec![vec![0.9, 0.1, 0.5]];
        assert_eq!(preselect(Some(2), true, None).choose(&best_first), [vec![0, 2]]);
    }

    #[test]
    fn the_budget_is_spent_in_first_stage_order() {
        let scores = vec![vec![1.0, 2.0, 3.0], vec![1.0, 2.0], vec![5.0]];
        assert_eq!(preselect(Some(2), false, Some(3)).choose(&scores), [vec![1, 2], vec![1], vec![]]);
        assert_eq!(preselect(None, false, Some(4)).choose(&scores), [vec![0, 1, 2], vec![1], vec![]]);
    }

    #[test]
    fn none_or_no_counts_is_inactive() {
        assert!(!Preselect::default().active());
        assert!(!Preselect { selector: Selector::None, per_doc: Some(1), ..Default::default() }.active());
        assert!(!preselect(None, true, None).active());
        assert!(preselect(Some(1), false, None).active());
    }
}
