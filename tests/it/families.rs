//! Model families beyond BERT (issue 36): tiny random-weight models of each, made by transformers
//! (`scripts/model-fixtures.py`, committed under tests/fixtures/models with transformers' references). longrank
//! builds each input from the tokenizer's own post-processor and cuts it as it cuts every pair, and scores within
//! 1e-4 of transformers (relative beyond |logit| > 1), in a padded batch and alone; the server serves them.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use longrank::model::{Encoded, Kind, Reranker};
use serde_json::{json, Value};

use crate::common::{post_json, TestServer};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models").join(name)
}

fn references(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("references.json")).unwrap()).unwrap()
}

fn close(got: f32, want: f64) -> bool {
    (got as f64 - want).abs() <= 1e-4 * want.abs().max(1.0)
}

fn numbers(value: &Value) -> Vec<u32> {
    value.as_array().unwrap().iter().map(|n| n.as_u64().unwrap() as u32).collect()
}

#[test]
fn cross_encoders_of_each_family_read_their_templates_and_score_as_transformers() {
    for name in ["roberta", "xlm-roberta", "electra", "distilbert", "modernbert-cls", "modernbert-mean", "deberta-v3"] {
        let dir = fixture(name);
        let refs = references(&dir);
        let Reranker::Cross(model) = Reranker::load(&dir, &Device::Cpu, DType::F32, Kind::Auto).unwrap() else {
            panic!("{name} is not a cross-encoder");
        };
        let (max_len, max_query) =
            (refs["max_length"].as_u64().unwrap() as usize, refs["max_query_tokens"].as_u64().unwrap() as usize);
        let pairs = refs["pairs"].as_array().unwrap();
        let inputs: Vec<Encoded> = pairs
            .iter()
            .map(|p| model.encode(p["query"].as_str().unwrap(), p["document"].as_str().unwrap(), max_len, max_query))
            .collect::<Result<_, _>>()
            .unwrap();
        for (input, pair) in inputs.iter().zip(pairs) {
            assert_eq!(input.ids, numbers(&pair["ids"]), "{name}: {pair}");
            assert_eq!(input.type_ids, numbers(&pair["type_ids"]), "{name}: {pair}");
        }
        assert!(inputs.iter().any(|i| i.ids.len() == max_len), "{name}: a pair is cut");
        let batch = model.score(&inputs).unwrap();
        for (n, (input, pair)) in inputs.iter().zip(pairs).enumerate() {
            let want = pair["logit"].as_f64().unwrap();
            let alone = model.score(std::slice::from_ref(input)).unwrap()[0];
            assert!(
                close(batch[n], want) && close(alone, want),
                "{name} pair {n}: {} / {alone} against {want}",
                batch[n]
            );
        }
    }
}

