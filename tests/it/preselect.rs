//! Preselection: a cheap selector picks the segments the cross-encoder reads. Each selector, the per-document
//! count, the first segment kept, the query's budget, and the evidence that says what the model read.

use serde_json::{json, Value};

use crate::common::{cli_ok, data, minilm, post_json, TestServer};
use crate::fixtures::tiny_cross_encoder;

/// Two-word windows: every document below has several segments.
fn windows() -> Value {
    json!({"strategy": "windows", "words": 2, "stride": 2})
}

fn documents() -> Value {
    json!([
        {"id": "a", "text": "zz yy bee dance xx ww bee hive"},
        {"id": "b", "text": "bee qq rr ss tt uu"},
        {"id": "c", "text": "mm nn oo pp dance dance"},
    ])
}

/// A server with a tiny cross-encoder as the default model, a second one named `small`, and MiniLM as the
/// bi-encoder `minilm`.
fn server(dir: &std::path::Path) -> TestServer {
    let models = dir.join("models");
    tiny_cross_encoder(&models.join("ce"), 5);
    tiny_cross_encoder(&models.join("small"), 9);
    let config = dir.join("config.toml");
    let (small, minilm) = (models.join("small"), minilm());
    let named = format!("[model.named]\nsmall = {small:?}\nminilm = {{ path = {minilm:?}, kind = \"bi-encoder\" }}\n");
    std::fs::write(&config, named).unwrap();
    let ce = models.join("ce");
    let env = [("LONGRANK_MODEL_PATH", ce.to_str().unwrap()), ("LONGRANK_CONFIG", config.to_str().unwrap())];
    TestServer::start(dir, &env).wait_ready()
}

fn rerank(server: &TestServer, pipeline: &str, preselect: Value) -> Value {
    let mut body = json!({"query": "bee dance", "documents": documents(), "pipeline": pipeline,
        "segments": windows()});
    if !preselect.is_null() {
        body["preselect"] = preselect;
    }
    let reply = post_json(&server.url("/rerank"), &body.to_string());
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.json()
}

fn hit<'a>(reply: &'a Value, docid: &str) -> &'a Value {
    reply["results"].as_array().unwrap().iter().find(|h| h["docid"] == docid).unwrap()
}

fn segments(hit: &Value) -> &Vec<Value> {
    hit["segments"].as_array().unwrap()
}

fn scored(hit: &Value) -> Vec<u64> {
    segments(hit).iter().filter(|s| s["scored"] == true).map(|s| s["index"].as_u64().unwrap()).collect()
}

/// The index of the highest selector score (the first of equals).
fn selector_best(hit: &Value) -> u64 {
    let mut best = (0, f64::NEG_INFINITY);
    for s in segments(hit) {
        let score = s["selector_score"].as_f64().unwrap();
        if score > best.1 {
            best = (s["index"].as_u64().unwrap(), score);
        }
    }
    best.0
}

#[test]
fn each_selector_sends_the_model_its_best_segments_and_the_evidence_says_which() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path());
    let full = rerank(&server, "maxp", json!({"selector": "none"}));
    assert_eq!(full["timing"]["segments"], 10, "{full}");
    assert_eq!(full["timing"]["pairs"], 10);
    for h in full["results"].as_array().unwrap() {
        assert!(segments(h).iter().all(|s| s["scored"] == true && s.get("selector_score").is_none()), "{h}");
    }
    // The model's score of a segment is the same whoever picked it.
    let full_score = |docid: &str, index: u64| segments(hit(&full, docid))[index as usize]["score"].as_f64().unwrap();

    for selector in ["bm25", "model:small", "bi-encoder:minilm"] {
        let reply = rerank(&server, "maxp", json!({"selector": selector, "per_doc": 1}));
        assert_eq!(reply["timing"]["segments"], 10, "{selector}: {reply}");
        assert_eq!(reply["timing"]["pairs"], 3, "{selector}: one per document");
        for docid in ["a", "b", "c"] {
            let h = hit(&reply, docid);
            let best = selector_best(h);
            assert_eq!(scored(h), [best], "{selector} {docid}: the selector's best is read: {h}");
            for s in segments(h) {
                assert!(s["selector_score"].is_f64(), "{selector}: every segment has its selector score: {s}");
                if s["scored"] == false {
                    assert!(s.get("score").is_none(), "{selector}: an unread segment has no score: {s}");
                }
            }
            assert_eq!(h["best_segment"]["index"], best);
            assert_eq!(h["model_score"].as_f64().unwrap(), full_score(docid, best), "{selector} {docid}");
        }
        if selector == "bm25" {
            // The query's terms are in segments 1 ("bee dance") and 3 ("bee hive") of a; 1 wins.
            assert_eq!(scored(hit(&reply, "a")), [1]);
            assert_eq!(scored(hit(&reply, "c")), [2], "dance dance");
        }
        if selector == "model:small" {
            // The selector's scores are the other model's own.
            let small = post_json(
                &server.url("/rerank"),
                &json!({"query": "bee dance", "documents": documents(), "pipeline": "maxp", "segments": windows(),
                    "model": "small", "preselect": {"selector": "none"}})
                .to_string(),
            )
            .json();
            for docid in ["a", "b", "c"] {
                let own: Vec<f64> = segments(hit(&small, docid)).iter().map(|s| s["score"].as_f64().unwrap()).collect();
                let seen: Vec<f64> =
                    segments(hit(&reply, docid)).iter().map(|s| s["selector_score"].as_f64().unwrap()).collect();
                assert_eq!(own, seen, "{docid}");
            }
        }
    }
    // `none` is full MaxP whatever the counts say.
    let none = rerank(&server, "maxp", json!({"selector": "none", "per_doc": 1}));
    assert_eq!(none["timing"]["pairs"], 10);
}

