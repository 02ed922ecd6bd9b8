//! Serving models (tiny random cross-encoders built by the tests): loading from a stand-in hub and offline
//! from its cache, batching across concurrent requests, the full-queue answer, the score cache, FLOPs, int8,
//! BLAS selection, the Co-BERT pipeline and stored scores.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use serde_json::{json, Value};

use crate::common::{cli_env, post_json, TestServer};
use crate::fixtures::{cranfield_data_dir, gov2_data_dir, tiny_cobert, tiny_cross_encoder, StandInHub, COMMIT};

#[test]
fn hub_models_are_fetched_once_then_served_from_the_cache_offline() {
    let models = tempfile::tempdir().unwrap();
    tiny_cross_encoder(models.path(), 7);
    let hub = StandInHub::start("acme/tiny-ce", models.path().to_path_buf());
    let dir = gov2_data_dir();
    let hf_home = dir.path().join("hf-home");
    let hf_home = hf_home.to_str().unwrap();
    let search = [
        "--model",
        "acme/tiny-ce",
        "search",
        "--pipeline",
        "maxp",
        "--depth",
        "3",
        "-k",
        "3",
        "--json",
        "oil",
        "industry",
    ];
    let online = [("HF_ENDPOINT", hub.base.as_str()), ("HF_HOME", hf_home), ("HF_HUB_OFFLINE", "0")];
    let out = cli_env(dir.path(), &search, &online);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let first: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(first["model"], "default");
    assert_eq!(first["results"].as_array().unwrap().len(), 3);
    assert_eq!(hub.downloads.load(Ordering::SeqCst), 3, "config, tokenizer and weights downloaded");
    assert!(Path::new(hf_home)
        .join("hub/models--acme--tiny-ce/snapshots")
        .join(COMMIT)
        .join("model.safetensors")
        .exists());

    // Offline, from the cache alone (the stand-in is not even asked), with the same scores.
    let offline = [("HF_ENDPOINT", "http://127.0.0.1:9"), ("HF_HOME", hf_home), ("HF_HUB_OFFLINE", "1")];
    let out = cli_env(dir.path(), &search, &offline);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let again: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(again["results"], first["results"]);
    assert_eq!(hub.downloads.load(Ordering::SeqCst), 3);

    // Offline without a cached copy: the CLI names the problem; the server says so and serves BM25.
    let empty = dir.path().join("empty-hf-home");
    let offline_empty = [("HF_HOME", empty.to_str().unwrap()), ("HF_HUB_OFFLINE", "1")];
    let out = cli_env(dir.path(), &search, &offline_empty);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not in the hub cache"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut env = offline_empty.to_vec();
    env.push(("LONGRANK_MODEL_PATH", "acme/tiny-ce"));
    let log = dir.path().join("offline.log");
    let server = TestServer::start_logging(dir.path(), &env, &log).wait_ready();
    let pipelines = crate::common::get(&server.url("/pipelines")).1;
    let pipelines: Value = serde_json::from_str(&pipelines).unwrap();
    assert_eq!(pipelines["models"][0]["state"], "unavailable", "{pipelines}");
    // The reason says how to fix it, in the API (the page shows it) and in the log.
    let reason = pipelines["models"][0]["reason"].as_str().unwrap();
    let fixes = ["not in the hub cache", "HF_HUB_OFFLINE unset", "HF_ENDPOINT", "point --model"];
    assert!(fixes.iter().all(|f| reason.contains(f)), "{reason}");
    server.wait_log(&log, "point --model");
    let maxp = pipelines["pipelines"].as_array().unwrap().iter().find(|p| p["name"] == "maxp").unwrap();
    assert_eq!(maxp["available"], false);
    assert!(maxp["reason"].as_str().unwrap().contains("not in the hub cache"), "{maxp}");
    // Refused where it is asked for, a job at its submission, with the same error.
    post_json(&server.url("/search"), r#"{"query": "oil", "pipeline": "maxp"}"#)
        .assert_error(422, "pipeline_unavailable");
    post_json(&server.url("/rerank"), r#"{"query": "oil", "documents": [{"text": "oil"}]}"#)
        .assert_error(422, "pipeline_unavailable");
    post_json(&server.url("/batch"), r#"{"topics": "1\toil\n", "pipeline": "maxp"}"#)
        .assert_error(422, "pipeline_unavailable");
    assert_eq!(post_json(&server.url("/search"), r#"{"query": "oil"}"#).status, 200);
}

fn scores(reply: &Value) -> Vec<(String, f64)> {
    let mut s: Vec<(String, f64)> = reply["results"]
        .as_array()
        .unwrap_or_else(|| panic!("not a ranking: {reply}"))
        .iter()
        .map(|r| (r["docid"].as_str().unwrap().to_string(), r["score"].as_f64().unwrap()))
        .collect();
    s.sort_by(|a, b| a.0.cmp(&b.0));
    s
}

#[test]
fn concurrent_requests_are_batched_together_and_score_as_alone() {
    let models = tempfile::tempdir().unwrap();
    tiny_cross_encoder(models.path(), 11);
    let dir = gov2_data_dir();
    let model = models.path().to_str().unwrap();
    // No score cache, so every request goes through the model; a budget that takes the whole queue at once;
    // every request admitted at once, whatever the cores.
    let env = [
        ("LONGRANK_MODEL_PATH", model),
        ("LONGRANK_SERVER_MAX_CONCURRENT_WORK", "8"),
        ("LONGRANK_MODEL_CACHE_ENTRIES", "1"),
        ("LONGRANK_MODEL_MAX_BATCH_TOKENS", "1000000"),
    ];
    let queries = [
        "oil industry texas",
        "pearl farming",
        "national park history",
        "solar energy",
        "tax forms 1999",
        "wildlife refuge",
    ];
    let body = |q: &str| {
        let every_segment = json!({"selector": "none"});
        json!({"query": q, "docids": docids(dir.path()), "collection": "gov2", "pipeline": "maxp", "preselect": every_segment})
            .to_string()
    };
    let alone_server = TestServer::start(dir.path(), &env).wait_ready();
    let url = alone_server.url("/rerank");
    let alone: Vec<Value> = queries.iter().map(|q| post_json(&url, &body(q)).json()).collect();
    // Inputs each request sends the model: its pairs, each distinct one once (no cache).
    let inputs = alone[0]["timing"]["computed"].as_u64().unwrap();
    assert!(alone.iter().all(|r| r["timing"]["computed"] == inputs), "every request scores the same segments");
    drop(alone_server);

    // The inference thread is held at its first batch until every request has queued its inputs.
    let release = dir.path().join("release");
    let hold = format!("model.batch:1:{}", release.display());
    let server = TestServer::start(dir.path(), &[env.as_slice(), &[("LONGRANK_TEST_HOLD", hold.as_str())]].concat())
        .wait_ready();
    let url = server.url("/rerank");
    let handles: Vec<_> = queries
        .iter()
        .map(|q| {
            let (url, body) = (url.clone(), body(q));
            std::thread::spawn(move || post_json(&url, &body).json())
        })
        .collect();
    // Every request's inputs are in the held first batch or waiting behind it.
    let model_metric = |name: &str| -> u64 {
        let (_, metrics) = crate::common::get(&server.url("/metrics"));
        let line = format!("{name}{{model=\"default\"}} ");
        let value = metrics.lines().find_map(|l| l.strip_prefix(line.as_str()).map(str::to_string));
        value.unwrap_or_else(|| panic!("no {name}: {metrics}")).parse().unwrap()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (_, status) = crate::common::get(&server.url("/pipelines"));
        let queued = serde_json::from_str::<Value>(&status).unwrap()["models"][0]["queued"].as_u64().unwrap();
        let held = model_metric("longrank_model_pairs_total");
        if queued + held == 6 * inputs {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the requests never queued together: {queued} + {held}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::fs::write(&release, "").unwrap();
    for (h, expected) in handles.into_iter().zip(&alone) {
        let reply = h.join().unwrap();
        assert_eq!(reply["timing"]["computed"], inputs);
        for ((docid, got), (_, want)) in scores(&reply).iter().zip(scores(expected)) {
            assert!((got - want).abs() < 1e-4, "{docid}: {got} concurrently, {want} alone");
        }
    }
    let shared = model_metric("longrank_model_shared_batches_total");
    assert!(shared >= 1, "no forward pass carried several requests' inputs");
    // The model side of /metrics: one observation per forward pass, one queue wait per request, every miss
    // computed, nothing left queued.
    let batches = model_metric("longrank_model_batches_total");
    for histogram in ["longrank_model_batch_size", "longrank_model_batch_tokens", "longrank_model_inference_seconds"] {
        assert_eq!(model_metric(&format!("{histogram}_count")), batches, "{histogram}");
    }
    assert_eq!(model_metric("longrank_model_queue_seconds_count"), 6);
    assert_eq!(model_metric("longrank_model_batch_size_sum"), 6 * inputs);
    assert_eq!(model_metric("longrank_model_cache_misses_total"), model_metric("longrank_model_pairs_total"));
    let pairs: u64 = alone[0]["timing"]["pairs"].as_u64().unwrap();
    assert!(inputs <= pairs, "computed {inputs} of {pairs} pairs");
    assert_eq!(model_metric("longrank_model_cache_hits_total"), 6 * (pairs - inputs));
    assert_eq!(model_metric("longrank_model_queue_inputs"), 0);
}

fn docids(dir: &Path) -> Vec<String> {
    let query = "oil pearls history national park industry texas tax energy wildlife";
    let out = crate::common::cli_ok(dir, &["search", "--collection", "gov2", "-k", "100", "--json", query]);
    let ranking: Value = serde_json::from_str(&out).unwrap();
    let docids: Vec<String> =
        ranking["results"].as_array().unwrap().iter().map(|r| r["docid"].as_str().unwrap().to_string()).collect();
    assert!(docids.len() >= 3, "{ranking}");
    docids
}

#[test]
fn a_full_queue_answers_429_and_scores_are_cached_across_pipelines() {
    let models = tempfile::tempdir().unwrap();
    tiny_cross_encoder(models.path(), 13);
    let dir = gov2_data_dir();
    let model = models.path().to_str().unwrap();
    let env = [
        ("LONGRANK_MODEL_PATH", model),
        ("LONGRANK_MODEL_MAX_QUEUED_INPUTS", "1"),
        ("LONGRANK_MODEL_MAX_BATCH_TOKENS", "128"),
    ];
    let server = TestServer::start(dir.path(), &env).wait_ready();
    let url = server.url("/search");
    // Different queries, so no request is answered from the cache; every segment read, so that each request
    // keeps the model busy long enough for the others to find its queue full (with the default preselection a
    // fast machine served all eight one after another).
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let body = json!({"query": format!("the history {i}"), "pipeline": "maxp", "depth": 20,
                "preselect": {"selector": "none"}});
            let (url, body) = (url.clone(), body.to_string());
            std::thread::spawn(move || {
                crate::common::request("POST", &url, &[("content-type", "application/json")], Some(&body))
            })
        })
        .collect();
    let replies: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let refused: Vec<_> = replies.iter().filter(|r| r.status == 429).collect();
    assert!(!refused.is_empty(), "no request was refused: {:?}", replies.iter().map(|r| r.status).collect::<Vec<_>>());
    for r in &refused {
        r.assert_error(429, "overloaded");
        assert!(r.header("retry-after").is_some_and(|s| s.parse::<u64>().is_ok_and(|s| s >= 1)));
    }
    assert!(replies.iter().all(|r| r.status == 200 || r.status == 429));

    // One query through maxp (every segment), then firstp and sump: the later pipelines reuse every cached
    // segment score.
    let ask = |pipeline: &str| {
        let body =
            json!({"query": "oil industry", "pipeline": pipeline, "depth": 10, "preselect": {"selector": "none"}});
        post_json(&url, &body.to_string()).json()
    };
    let maxp = ask("maxp");
    assert!(maxp["timing"]["computed"].as_u64().unwrap() > 0);
    for pipeline in ["firstp", "sump"] {
        let v = ask(pipeline);
        assert_eq!(v["timing"]["computed"], 0, "{pipeline}: {}", v["timing"]);
        assert!(v["timing"]["pairs"].as_u64().unwrap() > 0);
    }
}

#[test]
fn the_configuration_sets_a_model_kind_that_detection_would_get_wrong() {
    // A cross-encoder directory that also carries sentence-transformers files: detected as a bi-encoder.
    let models = tempfile::tempdir().unwrap();
    tiny_cross_encoder(models.path(), 29);
    std::fs::write(
        models.path().join("modules.json"),
        r#"[{"idx": 0, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]"#,
    )
    .unwrap();
    std::fs::create_dir(models.path().join("1_Pooling")).unwrap();
    std::fs::write(models.path().join("1_Pooling/config.json"), r#"{"pooling_mode_mean_tokens": true}"#).unwrap();
    let dir = gov2_data_dir();
    let path = models.path().to_str().unwrap();
    let config = format!(
        "[model]\npath = \"{path}\"\n[model.named]\nce = {{ path = \"{path}\", kind = \"cross-encoder\" }}\nplain = \"{path}\"\n"
    );
    std::fs::write(dir.path().join("longrank.toml"), config).unwrap();
    // The harness blanks LONGRANK_MODEL_PATH (no model unless asked); this test asks for the same one.
    let env = [("LONGRANK_CONFIG", "longrank.toml"), ("LONGRANK_MODEL_PATH", path)];
    let server = TestServer::start(dir.path(), &env).wait_ready();
    let pipelines: Value = serde_json::from_str(&crate::common::get(&server.url("/pipelines")).1).unwrap();
    let kinds: HashMap<String, String> = pipelines["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["name"].as_str().unwrap().to_string(), m["kind"].as_str().unwrap_or("?").to_string()))
        .collect();
    assert_eq!(kinds["default"], "bi-encoder", "{pipelines}");
    assert_eq!(kinds["plain"], "bi-encoder");
    assert_eq!(kinds["ce"], "cross-encoder");
    let v =
        post_json(&server.url("/search"), r#"{"query": "oil", "pipeline": "maxp", "model": "ce", "depth": 3}"#).json();
    assert_eq!(v["model"], "ce", "{v}");
}

/// A page of a re-ranked ranking is that ranking's slice, across the depth where the model's order gives way to
/// BM25's: the model re-scores the top `depth` whatever the page.
#[test]
fn a_page_of_a_reranked_ranking_is_its_slice() {
    let models = tempfile::tempdir().unwrap();
    tiny_cross_encoder(models.path(), 31);
    let dir = cranfield_data_dir();
    let server =
        TestServer::start(dir.path(), &[("LONGRANK_MODEL_PATH", models.path().to_str().unwrap())]).wait_ready();
    let search = |k: u64, offset: u64| {
        let body =
            json!({"query": "wing flutter", "pipeline": "maxp", "depth": 4, "k": k, "offset": offset}).to_string();
        let v = post_json(&server.url("/search"), &body).json();
        let results = v["results"].as_array().unwrap().clone();
        results.iter().map(|h| (h["rank"].as_u64().unwrap(), h["docid"].as_str().unwrap().to_string())).collect()
    };
    let whole: Vec<(u64, String)> = search(6, 0);
    assert_eq!(whole.len(), 6, "{whole:?}");
    assert_eq!(search(3, 2), whole[2..5].to_vec());
    assert_eq!(search(2, 4), whole[4..6].to_vec());
}

#[test]
fn flops_count_every_pair_from_the_model_shape_cached_or_not() {
    let models = tempfile::tempdir().unwrap();
    tiny_cross_encoder(models.path(), 5);
    let dir = tempfile::tempdir().unwrap();
    let server =
        TestServer::start(dir.path(), &[("LONGRANK_MODEL_PATH", models.path().to_str().unwrap())]).wait_ready();
    // Characters are word pieces here: [CLS] a b [SEP] c d [SEP] is 7, [CLS] a b [SEP] e [SEP] is 6.
    let body = json!({"query": "ab", "documents": [{"text": "cd"}, {"text": "e"}], "pipeline": "maxp"}).to_string();
    // Per pair: 2 layers × (8·L·32² + 4·L·32·64 + 4·L²·32), the pooler 2·32², the classifier 2·32.
    let pair = |l: f64| 2.0 * (8.0 * l * 1024.0 + 4.0 * l * 2048.0 + 4.0 * l * l * 32.0) + 2048.0 + 64.0;
    for computed in [2, 0] {
        let reply = post_json(&server.url("/rerank"), &body).json();
        assert_eq!(reply["timing"]["computed"], computed, "{reply}");
        assert_eq!(reply["timing"]["flops"].as_f64().unwrap(), pair(7.0) + pair(6.0), "{reply}");
    }
}

#[test]
fn a_model_configured_int8_serves_quantized_scores() {
    let models = tempfile::tempdir().unwrap();
    tiny_cross_encoder(models.path(), 5);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    let path = models.path().to_str().unwrap();
    std::fs::write(&config, format!("[model.named]\nq = {{ path = {path:?}, quantize = \"int8\" }}\n")).unwrap();
    let env = [("LONGRANK_MODEL_PATH", path), ("LONGRANK_CONFIG", config.to_str().unwrap())];
    let server = TestServer::start(dir.path(), &env).wait_ready();
    let scores = |model: &str| -> Vec<f64> {
        let body = json!({"query": "ab", "documents": [{"text": "cd ab"}, {"text": "e"}, {"text": "abab"}],
            "pipeline": "maxp", "model": model});
        let reply = post_json(&server.url("/rerank"), &body.to_string()).json();
        let mut hits = reply["results"].as_array().unwrap().clone();
        hits.sort_by_key(|h| h["docid"].as_str().unwrap().to_string());
        hits.iter().map(|h| h["score"].as_f64().unwrap()).collect()
    };
    let (float, int8) = (scores("default"), scores("q"));
    for (f, q) in float.iter().zip(&int8) {
        assert!((f - q).abs() < 0.05, "{float:?} vs {int8:?}");
    }
    assert_ne!(float, int8, "quantized");
}

/// Adds seeded random Co-BERT heads (2 prototypes, groups of 3 overlapping by 1) to a tiny cross-encoder.
#[test]
fn the_cobert_pipeline_rescores_maxp_candidates_with_its_heads() {
    let models = tempfile::tempdir().unwrap();
    let (cobert, plain) = (models.path().join("cobert"), models.path().join("plain"));
    tiny_cobert(&cobert, 21);
    tiny_cross_encoder(&plain, 21);
    let dir = gov2_data_dir();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, format!("[model.named]\nplain = {:?}\n", plain.to_str().unwrap())).unwrap();
    let env = [("LONGRANK_MODEL_PATH", cobert.to_str().unwrap()), ("LONGRANK_CONFIG", config.to_str().unwrap())];
    let server = TestServer::start(dir.path(), &env).wait_ready();
    let search = |pipeline: &str, model: &str| {
        let query = "oil pearls history national park industry texas tax energy wildlife";
        // Every segment read, as Co-BERT's first round reads them by default.
        let every_segment = json!({"selector": "none"});
        let body = json!({"query": query, "pipeline": pipeline, "depth": 7, "k": 7, "model": model,
            "preselect": every_segment});
        post_json(&server.url("/search"), &body.to_string())
    };
    let maxp = search("maxp", "default").json();
    let cobert_reply = search("cobert", "default");
    assert_eq!(cobert_reply.status, 200, "{}", cobert_reply.body);
    let co = cobert_reply.json();
    // The same candidates, re-scored: the first round's pairs come from the cache.
    assert_eq!(co["timing"]["computed"], 0, "{co}");
    let ids = |v: &Value| {
        let mut ids: Vec<String> =
            v["results"].as_array().unwrap().iter().map(|h| h["docid"].as_str().unwrap().to_string()).collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(&maxp), ids(&co));
    assert_eq!(ids(&co).len(), 4, "the sample's documents that match");
    let maxp_scores: HashMap<String, f64> = maxp["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h["docid"].as_str().unwrap().to_string(), h["model_score"].as_f64().unwrap()))
        .collect();
    assert!(co["results"]
        .as_array()
        .unwrap()
        .iter()
        .all(|h| h["model_score"].as_f64() != maxp_scores.get(h["docid"].as_str().unwrap()).copied()));
    // FLOPs: MaxP's plus the heads' for 4 candidates (h = 32, i = 64): 8 calibrations of 2 positions over 2
    // layers with their projections and weighted sums, 2 groups (0-2, 2-3, padded to 3) over 4 layers with
    // their scores.
    let layer = |l: f64| 8.0 * l * 1024.0 + 4.0 * l * 2048.0 + 4.0 * l * l * 32.0;
    let heads =
        8.0 * (2.0 * layer(2.0) + 2.0 * 1024.0) + 2.0 * 8.0 * 32.0 + 2.0 * (4.0 * layer(3.0) + 2.0 * 3.0 * 32.0);
    let (co_flops, maxp_flops) = (co["timing"]["flops"].as_f64().unwrap(), maxp["timing"]["flops"].as_f64().unwrap());
    assert!((co_flops - maxp_flops - heads).abs() < 1.0, "{co_flops} - {maxp_flops} vs {heads}");
    // A batch job counts the same per topic (the pairs come from the cache; the count does not care).
    let topics = "1\toil pearls history national park industry texas tax energy wildlife\n\
                  2\toil pearls history national park industry texas tax energy wildlife\n";
    let body = json!({"topics": topics, "pipeline": "cobert", "depth": 7, "k": 7});
    let job = post_json(&server.url("/batch?wait=true"), &body.to_string()).json();
    assert_eq!(job["status"], "done", "{job}");
    assert_eq!(job["flops"]["per_topic"].as_f64().unwrap(), co_flops, "{job}");
    assert_eq!(job["flops"]["total"].as_f64().unwrap(), 2.0 * co_flops, "{job}");
    let bm25 = json!({"topics": topics, "pipeline": "bm25"});
    assert!(post_json(&server.url("/batch?wait=true"), &bm25.to_string()).json().get("flops").is_none());
    // A plain cross-encoder has no heads: cobert is unavailable with it, at a job's submission too.
    search("cobert", "plain").assert_error(422, "pipeline_unavailable");
    let job = json!({"topics": topics, "pipeline": "cobert", "model": "plain"});
    post_json(&server.url("/batch"), &job.to_string()).assert_error(422, "pipeline_unavailable");
}

/// MKL loads its parts on the first product and exits the process when one is missing (as a cache holding
/// only `libmkl_rt` did to CI once): longrank tries a product when it loads a BLAS and passes such an MKL over
/// for the next choice (named, the built-in kernels; by default on Intel CPUs without AVX-512, OpenBLAS; with
/// AVX-512 the default loads no library). Runs where the tests go through MKL (`.ci/run`'s first pass).
#[test]
fn an_mkl_missing_its_parts_is_passed_over_for_the_next_choice() {
    let Some(mkl) = std::env::var("LONGRANK_BLAS").ok().filter(|blas| blas.contains("libmkl_rt")) else {
        // CI's pass through MKL sets the variable: there, the test must run.
        assert!(std::env::var_os("LONGRANK_EXPECT_MKL").is_none(), "LONGRANK_BLAS was expected to name MKL");
        return;
    };
    let alone = tempfile::tempdir().unwrap();
    std::fs::copy(&mkl, alone.path().join("libmkl_rt.so.3")).unwrap();
    let models = tempfile::tempdir().unwrap();
    tiny_cross_encoder(models.path(), 5);
    let dir = tempfile::tempdir().unwrap();
    let bench = ["bench", "model", "--dir", models.path().to_str().unwrap(), "--lengths", "16", "--batches", "2"];
    let bench = [&bench[..], &["--warmup", "0", "--reps", "1"]].concat();
    let lone = alone.path().join("libmkl_rt.so.3");
    let run = |blas: &str| {
        let env = [("LONGRANK_BLAS", blas), ("LD_LIBRARY_PATH", alone.path().to_str().unwrap()), ("RUST_LOG", "info")];
        let out = cli_env(dir.path(), &bench, &env);
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{stderr}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("RESULT system=longrank-candle len=16"), "{stderr}");
        stderr
    };
    // Named, it is tried, passed over, and the built-in kernels compute.
    let stderr = run(lone.to_str().unwrap());
    assert!(stderr.contains("libmkl_rt.so.3 loaded but could not multiply"), "{stderr}");
    assert!(stderr.contains("linear layers through the built-in kernels"), "{stderr}");
    // The default choice, with the lone libmkl_rt first on the loader's path: on CPUs with AVX-512 the built-in
    // kernels without trying a library; elsewhere MKL first on Intel CPUs, passed over for OpenBLAS.
    let stderr = run("");
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
    let avx512 = cpuinfo.contains(" avx512f");
    let next = if avx512 { "the built-in kernels" } else { "libopenblas.so.0" };
    assert!(stderr.contains(&format!("linear layers through {next}")), "{stderr}");
    let intel = cpuinfo.contains("GenuineIntel");
    assert_eq!(stderr.contains("libmkl_rt.so.3 loaded but could not multiply"), intel && !avx512, "{stderr}");
}

/// `batch --store-scores` keeps the first round's (query, segment) outputs in the collection's `scores/`
/// directory: a later run reads them instead of scoring (a value changed on disk shows in its run), and a
/// Co-BERT model with other heads on the same frozen backbone reads what the first one stored.
#[test]
fn stored_scores_are_read_by_later_runs_and_shared_by_cobert_heads_on_one_backbone() {
    let models = tempfile::tempdir().unwrap();
    let (a, b, other) = (models.path().join("a"), models.path().join("b"), models.path().join("other"));
    tiny_cobert(&a, 21);
    tiny_cobert(&other, 22);
    // b: a's backbone with other heads.
    std::fs::create_dir_all(&b).unwrap();
    for entry in std::fs::read_dir(&a).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, b.join(path.file_name().unwrap())).unwrap();
    }
    std::fs::copy(other.join("cobert.safetensors"), b.join("cobert.safetensors")).unwrap();
    let dir = gov2_data_dir();
    let topics = dir.path().join("topics.tsv");
    std::fs::write(&topics, "1\toil pearls history national park industry texas tax energy wildlife\n").unwrap();
    let run = |model: &Path, pipeline: &str, store: bool, out: &str| -> Vec<(String, f64)> {
        let out = dir.path().join(out);
        let (m, t, o) = (model.to_str().unwrap(), topics.to_str().unwrap(), out.to_str().unwrap());
        let mut args = vec!["--model", m, "batch", "--collection", "gov2", "--topics", t, "--pipeline", pipeline];
        args.extend(["--depth", "7", "-k", "7", "--out", o]);
        if store {
            args.push("--store-scores");
        }
        crate::common::cli_ok(dir.path(), &args);
        let text = std::fs::read_to_string(&out).unwrap();
        let mut scores: Vec<(String, f64)> = text
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .map(|f| (f[2].to_string(), f[4].parse().unwrap()))
            .collect();
        scores.sort_by(|x, y| x.0.cmp(&y.0));
        scores
    };
    let stored = || -> Vec<PathBuf> {
        let scores = dir.path().join("collections/gov2/scores");
        let mut files: Vec<PathBuf> = std::fs::read_dir(scores)
            .map(|d| d.map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "f32")).collect())
            .unwrap_or_default();
        files.sort();
        files
    };
    let close = |x: &[(String, f64)], y: &[(String, f64)]| {
        x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.0 == q.0 && (p.1 - q.1).abs() < 1e-4)
    };

    let plain_a = run(&a, "cobert", false, "a-plain.run");
    assert!(stored().is_empty(), "nothing stored without --store-scores");
    assert!(close(&run(&a, "cobert", true, "a.run"), &plain_a), "storing does not change the scores");
    let files = stored();
    assert_eq!(files.len(), 1, "{files:?}");
    // Each record: the logit, the [CLS] state (hidden 32) and the pair's length.
    let size = std::fs::metadata(&files[0]).unwrap().len();
    assert!(size > 0 && size % (34 * 4) == 0, "{size}");

    // Other heads on the same backbone: the same store, nothing added, the scores as computed afresh.
    let from_store = run(&b, "cobert", true, "b.run");
    assert_eq!(stored(), files);
    assert_eq!(std::fs::metadata(&files[0]).unwrap().len(), size, "b scored no pair");
    assert!(close(&from_store, &run(&b, "cobert", false, "b-plain.run")), "{from_store:?}");
    assert!(!close(&from_store, &plain_a), "other heads, other scores");

    // Stored logits set to 0.5 on disk: MaxP over them gives every document 0.5.
    let mut bytes = std::fs::read(&files[0]).unwrap();
    for record in bytes.chunks_exact_mut(34 * 4) {
        record[..4].copy_from_slice(&0.5f32.to_le_bytes());
    }
    std::fs::write(&files[0], bytes).unwrap();
    let read = run(&a, "maxp", true, "a-maxp.run");
    assert!(read.len() == 4 && read.iter().all(|(_, s)| *s == 0.5), "{read:?}");
}

/// Engine work beyond `server.max_concurrent_work` waits in a line of `server.max_waiting_requests`, and beyond
/// it is refused at once: one permit and no line, a re-ranking held in the model (a test hook) keeps the
/// permit, and another request meanwhile is answered 429 with Retry-After; once it is released, both work.
#[test]
fn requests_beyond_the_engines_permits_and_line_are_refused() {
    let models = tempfile::tempdir().unwrap();
    tiny_cross_encoder(models.path(), 5);
    let dir = tempfile::tempdir().unwrap();
    let (release, log) = (dir.path().join("release"), dir.path().join("server.log"));
    let hold = format!("model.batch:1:{}", release.display());
    let env = [
        ("LONGRANK_MODEL_PATH", models.path().to_str().unwrap()),
        ("LONGRANK_SERVER_MAX_CONCURRENT_WORK", "1"),
        ("LONGRANK_SERVER_MAX_WAITING_REQUESTS", "0"),
        ("LONGRANK_TEST_HOLD", hold.as_str()),
    ];
    let server = TestServer::start_logging(dir.path(), &env, &log).wait_ready();
    let body = json!({"query": "ab", "documents": [{"text": "cd"}], "pipeline": "maxp"}).to_string();
    let held = {
        let (url, body) = (server.url("/rerank"), body.clone());
        std::thread::spawn(move || post_json(&url, &body).status)
    };
    server.wait_log(&log, "holding at model.batch");
    let refused = post_json(&server.url("/rerank"), &body);
    refused.assert_error(429, "overloaded");
    assert_eq!(refused.header("retry-after"), Some("1"));
    std::fs::write(&release, "").unwrap();
    assert_eq!(held.join().unwrap(), 200);
    assert_eq!(post_json(&server.url("/rerank"), &body).status, 200, "the permit is free again");
}

/// A burst of re-rankings on every route past what the model can do within the timeout (a tiny model made slow
/// by a test hook, requests of 3 s): each is answered 200 or refused 429 with a Retry-After within the timeout,
/// none times out, and the model serves what fits; a `/batch` job sharing the model meanwhile waits and is done.
#[test]
fn a_burst_past_the_models_rate_is_refused_early_never_timed_out() {
    let models = tempfile::tempdir().unwrap();
    tiny_cross_encoder(models.path(), 17);
    let dir = crate::fixtures::cranfield_data_dir();
    let env = [
        ("LONGRANK_MODEL_PATH", models.path().to_str().unwrap()),
        ("LONGRANK_TEST_SLOW", "model.batch:40"),
        ("LONGRANK_MODEL_MAX_BATCH_TOKENS", "64"),
        ("LONGRANK_SERVER_REQUEST_TIMEOUT_MS", "3000"),
    ];
    let server = TestServer::start(dir.path(), &env).wait_ready();
    let topics: String = (0..4).map(|i| format!("b{i}\tboundary layer flow {i}\n")).collect();
    let job = json!({"collection": "cranfield", "topics": topics, "pipeline": "maxp", "depth": 3});
    let job = post_json(&server.url("/batch"), &job.to_string()).json()["id"].as_str().unwrap().to_string();
    let handles: Vec<_> = (0..60)
        .map(|i| {
            // Texts of their own, so that no score comes from a cache.
            let texts: Vec<String> = (0..6).map(|d| format!("wing flutter {i} at speed {d}")).collect();
            let (path, body) = match i % 4 {
                0 => ("/rerank", json!({"query": "flutter", "documents": texts.iter().map(|t| json!({"text": t})).collect::<Vec<_>>()})),
                1 => ("/v1/rerank", json!({"query": "flutter", "documents": texts})),
                2 => ("/v2/rerank", json!({"model": "default", "query": "flutter", "documents": texts})),
                _ => ("/tei/rerank", json!({"query": "flutter", "texts": texts})),
            };
            let (url, body) = (server.url(path), body.to_string());
            std::thread::spawn(move || (path, post_json(&url, &body)))
        })
        .collect();
    let replies: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let count = |status| replies.iter().filter(|(_, r)| r.status == status).count();
    let statuses: Vec<_> = replies.iter().map(|(path, r)| (*path, r.status)).collect();
    assert_eq!(count(200) + count(429), replies.len(), "only served or refused, never timed out: {statuses:?}");
    assert!(count(429) > 0 && count(200) >= 5, "the model serves what fits and refuses the rest: {statuses:?}");
    for (path, reply) in replies.iter().filter(|(_, r)| r.status == 429) {
        let retry = reply.header("retry-after").and_then(|s| s.parse::<u64>().ok());
        assert!(retry.is_some_and(|s| (1..=3).contains(&s)), "{path}: Retry-After {retry:?}, within the timeout");
    }
    let job = crate::common::wait_for_job(&server, &job, |v| v["status"] != "running" && v["status"] != "queued");
    assert_eq!(job["status"], "done", "{job}");
}

/// A model that cannot be loaded is reported by its message alone, in `/pipelines` and in the 422: no
/// backtrace and no build paths, even when the server runs with RUST_BACKTRACE set (candle then attaches a
/// backtrace to its errors).
#[test]
fn a_model_load_error_is_a_message_without_a_backtrace() {
    let models = tempfile::tempdir().unwrap();
    tiny_cross_encoder(models.path(), 3);
    let weights = models.path().join("model.safetensors");
    let mut tensors = candle_core::safetensors::load(&weights, &candle_core::Device::Cpu).unwrap();
    tensors.remove("bert.encoder.layer.1.output.dense.weight");
    candle_core::safetensors::save(&tensors, &weights).unwrap();
    let dir = crate::fixtures::cranfield_data_dir();
    let env = [("LONGRANK_MODEL_PATH", models.path().to_str().unwrap()), ("RUST_BACKTRACE", "1")];
    let server = TestServer::start(dir.path(), &env).wait_ready();
    let pipelines: Value = serde_json::from_str(&crate::common::get(&server.url("/pipelines")).1).unwrap();
    let reason = pipelines["models"][0]["reason"].as_str().unwrap_or_else(|| panic!("{pipelines}")).to_string();
    let refused = post_json(&server.url("/search"), r#"{"query": "wing", "pipeline": "maxp"}"#);
    refused.assert_error(422, "pipeline_unavailable");
    let message = refused.json()["error"]["message"].as_str().unwrap().to_string();
    for text in [&reason, &message] {
        assert!(text.contains("layer.1.output.dense.weight"), "says what is wrong: {text}");
        assert!(!text.contains('\n') && !text.contains(".cargo") && !text.contains(".rs:"), "{text}");
    }
}