#[test]
fn an_xlm_roberta_bi_encoder_embeds_as_sentence_transformers() {
    let dir = fixture("xlm-roberta-bi");
    let refs = references(&dir);
    let Reranker::Bi(model) = Reranker::load(&dir, &Device::Cpu, DType::F32, Kind::Auto).unwrap() else {
        panic!("not a bi-encoder");
    };
    let texts = refs["texts"].as_array().unwrap();
    let inputs: Vec<Encoded> = texts.iter().map(|t| model.encode(t["text"].as_str().unwrap()).unwrap()).collect();
    for (input, text) in inputs.iter().zip(texts) {
        assert_eq!(input.ids, numbers(&text["ids"]), "{text}");
    }
    let embedded = model.embed(&inputs).unwrap();
    for (got, text) in embedded.iter().zip(texts) {
        let want: Vec<f64> = text["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert!(got.iter().zip(&want).all(|(g, w)| close(*g, *w)), "{got:?} against {want:?}");
    }
}

/// Served as any model is: every re-ranking pipeline over a collection, `/rerank` and TEI's API, and the
/// bi-encoder as a `bi-encoder:NAME` preselection in front of the cross-encoder.
#[test]
fn families_serve_every_pipeline_and_preselect() {
    let dir = crate::fixtures::cranfield_data_dir();
    let config = format!(
        "[model]\nmax_query_tokens = 8\n[model.named]\nbi = {:?}\nshort = {{ path = {:?}, max_length = 32 }}\n",
        fixture("xlm-roberta-bi").to_str().unwrap(),
        fixture("xlm-roberta").to_str().unwrap()
    );
    let config_path = dir.path().join("families.toml");
    std::fs::write(&config_path, config).unwrap();
    let cross = fixture("xlm-roberta");
    let env = [("LONGRANK_CONFIG", config_path.to_str().unwrap()), ("LONGRANK_MODEL_PATH", cross.to_str().unwrap())];
    let server = TestServer::start(dir.path(), &env).wait_ready();
    for pipeline in ["firstp", "maxp", "sump", "avgp"] {
        let body = json!({"query": "boundary layer flow", "pipeline": pipeline, "depth": 5, "k": 5});
        let reply = post_json(&server.url("/search"), &body.to_string());
        assert_eq!(reply.status, 200, "{pipeline}: {}", reply.body);
        assert_eq!(reply.json()["results"].as_array().unwrap().len(), 5, "{pipeline}");
    }
    let preselected = json!({"query": "boundary layer flow", "pipeline": "maxp", "depth": 5,
        "preselect": {"selector": "bi-encoder:bi", "per_doc": 1}});
    let reply = post_json(&server.url("/search"), &preselected.to_string());
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.json()["preselect"]["selector"], "bi-encoder:bi");
    let tei = post_json(&server.url("/tei/rerank"), r#"{"query": "flutter", "texts": ["wing flutter", "heat"]}"#);
    assert_eq!(tei.status, 200, "{}", tei.body);
    let rerank = json!({"query": "flutter", "documents": [{"text": "wing flutter"}], "model": "bi"});
    assert_eq!(post_json(&server.url("/rerank"), &rerank.to_string()).status, 200);
    // A model's own max_length: the same document in shorter segments (the default model's length is its
    // positions', 128).
    let long = "The wing flutter of heated aircraft was measured at high speed. ".repeat(12);
    let segments = |model: &str| {
        let body = json!({"query": "flutter", "documents": [{"text": long}], "model": model,
            "preselect": {"selector": "none"}});
        let reply = post_json(&server.url("/rerank"), &body.to_string());
        assert_eq!(reply.status, 200, "{}", reply.body);
        reply.json()["results"][0]["segments"].as_array().unwrap().len()
    };
    let (whole, short) = (segments("default"), segments("short"));
    assert!(short > whole, "max_length 32: {short} segments, 128: {whole}");
}

/// What cannot load says why, naming the file: an architecture longrank does not load lists those it does, and
/// a tokenizer of another model than the weights' is refused before it indexes past the embeddings.
#[test]
fn what_cannot_load_names_the_file_and_the_families_that_do() {
    let dir = tempfile::tempdir().unwrap();
    for file in ["config.json", "tokenizer.json", "model.safetensors"] {
        std::fs::copy(fixture("xlm-roberta").join(file), dir.path().join(file)).unwrap();
    }
    std::fs::copy(fixture("roberta").join("tokenizer.json"), dir.path().join("tokenizer.json")).unwrap();
    let refused = Reranker::load(dir.path(), &Device::Cpu, DType::F32, Kind::Auto).err().unwrap().to_string();
    assert!(refused.contains("tokenizer.json") && refused.contains("vocab_size"), "{refused}");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("xlm-roberta").join("config.json")).unwrap()).unwrap();
    config["model_type"] = json!("mpnet");
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let refused = Reranker::load(dir.path(), &Device::Cpu, DType::F32, Kind::Auto).err().unwrap().to_string();
    assert!(
        refused.contains("config.json") && refused.contains("\"mpnet\"") && refused.contains("deberta-v2"),
        "{refused}"
    );
}

/// `bench model` times a sequence classifier of any family as it is served.
#[test]
fn bench_model_times_each_family() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["xlm-roberta", "modernbert-mean", "deberta-v3"] {
        let fixture = fixture(name);
        let args = ["bench", "model", "--dir", fixture.to_str().unwrap(), "--lengths", "24", "--batches", "2"];
        let out = crate::common::cli(dir.path(), &[&args[..], &["--warmup", "0", "--reps", "1"]].concat());
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && said.contains("RESULT system=longrank-candle len=24 batch=2"),
            "{name}: {said} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