/// The shipped default: MaxP reads each candidate's two best segments by BM25 (`[model.preselect]`); SumP,
/// AvgP and Co-BERT read every segment unless a request says otherwise.
#[test]
fn maxp_reads_the_two_best_segments_by_bm25_by_default_and_the_aggregates_read_all() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path());
    let default = rerank(&server, "maxp", Value::Null);
    assert_eq!((&default["timing"]["segments"], &default["timing"]["pairs"]), (&json!(10), &json!(6)), "{default}");
    let two = rerank(&server, "maxp", json!({"selector": "bm25", "per_doc": 2}));
    assert_eq!(default["results"], two["results"]);
    for pipeline in ["sump", "avgp"] {
        let all = rerank(&server, pipeline, Value::Null);
        assert_eq!(all["timing"]["pairs"], 10, "{pipeline}: {all}");
        assert!(all["results"][0]["segments"].as_array().unwrap().iter().all(|s| s["scored"] == true), "{all}");
    }
}

#[test]
fn keep_first_budget_and_aggregates_over_what_was_read() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path());
    let kept = rerank(&server, "maxp", json!({"selector": "bm25", "per_doc": 1, "keep_first": true}));
    for h in kept["results"].as_array().unwrap() {
        assert_eq!(scored(h), [0], "{h}");
    }
    let two = rerank(&server, "maxp", json!({"selector": "bm25", "per_doc": 2, "keep_first": true}));
    assert_eq!(scored(hit(&two, "a")), [0, 1]);

    // AvgP and SumP aggregate the read segments only.
    let avgp = rerank(&server, "avgp", json!({"selector": "bm25", "per_doc": 2}));
    let sump = rerank(&server, "sump", json!({"selector": "bm25", "per_doc": 2}));
    for docid in ["a", "b", "c"] {
        let read: Vec<f64> =
            segments(hit(&avgp, docid)).iter().filter_map(|s| s.get("score").and_then(Value::as_f64)).collect();
        assert_eq!(read.len(), 2);
        let mean = (read[0] as f32 + read[1] as f32) / 2.0;
        assert!((hit(&avgp, docid)["model_score"].as_f64().unwrap() as f32 - mean).abs() < 1e-6);
        let sum = read[0] as f32 + read[1] as f32;
        assert!((hit(&sump, docid)["model_score"].as_f64().unwrap() as f32 - sum).abs() < 1e-6);
    }

    // A budget of 3 pairs at 2 per document: a gets 2, b 1, c none, and c ranks last without a model score.
    let budget = rerank(&server, "maxp", json!({"selector": "bm25", "per_doc": 2, "budget": 3}));
    assert_eq!(budget["timing"]["pairs"], 3);
    assert_eq!(scored(hit(&budget, "a")).len(), 2);
    assert_eq!(scored(hit(&budget, "b")).len(), 1);
    let c = hit(&budget, "c");
    assert!(scored(c).is_empty() && c.get("model_score").is_none() && c.get("best_segment").is_none(), "{c}");
    assert_eq!(budget["results"][2]["docid"], "c", "{budget}");
    assert!(budget["results"][2]["score"].as_f64().unwrap() < budget["results"][1]["score"].as_f64().unwrap());
}

