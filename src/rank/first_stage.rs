//! The first stage: BM25 (with RM3 when the pipeline says so), dense (documents by their best segment's cosine
//! under a bi-encoder, `dense`), or a hybrid of the two fused by reciprocal rank or by a weighted sum of
//! normalized scores. What a request asks for (`FirstStageKind`, `Fusion`) and the fusion itself, which is pure.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::index::Hit;

/// The first stages a request can name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
#[schema(example = "hybrid")]
pub enum FirstStageKind {
    /// BM25 over the whole document (RM3's expanded query under `bm25+rm3`).
    #[default]
    Bm25,
    /// Documents by their best segment's cosine with the query under a bi-encoder (MaxP retrieval), over the
    /// segment embeddings `longrank embed` stored.
    Dense,
    /// BM25 and dense, each cut at its own depth, fused as `hybrid` says.
    Hybrid,
}

/// How the hybrid first stage fuses its two lists.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "fusion", rename_all = "lowercase", deny_unknown_fields)]
#[schema(example = json!({"fusion": "linear", "weight": 0.5, "normalize": "minmax"}))]
pub enum Fusion {
    /// Reciprocal rank fusion: a document scores the sum over the lists that hold it of 1 / (`rrf_k` + rank),
    /// ranks from 1 (Cormack et al.; Elasticsearch's `rrf` retriever).
    Rrf {
        /// Default 60 (Elasticsearch's and the paper's).
        #[serde(default = "default_rrf_k")]
        rrf_k: f32,
    },
    /// A weighted sum of each list's normalized scores, `weight` × dense + (1 − `weight`) × BM25; a list
    /// that lacks the document adds 0 (Elasticsearch's `linear` retriever, Weaviate's relative-score fusion).
    Linear {
        /// Dense's weight, 0 to 1. Default 0.5.
        #[serde(default = "default_weight")]
        weight: f32,
        /// Default `minmax`.
        #[serde(default)]
        normalize: Normalize,
    },
}

fn default_rrf_k() -> f32 {
    60.0
}

fn default_weight() -> f32 {
    0.5
}

impl Default for Fusion {
    fn default() -> Fusion {
        Fusion::Rrf { rrf_k: default_rrf_k() }
    }
}

/// How a list's scores are put on one scale before a linear fusion.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Normalize {
    /// (s − min) / (max − min) over the list; a list of equal scores gives zeros.
    #[default]
    MinMax,
    /// s / ‖scores‖₂ over the list.
    L2,
}

/// Where a candidate came from: its rank and score in each first-stage list that holds it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, ToSchema)]
pub struct Sources {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bm25: Option<Listed>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dense: Option<Listed>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, ToSchema)]
pub struct Listed {
    /// 1-based.
    pub rank: usize,
    pub score: f32,
}

/// Min-max normalization: (s − min) / (max − min); all equal (or one) gives zeros.
pub fn minmax(scores: &[f32]) -> Vec<f32> {
    let (lo, hi) = scores.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &s| (lo.min(s), hi.max(s)));
    scores.iter().map(|&s| if hi > lo { (s - lo) / (hi - lo) } else { 0.0 }).collect()
}

fn l2(scores: &[f32]) -> Vec<f32> {
    let norm = crate::model::norm(scores);
    scores.iter().map(|&s| if norm > 0.0 { s / norm } else { 0.0 }).collect()
}

/// Fuses BM25's and dense's lists (each best first) into one, best first, ties to the smaller docid, with
/// each document's sources. Scores are the fused ones.
pub fn fuse(bm25: Vec<Hit>, dense: Vec<Hit>, fusion: Fusion) -> (Vec<Hit>, HashMap<String, Sources>) {
    let contribution = |hits: &[Hit]| -> Vec<f32> {
        match fusion {
            Fusion::Rrf { rrf_k } => (0..hits.len()).map(|i| 1.0 / (rrf_k + (i + 1) as f32)).collect(),
            Fusion::Linear { normalize, .. } => {
                let scores: Vec<f32> = hits.iter().map(|h| h.score).collect();
                match normalize {
                    Normalize::MinMax => minmax(&scores),
                    Normalize::L2 => l2(&scores),
                }
            }
        }
    };
    let (dense_weight, bm25_weight) = match fusion {
        Fusion::Rrf { .. } => (1.0, 1.0),
        Fusion::Linear { weight, .. } => (weight, 1.0 - weight),
    };
    let mut fused: HashMap<String, (Hit, f32)> = HashMap::new();
    let mut sources: HashMap<String, Sources> = HashMap::new();
    for (list, weight, is_dense) in [(bm25, bm25_weight, false), (dense, dense_weight, true)] {
        let parts = contribution(&list);
        for (i, (hit, part)) in list.into_iter().zip(parts).enumerate() {
            let listed = Listed { rank: i + 1, score: hit.score };
            let source = sources.entry(hit.docid.clone()).or_default();
            *(if is_dense { &mut source.dense } else { &mut source.bm25 }) = Some(listed);
            fused.entry(hit.docid.clone()).or_insert((Hit { score: 0.0, ..hit }, 0.0)).1 += weight * part;
        }
    }
    let mut hits: Vec<Hit> = fused.into_values().map(|(hit, score)| Hit { score, ..hit }).collect();
    sort(&mut hits);
    (hits, sources)
}

