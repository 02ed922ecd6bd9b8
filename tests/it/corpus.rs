//! Golden tests: the readers reproduce the reference extractions of the TREC-format samples.

use longrank::corpus::{Corpus, Document, Format};
use serde::Deserialize;

use crate::common::data;

#[derive(Deserialize)]
struct Expected {
    id: String,
    title: String,
    text: String,
}

/// Equality "up to whitespace": the reference puts a space for every tag, we only for block-level ones.
fn words(s: &str) -> String {
    s.chars().filter(|c| !c.is_whitespace()).collect()
}

fn read(rel: &str) -> Vec<Document> {
    let corpus = Corpus::open(&[data(rel)], Format::Auto).unwrap();
    corpus.documents().collect::<Result<_, _>>().unwrap()
}

fn check_golden(collection: &str, expected: &str) {
    let docs = read(collection);
    let expected: Vec<Expected> =
        std::fs::read_to_string(data(expected)).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let mut got: Vec<&Document> = docs.iter().collect();
    got.sort_by(|a, b| a.id.cmp(&b.id));
    let mut want: Vec<&Expected> = expected.iter().collect();
    want.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(got.iter().map(|d| &d.id).collect::<Vec<_>>(), want.iter().map(|d| &d.id).collect::<Vec<_>>());
    for (g, w) in got.iter().zip(want) {
        assert_eq!(words(&g.title), words(&w.title), "title of {}", g.id);
        assert_eq!(words(&g.text), words(&w.text), "text of {}", g.id);
    }
}

#[test]
fn robust04_sgml_matches_the_reference_extraction() {
    check_golden(
        "trec-format-samples/robust04-style/collection",
        "trec-format-samples/robust04-style/expected_docs.jsonl",
    );
}

#[test]
fn gov2_web_bundle_matches_the_reference_extraction() {
    check_golden("trec-format-samples/gov2-style/GX000", "trec-format-samples/gov2-style/expected_docs.jsonl");
}

#[test]
fn time_collection_reads_423_documents_from_gzipped_sgml() {
    let docs = read("trec-format-samples/time/time.trec.gz");
    assert_eq!(docs.len(), 423);
    assert!(docs.iter().all(|d| !d.id.is_empty() && !d.text.is_empty()));
    let ids: std::collections::HashSet<&str> = docs.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids.len(), 423, "every DOCNO distinct");
}

#[test]
fn shared_jsonl_collection_reads_every_document() {
    let docs = read("cranfield/docs.jsonl");
    assert_eq!(docs.len(), 1400);
    assert_eq!(docs[0].id, "1");
}

#[test]
fn tsv_and_anserini_jsonl_layouts() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = dir.path().join("docs.tsv");
    std::fs::write(&tsv, "D1\thttp://x\tA title\tThe body\nD2\tplain text\n").unwrap();
    let jsonl = dir.path().join("anserini.jsonl");
    std::fs::write(&jsonl, "{\"id\": \"a\", \"contents\": \"hello world\"}\n").unwrap();
    let corpus = Corpus::open(&[dir.path().to_path_buf()], Format::Auto).unwrap();
    let docs: Vec<Document> = corpus.documents().collect::<Result<_, _>>().unwrap();
    let ids: Vec<&str> = docs.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["a", "D1", "D2"]);
    assert_eq!((docs[1].title.as_str(), docs[1].text.as_str()), ("A title", "The body"));
}