#[test]
fn search_preselects_with_the_collections_statistics_and_bad_options_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    cli_ok(dir.path(), &["index", "--collection", "cranfield", data("cranfield/docs.jsonl").to_str().unwrap()]);
    let server = server(dir.path());
    let search = |preselect: Value| {
        let body = json!({"query": "boundary layer flow", "pipeline": "maxp", "depth": 5, "k": 5,
            "segments": {"strategy": "windows", "words": 20, "stride": 20}, "preselect": preselect});
        post_json(&server.url("/search"), &body.to_string())
    };
    let reply = search(json!({"selector": "bm25", "per_doc": 1})).json();
    let seen = reply["timing"]["segments"].as_u64().unwrap();
    assert_eq!(reply["timing"]["pairs"], 5, "{reply}");
    assert!(seen > 5, "{reply}");
    for h in reply["results"].as_array().unwrap() {
        assert_eq!(scored(h), [selector_best(h)], "{h}");
    }

    search(json!({"selector": "bm25", "per_doc": 0})).assert_error(400, "out_of_range");
    search(json!({"selector": "bm25", "budget": 0})).assert_error(400, "out_of_range");
    search(json!({"selector": "nope"})).assert_error(400, "invalid_body");
    search(json!({"selector": "bm25", "top": 1})).assert_error(400, "invalid_body");
    search(json!({"selector": "model:missing", "per_doc": 1})).assert_error(422, "unknown_model");
    search(json!({"selector": "bi-encoder:small", "per_doc": 1})).assert_error(422, "not_a_bi_encoder");
}

/// A cold re-ranking cut off by the request timeout keeps the batches the model finished: the retry computes
/// only the rest. The model is held before its second batch (a test hook), so the cut falls after the first.
#[test]
fn work_a_timeout_cuts_off_is_kept_and_the_retry_computes_less() {
    let models = tempfile::tempdir().unwrap();
    tiny_cross_encoder(models.path(), 5);
    let dir = tempfile::tempdir().unwrap();
    let release = dir.path().join("release");
    let hold = format!("model.batch:2:{}", release.display());
    let env = [
        ("LONGRANK_MODEL_PATH", models.path().to_str().unwrap()),
        // About three pairs per batch: the ten pairs take four.
        ("LONGRANK_MODEL_MAX_BATCH_TOKENS", "64"),
        ("LONGRANK_SERVER_REQUEST_TIMEOUT_MS", "1000"),
        ("LONGRANK_TEST_HOLD", hold.as_str()),
    ];
    let server = TestServer::start(dir.path(), &env).wait_ready();
    let body = json!({"query": "bee dance", "documents": documents(), "pipeline": "maxp", "segments": windows(),
        "preselect": {"selector": "none"}});
    let cut = post_json(&server.url("/rerank"), &body.to_string());
    cut.assert_error(503, "timeout");
    assert!(cut.body.contains("preselect"), "says what helps: {}", cut.body);
    // The cut-off request hands its finished batch to the cache as it returns.
    let kept = || -> u64 {
        let (_, metrics) = crate::common::get(&server.url("/metrics"));
        let line =
            metrics.lines().find_map(|l| l.strip_prefix("longrank_model_cache_misses_total{model=\"default\"} "));
        line.map_or(0, |v| v.parse().unwrap())
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while kept() == 0 {
        assert!(std::time::Instant::now() < deadline, "nothing kept");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let first_batch = kept();
    std::fs::write(&release, "").unwrap();
    let retry = post_json(&server.url("/rerank"), &body.to_string()).json();
    assert_eq!(retry["timing"]["pairs"], 10, "{retry}");
    assert_eq!(retry["timing"]["computed"].as_u64().unwrap(), 10 - first_batch, "{retry}");
    assert!(first_batch < 10);
}

/// `longrank batch --preselect`: the run's pipeline reads one segment per candidate, and says so.
#[test]
fn a_batch_preselects_from_the_command_line() {
    let models = tempfile::tempdir().unwrap();
    tiny_cross_encoder(models.path(), 5);
    let dir = tempfile::tempdir().unwrap();
    cli_ok(dir.path(), &["index", "--collection", "cranfield", data("cranfield/docs.jsonl").to_str().unwrap()]);
    let topics = dir.path().join("topics.tsv");
    std::fs::write(&topics, "1\tboundary layer flow\n2\tsupersonic wing heat transfer\n").unwrap();
    let run = |preselect: &str, out: &str| -> String {
        let out = dir.path().join(out);
        let mut args = vec!["--model", models.path().to_str().unwrap(), "batch", "--collection", "cranfield"];
        args.extend(["--topics", topics.to_str().unwrap(), "--pipeline", "maxp", "--depth", "4", "-k", "4"]);
        args.extend(["--segments", r#"{"strategy": "windows", "words": 20, "stride": 20}"#]);
        args.extend(["--preselect", preselect, "--out", out.to_str().unwrap()]);
        let output = crate::common::cli(dir.path(), &args);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let picked = run(r#"{"selector": "bm25", "per_doc": 1}"#, "picked.run");
    assert!(picked.contains("model pairs: 4.0 per topic"), "{picked}");
    let full = run(r#"{"selector": "none"}"#, "full.run");
    let seen = |log: &str| log.split("of ").nth(1).unwrap().split(' ').next().unwrap().to_string();
    assert!(full.contains(&format!("model pairs: {} per topic", seen(&full))), "{full}");
    assert_eq!(seen(&full), seen(&picked), "the same segments seen");
}
