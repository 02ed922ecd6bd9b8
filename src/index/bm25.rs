//! BM25 as Lucene 8+ (and so Anserini) scores it, with exact document lengths:
//! `idf(t) * tf / (tf + k1 * (1 - b + b * dl / avgdl))`, `idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5))`,
//! summed over query terms weighted by how often each occurs in the query.
//!
//! The contract (documented in the README): `dl` is the exact number of analyzed terms of the document
//! (Lucene encodes it lossily in one byte); `N` and `avgdl` are over the live documents that have at least
//! one term; `df` is the term's document frequency as the index holds it (like Lucene, it still counts
//! replaced documents until their segment is merged).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default, deny_unknown_fields)]
#[schema(example = json!({"k1": 1.2, "b": 0.75}))]
pub struct Bm25Params {
    /// Term-frequency saturation.
    pub k1: f32,
    /// Length normalization (0: none, 1: full).
    pub b: f32,
}

impl Default for Bm25Params {
    /// Anserini's defaults.
    fn default() -> Self {
        Bm25Params { k1: 0.9, b: 0.4 }
    }
}

/// Collection statistics the scorer needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CollectionStats {
    /// Live documents with at least one term.
    pub num_docs: u64,
    pub avg_len: f64,
}

/// Lucene's BM25 idf. `doc_freq` counts replaced and deleted copies until a merge drops them, `num_docs`
/// only live documents: a term held by more documents than there are (a deletion not yet merged) weighs as
/// one held by all, never below zero (which would drop it, and the only live document holding it, from the
/// ranking).
pub fn idf(num_docs: u64, doc_freq: u64) -> f32 {
    let n = num_docs as f64;
    let df = doc_freq.min(num_docs) as f64;
    (1.0 + (n - df + 0.5) / (df + 0.5)).ln() as f32
}

/// The per-document part of the length normalization, `k1 * (1 - b + b * dl / avgdl)`.
pub fn length_norm(params: Bm25Params, doc_len: u64, avg_len: f64) -> f32 {
    let avg = if avg_len > 0.0 { avg_len } else { 1.0 };
    (params.k1 as f64 * (1.0 - params.b as f64 + params.b as f64 * doc_len as f64 / avg)) as f32
}

/// One term's contribution: `weight * idf * tf / (tf + norm)`.
pub fn term_score(weight_idf: f32, tf: u32, norm: f32) -> f32 {
    let tf = tf as f32;
    weight_idf * tf / (tf + norm)
}

/// BM25 of passages (a document's segments, already analyzed) against the query's analyzed terms, each term
/// weighted by `idf` (the collection's, or the passages' own), lengths normalized by the passages' mean
/// length: a segment is compared with segments, not with whole documents.
/// Passages are given by their lengths (`lens`) and `tf(passage, i)`, how often the query's `i`-th term
/// occurs in one; `idfs` are the query terms' weights, in order.
pub fn score_passages(idfs: &[f32], lens: &[u64], tf: impl Fn(usize, usize) -> u32, params: Bm25Params) -> Vec<f32> {
    let avg_len = lens.iter().sum::<u64>() as f64 / lens.len().max(1) as f64;
    lens.iter()
        .enumerate()
        .map(|(p, &len)| {
            let norm = length_norm(params, len, avg_len);
            idfs.iter()
                .enumerate()
                .map(|(i, &idf)| match tf(p, i) {
                    0 => 0.0,
                    tf => term_score(idf, tf, norm),
                })
                .sum()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passages_score_by_their_query_terms() {
        fn words(s: &str) -> Vec<&str> {
            s.split(' ').collect()
        }
        let passages = [words("bee dance hive"), words("river bank money"), words("bee bee honey")];
        let query = words("bee dance");
        let lens: Vec<u64> = passages.iter().map(|p| p.len() as u64).collect();
        let tf = |p: usize, i: usize| passages[p].iter().filter(|t| **t == query[i]).count() as u32;
        let scores = score_passages(&[1.0, 1.0], &lens, tf, Bm25Params::default());
        assert_eq!(scores[1], 0.0);
        assert!(scores[0] > scores[2] && scores[2] > 0.0, "{scores:?}");
        // A rarer term weighs more.
        let scores = score_passages(&[2.0, 0.1], &lens, tf, Bm25Params::default());
        assert!(scores[2] > scores[0], "{scores:?}");
    }

    #[test]
    fn matches_lucene_formula() {
        // N = 1000, df = 10, tf = 3, dl = avgdl: norm = k1.
        let p = Bm25Params::default();
        let norm = length_norm(p, 100, 100.0);
        assert!((norm - 0.9).abs() < 1e-6);
        let s = term_score(idf(1000, 10), 3, norm);
        let expected = ((1.0f64 + 990.5 / 10.5).ln() * 3.0 / 3.9) as f32;
        assert!((s - expected).abs() < 1e-5, "{s} vs {expected}");
        // b = 0 ignores length; a term in every document still scores above zero.
        assert_eq!(length_norm(Bm25Params { k1: 1.2, b: 0.0 }, 5, 100.0), 1.2);
        assert!(idf(10, 10) > 0.0);
        // Two copies counted (one deleted, not yet merged) of a term in the one live document.
        assert_eq!(idf(1, 2), idf(1, 1));
        assert!(idf(1, 2) > 0.0);
    }
}