/// Best first; equal scores in docid order (as BM25's ties are).
pub fn sort(hits: &mut [Hit]) {
    hits.sort_by(best_first);
}

/// The order of `sort`.
pub fn best_first(a: &Hit, b: &Hit) -> std::cmp::Ordering {
    b.score.total_cmp(&a.score).then_with(|| a.docid.cmp(&b.docid))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tantivy::DocAddress;

    fn hits(list: &[(&str, f32)]) -> Vec<Hit> {
        let hit = |(i, &(docid, score)): (usize, &(&str, f32))| Hit {
            address: DocAddress::new(0, i as u32),
            docid: docid.to_string(),
            score,
        };
        list.iter().enumerate().map(hit).collect()
    }

    fn ranking(hits: &[Hit]) -> Vec<(&str, f32)> {
        hits.iter().map(|h| (h.docid.as_str(), h.score)).collect()
    }

    #[test]
    fn rrf_sums_reciprocal_ranks_over_the_lists_that_hold_a_document() {
        let bm25 = hits(&[("a", 12.0), ("b", 9.0), ("c", 3.0)]);
        let dense = hits(&[("c", 0.9), ("a", 0.8), ("d", 0.1)]);
        let (fused, sources) = fuse(bm25, dense, Fusion::Rrf { rrf_k: 60.0 });
        let r = |rank: f32| 1.0 / (60.0 + rank);
        assert_eq!(ranking(&fused), [("a", r(1.0) + r(2.0)), ("c", r(3.0) + r(1.0)), ("b", r(2.0)), ("d", r(3.0))]);
        assert_eq!(sources["a"].bm25, Some(Listed { rank: 1, score: 12.0 }));
        assert_eq!(sources["a"].dense, Some(Listed { rank: 2, score: 0.8 }));
        assert_eq!(sources["d"], Sources { bm25: None, dense: Some(Listed { rank: 3, score: 0.1 }) });
    }

    #[test]
    fn linear_fusion_weighs_dense_against_normalized_bm25() {
        let bm25 = hits(&[("a", 10.0), ("b", 6.0), ("c", 2.0)]);
        let dense = hits(&[("c", 0.9), ("b", 0.7), ("d", 0.4)]);
        let linear = |weight| Fusion::Linear { weight, normalize: Normalize::MinMax };
        let close = |got: Vec<(&str, f32)>, want: &[(&str, f32)]| {
            assert_eq!(got.len(), want.len(), "{got:?}");
            for ((d, s), (w, t)) in got.iter().zip(want) {
                assert!(d == w && (s - t).abs() < 1e-6, "{got:?} against {want:?}");
            }
        };
        let (fused, _) = fuse(bm25.clone(), dense.clone(), linear(0.25));
        // a: 0.75 × 1; b: 0.75 × 0.5 + 0.25 × 0.6; c: 0.25 × 1; d: 0 (dense's minimum).
        close(ranking(&fused), &[("a", 0.75), ("b", 0.525), ("c", 0.25), ("d", 0.0)]);
        // All on dense: BM25's order no longer counts.
        let (fused, _) = fuse(bm25, dense, linear(1.0));
        close(ranking(&fused)[..2].to_vec(), &[("c", 1.0), ("b", 0.6)]);
        let l2 = Fusion::Linear { weight: 0.5, normalize: Normalize::L2 };
        let (fused, _) = fuse(hits(&[("a", 3.0), ("b", 4.0)]), vec![], l2);
        close(ranking(&fused), &[("b", 0.4), ("a", 0.3)]);
    }

    #[test]
    fn equal_fused_scores_go_to_the_smaller_docid() {
        let (fused, _) = fuse(hits(&[("z", 1.0)]), hits(&[("y", 1.0)]), Fusion::default());
        assert_eq!(ranking(&fused).iter().map(|(d, _)| *d).collect::<Vec<_>>(), ["y", "z"]);
    }

    #[test]
    fn fusion_objects_parse_with_their_defaults_and_refuse_unknown_fields() {
        let parse = |text: &str| serde_json::from_str::<Fusion>(text);
        assert_eq!(parse(r#"{"fusion": "rrf"}"#).unwrap(), Fusion::Rrf { rrf_k: 60.0 });
        assert_eq!(
            parse(r#"{"fusion": "linear"}"#).unwrap(),
            Fusion::Linear { weight: 0.5, normalize: Normalize::MinMax }
        );
        assert_eq!(
            parse(r#"{"fusion": "linear", "weight": 0.2, "normalize": "l2"}"#).unwrap(),
            Fusion::Linear { weight: 0.2, normalize: Normalize::L2 }
        );
        assert!(parse(r#"{"fusion": "rrf", "weight": 0.2}"#).is_err());
        assert!(parse(r#"{"fusion": "borda"}"#).is_err());
    }
}
