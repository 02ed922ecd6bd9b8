//! RM3 pseudo-relevance feedback as Anserini's `Rm3Reranker` does it: a relevance model from the top
//! feedback documents' term vectors, interpolated with the query, then a new BM25 retrieval.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::{analyzer, searchable_text, Bm25Params, Hit, IndexError, Snapshot};
use crate::corpus::Document;

/// RM3 parameters; the defaults are Anserini's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default, deny_unknown_fields)]
#[schema(example = json!({"fb_docs": 5, "fb_terms": 20, "original_query_weight": 0.6}))]
pub struct Rm3Params {
    /// Feedback documents.
    pub fb_docs: usize,
    /// Expansion terms kept.
    pub fb_terms: usize,
    /// Weight of the original query in the interpolation.
    pub original_query_weight: f32,
}

impl Default for Rm3Params {
    fn default() -> Self {
        Rm3Params { fb_docs: 10, fb_terms: 10, original_query_weight: 0.5 }
    }
}

/// Anserini skips feedback terms found in more than this share of documents (its stop-word heuristic).
const MAX_DF_RATIO: f32 = 0.1;

/// What RM3 retrieved, and the weighted query it searched with (analyzed terms, heaviest first).
pub struct Expanded {
    pub hits: Vec<Hit>,
    pub terms: Vec<(String, f32)>,
}

impl Snapshot<'_> {
    /// BM25 with RM3 expansion: retrieve, build the relevance model from the top `fb_docs`, search again
    /// with the interpolated weighted query.
    pub fn search_rm3(&self, query: &str, k: usize, bm25: Bm25Params, rm3: Rm3Params) -> Result<Expanded, IndexError> {
        let first = self.search(query, rm3.fb_docs.max(1), bm25)?;
        let terms = self.expand(query, &first, rm3)?;
        Ok(Expanded { hits: self.search_weighted(&terms, k, bm25)?, terms })
    }

    /// The interpolated query: `w * P(t|q) + (1 - w) * P(t|R)`, terms sorted by weight.
    fn expand(&self, query: &str, feedback: &[Hit], rm3: Rm3Params) -> Result<Vec<(String, f32)>, IndexError> {
        let num_docs = self.num_docs() as f32;
        let mut df_cache: HashMap<String, bool> = HashMap::new();
        let mut vectors: Vec<(BTreeMap<String, f32>, f32)> = Vec::new();
        for hit in feedback.iter().take(rm3.fb_docs) {
            self.go_on()?;
            let stored = self.document(hit.address)?;
            let doc = Document { id: stored.docid, title: stored.title, text: stored.text, guessed_encoding: None };
            let mut tf: BTreeMap<String, f32> = BTreeMap::new();
            for term in analyzer::terms(&searchable_text(&doc)) {
                if !feedback_term(&term) {
                    continue;
                }
                let common = match df_cache.get(&term) {
                    Some(c) => *c,
                    None => {
                        let c = self.doc_freq(&term)? as f32 / num_docs > MAX_DF_RATIO;
                        df_cache.insert(term.clone(), c);
                        c
                    }
                };
                if !common {
                    *tf.entry(term).or_insert(0.0) += 1.0;
                }
            }
            let tf = prune(tf, rm3.fb_terms);
            vectors.push((tf, hit.score));
        }
        let mut model: BTreeMap<String, f32> = BTreeMap::new();
        for (vector, score) in &vectors {
            let norm: f32 = vector.values().sum();
            if norm <= 0.001 {
                continue;
            }
            for (term, weight) in vector {
                *model.entry(term.clone()).or_insert(0.0) += weight / norm * score;
            }
        }
        let model = unit_l1(prune(model, rm3.fb_terms));
        let mut original: BTreeMap<String, f32> = BTreeMap::new();
        for term in analyzer::terms(query) {
            *original.entry(term).or_insert(0.0) += 1.0;
        }
        let original = unit_l1(original);
        let w = rm3.original_query_weight;
        let mut terms: BTreeMap<String, f32> = BTreeMap::new();
        for (t, v) in &original {
            *terms.entry(t.clone()).or_insert(0.0) += w * v;
        }
        for (t, v) in &model {
            *terms.entry(t.clone()).or_insert(0.0) += (1.0 - w) * v;
        }
        let mut terms: Vec<(String, f32)> = terms.into_iter().collect();
        terms.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        Ok(terms)
    }
}

/// Anserini keeps feedback terms of 2 to 20 characters from `[a-z0-9]`.
fn feedback_term(term: &str) -> bool {
    (2..=20).contains(&term.len()) && term.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// The `n` heaviest terms (ties by term). Term vectors are ordered maps throughout, so that every sum runs in
/// the same order and a run is the same to the bit every time.
fn prune(vector: BTreeMap<String, f32>, n: usize) -> BTreeMap<String, f32> {
    let mut terms: Vec<(String, f32)> = vector.into_iter().collect();
    terms.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    terms.truncate(n);
    terms.into_iter().collect()
}

fn unit_l1(vector: BTreeMap<String, f32>) -> BTreeMap<String, f32> {
    let norm: f32 = vector.values().sum();
    if norm <= 0.0 {
        return vector;
    }
    vector.into_iter().map(|(t, v)| (t, v / norm)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feedback_terms_follow_anserini_filters() {
        assert!(feedback_term("wing"));
        assert!(feedback_term("1859"));
        assert!(!feedback_term("a"));
        assert!(!feedback_term("u.s"));
        assert!(!feedback_term("évian"));
        assert!(!feedback_term(&"x".repeat(21)));
    }

    #[test]
    fn prune_and_normalize() {
        let v: BTreeMap<String, f32> =
            [("a", 3.0), ("b", 1.0), ("c", 2.0)].into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        let p = unit_l1(prune(v, 2));
        assert_eq!(p.len(), 2);
        assert!((p["a"] - 0.6).abs() < 1e-6 && (p["c"] - 0.4).abs() < 1e-6);
    }
}
