//! The candle models reproduce the Python reference stack on the real MiniLM (../shared/reference/models).

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use longrank::model::{BiEncoder, CrossEncoder};
use serde_json::Value;

use crate::common::{minilm, shared};

fn reference() -> Value {
    let text = std::fs::read_to_string(shared().join("reference/models/minilm-l6.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn bi_encoder_reproduces_reference_embeddings() {
    let model = BiEncoder::load(&minilm(), &Device::Cpu, DType::F32).unwrap();
    let reference = reference();
    let items = reference["bi_encoder"]["items"].as_array().unwrap();
    let encoded: Vec<_> = items.iter().map(|i| model.encode(i["text"].as_str().unwrap()).unwrap()).collect();
    // All at once (padded batch) and one at a time must both match.
    let batched = model.embed(&encoded).unwrap();
    for (i, item) in items.iter().enumerate() {
        let single = model.embed(std::slice::from_ref(&encoded[i])).unwrap().remove(0);
        let want: Vec<f64> = item["embedding"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        for got in [&single, &batched[i]] {
            assert_eq!(got.len(), want.len());
            let worst = got.iter().zip(&want).map(|(g, w)| (*g as f64 - w).abs()).fold(0.0, f64::max);
            assert!(worst <= 1e-5, "item {i}: max component error {worst}");
        }
    }
}

#[test]
fn cross_encoder_reproduces_reference_logits_including_truncated_pairs() {
    let reference = reference();
    let ce = &reference["cross_encoder"];
    // The backbone's directory plus the reference's classifier head, saved as a second safetensors file.
    let dir = tempfile::tempdir().unwrap();
    let src = minilm();
    for f in ["config.json", "tokenizer.json", "model.safetensors"] {
        std::os::unix::fs::symlink(src.join(f), dir.path().join(f)).unwrap();
    }
    let weight: Vec<f32> =
        ce["head"]["classifier.weight"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
    let bias = ce["head"]["classifier.bias"][0].as_f64().unwrap() as f32;
    let hidden = weight.len();
    let head: HashMap<String, Tensor> = [
        ("classifier.weight".to_string(), Tensor::from_vec(weight, (1, hidden), &Device::Cpu).unwrap()),
        ("classifier.bias".to_string(), Tensor::from_vec(vec![bias], 1, &Device::Cpu).unwrap()),
    ]
    .into_iter()
    .collect();
    candle_core::safetensors::save(&head, dir.path().join("head.safetensors")).unwrap();

    let model = CrossEncoder::load(dir.path(), &Device::Cpu, DType::F32, None).unwrap();
    let max_len = ce["max_length"].as_u64().unwrap() as usize;
    let pairs = ce["pairs"].as_array().unwrap();
    let encoded: Vec<_> = pairs
        .iter()
        .map(|p| model.encode(p["query"].as_str().unwrap(), p["passage"].as_str().unwrap(), max_len, max_len).unwrap())
        .collect();
    assert!(encoded.iter().any(|e| e.ids.len() == max_len), "some pairs are truncated");
    let batched = model.score(&encoded).unwrap();
    for (i, pair) in pairs.iter().enumerate() {
        let want = pair["logit"].as_f64().unwrap();
        let single = model.score(std::slice::from_ref(&encoded[i])).unwrap()[0];
        // Through a BLAS (MKL, OpenBLAS or the built-in kernels), the same bits alone and padded in a batch: a
        // run does not depend on how the queue batched its pairs. candle's own ops (LONGRANK_BLAS=off) agree to
        // 1e-6 only.
        if longrank::model::gemm_path().0 != "candle" {
            assert_eq!(single.to_bits(), batched[i].to_bits(), "pair {i}: {single} alone, {} batched", batched[i]);
        } else {
            assert!((single - batched[i]).abs() <= 1e-6, "pair {i}: {single} alone, {} batched", batched[i]);
        }
        for got in [single, batched[i]] {
            assert!((got as f64 - want).abs() <= 1e-4, "pair {i}: {got} vs reference {want}");
        }
    }

    // int8 linear layers (`quantize = "int8"`): close to the reference, though not equal (really quantized).
    let mut int8 = CrossEncoder::load(dir.path(), &Device::Cpu, DType::F32, None).unwrap();
    int8.quantize().unwrap();
    let got = int8.score(&encoded).unwrap();
    let errors: Vec<f64> =
        pairs.iter().zip(&got).map(|(p, g)| (*g as f64 - p["logit"].as_f64().unwrap()).abs()).collect();
    let worst = errors.iter().cloned().fold(0.0, f64::max);
    assert!(worst > 0.0 && worst <= INT8_TOLERANCE, "int8: worst logit error {worst}");
}

/// How far int8 logits may stray from the float reference: on its 30 pairs (logits from −0.30 to 0.48, the
/// reference's head being random) the worst error seen was 0.052 with candle's Q8_0 blocks (mean 0.017) and
/// 0.056 with the VNNI kernel's per-row scales.
const INT8_TOLERANCE: f64 = 0.1;

#[test]
fn maxp_search_over_http_carries_segment_evidence() {
    let dir = tempfile::tempdir().unwrap();
    let gov2 = crate::common::data("trec-format-samples/gov2-style/GX000");
    crate::common::cli_ok(dir.path(), &["index", "--collection", "gov2", gov2.to_str().unwrap()]);
    let model = minilm();
    let server =
        crate::common::TestServer::start(dir.path(), &[("LONGRANK_MODEL_PATH", model.to_str().unwrap())]).wait_ready();

    let (status, body) = crate::common::get(&server.url("/pipelines"));
    assert_eq!(status, 200);
    let pipelines: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(pipelines["models"][0]["kind"], "bi-encoder");
    assert_eq!(pipelines["models"][0]["state"], "ready");
    let maxp = pipelines["pipelines"].as_array().unwrap().iter().find(|p| p["name"] == "maxp").unwrap();
    assert_eq!((maxp["needs_model"].as_bool(), maxp["available"].as_bool()), (Some(true), Some(true)));

    let mut by_pipeline = HashMap::new();
    for pipeline in ["maxp", "firstp", "sump", "avgp"] {
        let request = format!(
            r#"{{"query": "history of the oil industry in Texas", "k": 5, "depth": 5, "pipeline": "{pipeline}"}}"#
        );
        let r = crate::common::post_json(&server.url("/search"), &request);
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert!(v["timing"]["rerank_ms"].as_f64().unwrap() > 0.0);
        by_pipeline.insert(pipeline, v);
    }
    for (pipeline, v) in &by_pipeline {
        let results = v["results"].as_array().unwrap();
        assert!(!results.is_empty());
        let scores: Vec<f64> = results.iter().map(|r| r["score"].as_f64().unwrap()).collect();
        assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{pipeline}: {scores:?}");
        // A bi-encoder's score mixes in BM25's by default: half of each, min-max normalized over the candidates
        // (all five re-ranked here).
        let normalized = |field: &str| -> Vec<f64> {
            let values: Vec<f64> = results.iter().map(|r| r[field].as_f64().unwrap()).collect();
            let (lo, hi) = values.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
            values.iter().map(|v| if hi > lo { (v - lo) / (hi - lo) } else { 0.0 }).collect()
        };
        let mixed: Vec<f64> = normalized("first_stage_score")
            .into_iter()
            .zip(normalized("model_score"))
            .map(|(f, m)| 0.5 * f + 0.5 * m)
            .collect();
        for (got, want) in scores.iter().zip(mixed) {
            assert!((got - want).abs() < 1e-5, "{pipeline}: {got} is not half BM25, half the model ({want})");
        }
        for r in results {
            let docid = r["docid"].as_str().unwrap();
            let (_, doc) = crate::common::get(&server.url(&format!("/documents/{docid}?collection=gov2")));
            let text = serde_json::from_str::<Value>(&doc).unwrap()["text"].as_str().unwrap().to_string();
            let segments = r["segments"].as_array().unwrap();
            // The segments the model read (by default MaxP reads each candidate's two best by BM25).
            let seg_scores: Vec<f64> = segments.iter().filter_map(|s| s.get("score").and_then(Value::as_f64)).collect();
            for s in segments {
                let (start, end) = (s["start"].as_u64().unwrap() as usize, s["end"].as_u64().unwrap() as usize);
                assert!(
                    start <= end && end <= text.len() && text.is_char_boundary(start) && text.is_char_boundary(end)
                );
            }
            let best = &r["best_segment"];
            let (start, end) = (best["start"].as_u64().unwrap() as usize, best["end"].as_u64().unwrap() as usize);
            assert_eq!(best["text"].as_str().unwrap(), &text[start..end], "{pipeline} {docid}");
            let score = r["model_score"].as_f64().unwrap();
            let expected = match *pipeline {
                "maxp" => seg_scores.iter().copied().fold(f64::MIN, f64::max),
                "firstp" => seg_scores[0],
                "sump" => seg_scores.iter().sum(),
                _ => seg_scores.iter().sum::<f64>() / seg_scores.len() as f64,
            };
            assert!((score - expected).abs() < 1e-4, "{pipeline} {docid}: {score} vs {expected}");
            if *pipeline == "firstp" {
                assert_eq!(segments.len(), 1);
            }
        }
    }
    // The long page (1,708 words) is cut into several segments.
    let maxp = &by_pipeline["maxp"]["results"];
    let long = maxp
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["docid"] == "GX000-55-3407826")
        .expect("the long page is a candidate");
    assert!(long["segments"].as_array().unwrap().len() > 3);

    // Repeating the query embeds only the query: the segments come from the cache.
    let again = crate::common::post_json(
        &server.url("/search"),
        r#"{"query": "history of the oil industry in Texas", "k": 5, "depth": 5, "pipeline": "maxp"}"#,
    )
    .json();
    assert_eq!(again["timing"]["computed"], 0, "{}", again["timing"]);
    assert_eq!(again["results"], by_pipeline["maxp"]["results"]);
    // ...and they were written to the collection's embedding file, which `longrank embed` fills ahead.
    let embeddings = dir.path().join("collections/gov2/embeddings");
    let keys = std::fs::read_dir(&embeddings)
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| e.path().extension().is_some_and(|x| x == "keys"));
    let keys = keys.expect("an embedding keys file").path();
    let before = std::fs::metadata(&keys).unwrap().len();
    assert!(before > 0);
    let out = crate::common::cli_ok(dir.path(), &["--model", model.to_str().unwrap(), "embed", "--collection", "gov2"]);
    assert!(out.contains("segment embeddings computed"), "{out}");
    let after = std::fs::metadata(&keys).unwrap().len();
    assert!(after > before, "embed added the other documents' segments ({before} -> {after} bytes)");
    let out = crate::common::cli_ok(dir.path(), &["--model", model.to_str().unwrap(), "embed", "--collection", "gov2"]);
    assert!(out.contains(": 0 segment embeddings computed"), "a second run has nothing to do: {out}");
    // The segments another model reads (a tiny cross-encoder's shorter budget cuts others) are embedded apart,
    // for a `bi-encoder:NAME` preselection in front of it; once.
    let tiny = tempfile::tempdir().unwrap();
    crate::fixtures::tiny_cross_encoder(tiny.path(), 3);
    let env = [("LONGRANK_MODEL_NAMED_TINY", tiny.path().to_str().unwrap())];
    let embed_for = || {
        let args = ["--model", model.to_str().unwrap(), "embed", "--collection", "gov2", "--for", "tiny"];
        let out = crate::common::cli_env(dir.path(), &args, &env);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        stdout.split(": ").nth(1).unwrap().split(' ').next().unwrap().parse::<usize>().unwrap()
    };
    assert!(embed_for() > 0, "the tiny model's segments are new");
    assert_eq!(embed_for(), 0, "and embedded once");

    // Segment options: word windows, the title repeated, segment texts, interpolation with BM25.
    let ask = |extra: Value| {
        let mut body = serde_json::json!({"query": "history of the oil industry in Texas", "k": 5, "depth": 5, "pipeline": "maxp", "collection": "gov2"});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let r = crate::common::post_json(&server.url("/search"), &body.to_string());
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    let count_segments = |v: &Value| -> usize {
        v["results"].as_array().unwrap().iter().map(|r| r["segments"].as_array().unwrap().len()).sum()
    };
    let windows =
        ask(serde_json::json!({"segments": {"strategy": "windows", "words": 40, "stride": 20}, "segment_text": true}));
    assert!(count_segments(&windows) > count_segments(&by_pipeline["maxp"]));
    for r in windows["results"].as_array().unwrap() {
        let docid = r["docid"].as_str().unwrap();
        let (_, doc) = crate::common::get(&server.url(&format!("/documents/{docid}?collection=gov2")));
        let text = serde_json::from_str::<Value>(&doc).unwrap()["text"].as_str().unwrap().to_string();
        for s in r["segments"].as_array().unwrap() {
            let (start, end) = (s["start"].as_u64().unwrap() as usize, s["end"].as_u64().unwrap() as usize);
            assert_eq!(s["text"].as_str().unwrap(), &text[start..end]);
            let words = s["text"].as_str().unwrap().split_whitespace().count();
            assert!(words <= 40, "a 40-word window has {words} words");
        }
    }
    let titled = ask(serde_json::json!({"segments": {"repeat_title": true}}));
    assert_ne!(titled["results"][0]["model_score"], by_pipeline["maxp"]["results"][0]["model_score"]);
    let bm25_order: Vec<Value> = crate::common::post_json(
        &server.url("/search"),
        r#"{"query": "history of the oil industry in Texas", "k": 5, "collection": "gov2"}"#,
    )
    .json()["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["docid"].clone())
        .collect();
    let mixed = ask(serde_json::json!({"interpolate": 1.0}));
    let mixed_order: Vec<Value> = mixed["results"].as_array().unwrap().iter().map(|r| r["docid"].clone()).collect();
    assert_eq!(mixed_order, bm25_order, "all weight on the first stage gives BM25's order");
    let url = server.url("/search");
    crate::common::post_json(&url, r#"{"query": "x", "pipeline": "maxp", "interpolate": 2}"#)
        .assert_error(400, "out_of_range");
    crate::common::post_json(
        &url,
        r#"{"query": "x", "pipeline": "maxp", "segments": {"strategy": "windows", "words": 5, "stride": 9}}"#,
    )
    .assert_error(400, "invalid_segments");
    crate::common::post_json(&url, r#"{"query": "x", "pipeline": "maxp", "model": "nope"}"#)
        .assert_error(422, "unknown_model");

    // The same pipeline through /batch, with the model in the run's provenance.
    let read =
        |f: &str| std::fs::read_to_string(crate::common::data(&format!("trec-format-samples/gov2-style/{f}"))).unwrap();
    let body = serde_json::json!({"topics": read("topics.701-702.txt"), "qrels": read("qrels.txt"), "pipeline": "maxp", "k": 5, "depth": 5});
    let job = crate::common::post_json(&server.url("/batch?wait=true"), &body.to_string()).json();
    assert_eq!(job["status"], "done", "{job}");
    assert_eq!(job["provenance"]["model"]["kind"], "bi-encoder");
    assert_eq!(job["provenance"]["model"]["weights_fnv1a64"].as_str().unwrap().len(), 16);
    assert_eq!(job["provenance"]["model"]["dir"].as_str().unwrap(), model.to_str().unwrap());
    assert!(job["metrics"]["all"]["map"].as_f64().is_some());

    // The client's own candidates through /rerank: texts, or docids of a collection.
    let url = server.url("/rerank");
    let body = r#"{"query": "Which team won Super Bowl 50?", "documents": [
        {"id": "bees", "text": "Foragers tell their sisters where food is with the waggle dance."},
        {"id": "nfl", "text": "The Denver Broncos defeated the Carolina Panthers 24-10 to win Super Bowl 50."}]}"#;
    let r = crate::common::post_json(&url, body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["pipeline"], "maxp");
    assert_eq!(v["results"][0]["docid"], "nfl");
    assert!(v["results"][0].get("first_stage_score").is_none());
    assert!(v["results"][0]["best_segment"]["text"].as_str().unwrap().contains("Broncos"));
    let body = r#"{"query": "cultured pearls in lagoons", "docids": ["GX000-43-8149041", "GX000-38-6348494"], "collection": "gov2", "k": 1}"#;
    let v = crate::common::post_json(&url, body).json();
    assert_eq!(v["results"].as_array().unwrap().len(), 1);
    assert_eq!(v["results"][0]["docid"], "GX000-38-6348494");
    crate::common::post_json(&url, r#"{"query": "x", "docids": ["nope"], "collection": "gov2"}"#)
        .assert_error(404, "unknown_document");
    crate::common::post_json(&url, r#"{"query": "x"}"#).assert_error(400, "documents_or_docids");
    crate::common::post_json(&url, r#"{"query": "x", "documents": []}"#).assert_error(400, "out_of_range");
    crate::common::post_json(&url, r#"{"query": "x", "documents": [{"text": "y"}], "pipeline": "bm25"}"#)
        .assert_error(400, "reranking_pipeline_required");
    crate::common::post_json(&url, r#"{"query": "x", "documents": [{"text": "y"}], "depth": 5}"#)
        .assert_error(400, "not_applicable");

    // Re-ranking the candidates of an existing run, from the CLI and through /batch.
    let topics = crate::common::data("trec-format-samples/gov2-style/topics.701-702.txt");
    let bm25_run = dir.path().join("bm25.run");
    let maxp_run = dir.path().join("maxp.run");
    let (t, b, m) = (topics.to_str().unwrap(), bm25_run.to_str().unwrap(), maxp_run.to_str().unwrap());
    crate::common::cli_ok(dir.path(), &["batch", "--collection", "gov2", "--topics", t, "-k", "5", "--out", b]);
    let model_arg = model.to_str().unwrap();
    crate::common::cli_ok(
        dir.path(),
        &[
            "--model",
            model_arg,
            "batch",
            "--collection",
            "gov2",
            "--topics",
            t,
            "--pipeline",
            "maxp",
            "--depth",
            "2",
            "--rerank",
            b,
            "--out",
            m,
        ],
    );
    let top2 = |run: &str, qid: &str| -> std::collections::BTreeSet<String> {
        let lines: Vec<Vec<String>> = run.lines().map(|l| l.split(' ').map(String::from).collect()).collect();
        lines.iter().filter(|c| c[0] == qid && c[3].parse::<usize>().unwrap() <= 2).map(|c| c[2].clone()).collect()
    };
    let (bm25_text, maxp_text) =
        (std::fs::read_to_string(&bm25_run).unwrap(), std::fs::read_to_string(&maxp_run).unwrap());
    for qid in ["701", "702"] {
        assert_eq!(
            top2(&maxp_text, qid),
            top2(&bm25_text, qid),
            "maxp re-ranks exactly the run's top 2 of topic {qid}"
        );
    }
    // From the CLI too, all weight on the first stage gives its order (MaxP alone gives another); a weight
    // above 1 is refused by name.
    let rerank_top5 = |name: &str, extra: &[&str]| {
        let out = dir.path().join(name);
        let args = ["--model", model_arg, "batch", "--collection", "gov2", "--topics", t, "--pipeline", "maxp"];
        let args = [&args[..], &["--depth", "5", "-k", "5", "--rerank", b, "--out", out.to_str().unwrap()], extra];
        (crate::common::cli(dir.path(), &args.concat()), out)
    };
    let order = |out: &std::path::Path| -> Vec<(String, String)> {
        let text = std::fs::read_to_string(out).unwrap();
        text.lines().map(|l| l.split(' ').collect::<Vec<_>>()).map(|c| (c[0].to_string(), c[2].to_string())).collect()
    };
    let bm25_order = order(&bm25_run);
    // MaxP alone: 0 mixes nothing (a bi-encoder mixes in half of BM25's score by default).
    let (_, alone) = rerank_top5("maxp5.run", &["--interpolate", "0"]);
    assert_ne!(order(&alone), bm25_order);
    let (_, mixed) = rerank_top5("mixed.run", &["--interpolate", "1"]);
    assert_eq!(order(&mixed), bm25_order);
    let (refused, _) = rerank_top5("refused.run", &["--interpolate", "2"]);
    assert!(!refused.status.success() && String::from_utf8_lossy(&refused.stderr).contains("interpolate"));
    let body =
        serde_json::json!({"topics": read("topics.701-702.txt"), "rerank": bm25_text, "pipeline": "maxp", "depth": 2});
    let job = crate::common::post_json(&server.url("/batch?wait=true"), &body.to_string()).json();
    assert_eq!(job["status"], "done", "{job}");
    let (_, served) = crate::common::get(&server.url(&format!("/batch/{}/run", job["id"].as_str().unwrap())));
    assert_eq!(top2(&served, "701"), top2(&bm25_text, "701"));
    let bad = serde_json::json!({"topics": read("topics.701-702.txt"), "rerank": bm25_text, "pipeline": "bm25"});
    crate::common::post_json(&server.url("/batch"), &bad.to_string()).assert_error(400, "reranking_pipeline_required");

    // Without a model, re-ranking pipelines are refused with a clear error.
    let shared = &crate::common::fixture().server;
    crate::common::post_json(
        &shared.url("/search"),
        r#"{"query": "wing", "collection": "cranfield", "pipeline": "maxp"}"#,
    )
    .assert_error(422, "model_required");
}
