//! The index's BM25 equals a brute-force BM25 over the same analyzed terms (Lucene's formula, exact
//! lengths), on a real collection.

use std::collections::HashMap;

use longrank::corpus::{Corpus, Format};
use longrank::index::{analyzer, searchable_text, Bm25Params, Catalog};

use crate::common::{data, fixture};

#[test]
fn index_scores_equal_brute_force_bm25_on_cranfield() {
    let corpus = Corpus::open(&[data("cranfield/docs.jsonl")], Format::Jsonl).unwrap();
    let docs: Vec<(String, HashMap<String, u32>, usize)> = corpus
        .documents()
        .map(|d| {
            let d = d.unwrap();
            let terms = analyzer::terms(&searchable_text(&d));
            let mut tf = HashMap::new();
            for t in &terms {
                *tf.entry(t.clone()).or_insert(0) += 1;
            }
            (d.id, tf, terms.len())
        })
        .collect();
    let live: Vec<_> = docs.iter().filter(|d| d.2 > 0).collect();
    let n = live.len() as f64;
    let avgdl = live.iter().map(|d| d.2 as f64).sum::<f64>() / n;
    let mut df: HashMap<&str, f64> = HashMap::new();
    for d in &docs {
        for t in d.1.keys() {
            *df.entry(t.as_str()).or_insert(0.0) += 1.0;
        }
    }

    let (catalog, _) = Catalog::open(fixture().dir.path()).unwrap();
    let collection = catalog.get("cranfield").unwrap();
    let topics = std::fs::read_to_string(data("cranfield/topics.tsv")).unwrap();
    for params in [Bm25Params::default(), Bm25Params { k1: 1.2, b: 0.75 }] {
        for line in topics.lines().take(40) {
            let query = line.split_once('\t').unwrap().1;
            let mut qtf: HashMap<String, f64> = HashMap::new();
            for t in analyzer::terms(query) {
                *qtf.entry(t).or_insert(0.0) += 1.0;
            }
            let (k1, b) = (params.k1 as f64, params.b as f64);
            let mut expected: Vec<(f64, &str)> = docs
                .iter()
                .filter_map(|(id, tf, len)| {
                    let mut score = 0.0;
                    for (t, w) in &qtf {
                        let Some(&f) = tf.get(t) else { continue };
                        let idf = (1.0 + (n - df[t.as_str()] + 0.5) / (df[t.as_str()] + 0.5)).ln();
                        let f = f as f64;
                        score += w * idf * f / (f + k1 * (1.0 - b + b * *len as f64 / avgdl));
                    }
                    (score > 0.0).then_some((score, id.as_str()))
                })
                .collect();
            expected.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
            expected.truncate(100);
            let hits = collection.snapshot().search(query, 100, params).unwrap();
            assert_eq!(hits.len(), expected.len(), "query {query:?}");
            for (hit, (score, id)) in hits.iter().zip(&expected) {
                assert!(
                    ((hit.score as f64) - score).abs() <= 1e-4 * score.abs(),
                    "query {query:?}: {} scored {} vs brute force {id} {score}",
                    hit.docid,
                    hit.score
                );
            }
            // Same ranking up to ties within float precision.
            for (i, hit) in hits.iter().enumerate() {
                let (score, id) = expected[i];
                if hit.docid != id {
                    assert!(((hit.score as f64) - score).abs() <= 1e-4 * score, "rank {i}: {} vs {id}", hit.docid);
                }
            }
        }
    }
}
