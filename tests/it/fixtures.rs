//! What the tests build: tiny random BERT cross-encoders and bi-encoders (and Co-BERT models over them), a stand-in Hugging
//! Face hub, and synthetic collections.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use serde_json::{json, Value};

use crate::common::{cli_ok, data, post_json, TestServer};

/// Writes a 2-layer BERT sequence classifier (hidden 32, 128 positions) with seeded random weights, a
/// character-level WordPiece tokenizer (every lowercase word splits into letters) and its config.
pub fn tiny_cross_encoder(dir: &Path, seed: u64) {
    std::fs::create_dir_all(dir).unwrap();
    let specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];
    let chars: Vec<String> = ('a'..='z').chain('0'..='9').chain(".,;:!?'\"()-/&$%".chars()).map(String::from).collect();
    let pieces: Vec<String> = ('a'..='z').chain('0'..='9').map(|c| format!("##{c}")).collect();
    let vocab: Vec<String> = specials.iter().map(|s| s.to_string()).chain(chars).chain(pieces).collect();
    let vocab_map: serde_json::Map<String, Value> =
        vocab.iter().enumerate().map(|(i, t)| (t.clone(), json!(i))).collect();
    let added: Vec<Value> = specials
        .iter()
        .enumerate()
        .map(|(i, s)| json!({"id": i, "content": s, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}))
        .collect();
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "strip_accents": null, "lowercase": true},
        "pre_tokenizer": {"type": "BertPreTokenizer"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 100, "vocab": vocab_map}
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let (h, layers, inter, positions) = (32usize, 2usize, 64usize, 128usize);
    let config = json!({
        "architectures": ["BertForSequenceClassification"], "model_type": "bert", "vocab_size": vocab.len(),
        "hidden_size": h, "num_hidden_layers": layers, "num_attention_heads": 4, "intermediate_size": inter,
        "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": positions, "type_vocab_size": 2, "initializer_range": 0.02,
        "layer_norm_eps": 1e-12, "pad_token_id": 0, "classifier_dropout": null, "num_labels": 1
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();

    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut random = |shape: &[usize]| {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.4
            })
            .collect();
        Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
    };
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    let ones = |n: usize| Tensor::ones(n, candle_core::DType::F32, &Device::Cpu).unwrap();
    let zeros = |n: usize| Tensor::zeros(n, candle_core::DType::F32, &Device::Cpu).unwrap();
    let mut linear = |tensors: &mut HashMap<String, Tensor>, name: &str, out: usize, inp: usize| {
        tensors.insert(format!("{name}.weight"), random(&[out, inp]));
        tensors.insert(format!("{name}.bias"), random(&[out]));
    };
    let norm = |tensors: &mut HashMap<String, Tensor>, name: &str| {
        tensors.insert(format!("{name}.weight"), ones(h));
        tensors.insert(format!("{name}.bias"), zeros(h));
    };
    for (name, rows) in [("word", vocab.len()), ("position", positions), ("token_type", 2)] {
        linear(&mut tensors, &format!("bert.embeddings.{name}_embeddings"), rows, h);
        tensors.remove(&format!("bert.embeddings.{name}_embeddings.bias"));
    }
    norm(&mut tensors, "bert.embeddings.LayerNorm");
    for l in 0..layers {
        let p = format!("bert.encoder.layer.{l}");
        for m in ["query", "key", "value"] {
            linear(&mut tensors, &format!("{p}.attention.self.{m}"), h, h);
        }
        linear(&mut tensors, &format!("{p}.attention.output.dense"), h, h);
        norm(&mut tensors, &format!("{p}.attention.output.LayerNorm"));
        linear(&mut tensors, &format!("{p}.intermediate.dense"), inter, h);
        linear(&mut tensors, &format!("{p}.output.dense"), h, inter);
        norm(&mut tensors, &format!("{p}.output.LayerNorm"));
    }
    linear(&mut tensors, "bert.pooler.dense", h, h);
    linear(&mut tensors, "classifier", 1, h);
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
}

/// `tiny_cross_encoder`'s encoder as a sentence-transformers bi-encoder: mean pooling, normalized.
pub fn tiny_bi_encoder(dir: &Path, seed: u64) {
    tiny_cross_encoder(dir, seed);
    let modules = json!([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
    ]);
    std::fs::write(dir.join("modules.json"), modules.to_string()).unwrap();
    std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
    let pooling =
        json!({"word_embedding_dimension": 32, "pooling_mode_cls_token": false, "pooling_mode_mean_tokens": true});
    std::fs::write(dir.join("1_Pooling/config.json"), pooling.to_string()).unwrap();
    std::fs::write(dir.join("sentence_bert_config.json"), json!({"max_seq_length": 128}).to_string()).unwrap();
}

/// A stand-in for the Hugging Face hub (`HF_ENDPOINT`): serves one repository's files as the hub's API and
/// resolve endpoints do, and counts the file downloads.
pub struct StandInHub {
    pub base: String,
    pub downloads: Arc<AtomicUsize>,
}

pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

impl StandInHub {
    pub fn start(repo: &'static str, dir: PathBuf) -> StandInHub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let downloads = Arc::new(AtomicUsize::new(0));
        let counter = downloads.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut request_line = String::new();
                reader.read_line(&mut request_line).unwrap();
                let mut range = None;
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    if line.trim().is_empty() {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("range: bytes=") {
                        range = Some(v.trim().to_string());
                    }
                }
                let path = request_line.split(' ').nth(1).unwrap_or("").to_string();
                let files = ["config.json", "tokenizer.json", "model.safetensors"];
                let (status, headers, body): (&str, String, Vec<u8>) = if path
                    == format!("/api/models/{repo}/revision/main")
                {
                    let siblings: Vec<Value> = files.iter().map(|f| json!({"rfilename": f})).collect();
                    let info = json!({"sha": COMMIT, "siblings": siblings});
                    ("200 OK", "content-type: application/json\r\n".into(), info.to_string().into_bytes())
                } else if let Some(file) = path.strip_prefix(&format!("/{repo}/resolve/main/")) {
                    match std::fs::read(dir.join(file)) {
                        Ok(bytes) => {
                            let start: usize =
                                range.as_deref().and_then(|r| r.split('-').next()?.parse().ok()).unwrap_or(0);
                            let end = match range.as_deref() {
                                Some("0-0") => 0,
                                _ => {
                                    counter.fetch_add(1, Ordering::SeqCst);
                                    bytes.len() - 1
                                }
                            };
                            let etag = format!("{:x}-{}", bytes.len(), file.len());
                            let headers = format!(
                                    "etag: \"{etag}\"\r\nx-repo-commit: {COMMIT}\r\ncontent-range: bytes {start}-{end}/{}\r\n",
                                    bytes.len()
                                );
                            ("206 Partial Content", headers, bytes[start..=end].to_vec())
                        }
                        Err(_) => ("404 Not Found", String::new(), Vec::new()),
                    }
                } else {
                    ("404 Not Found", String::new(), Vec::new())
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes()).and_then(|_| stream.write_all(&body));
                let _ = stream.flush();
                let mut rest = Vec::new();
                let _ = reader.read_to_end(&mut rest);
            }
        });
        StandInHub { base, downloads }
    }
}

/// A data directory holding one collection, indexed from a shared path (`data(rel)`).
pub fn indexed(collection: &str, rel: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    cli_ok(dir.path(), &["index", "--collection", collection, data(rel).to_str().unwrap()]);
    dir
}

pub fn gov2_data_dir() -> tempfile::TempDir {
    indexed("gov2", "trec-format-samples/gov2-style/GX000")
}

pub fn cranfield_data_dir() -> tempfile::TempDir {
    indexed("cranfield", "cranfield/docs.jsonl")
}

pub fn tiny_cobert(dir: &Path, seed: u64) {
    use candle_nn::{VarBuilder, VarMap};
    use longrank::model::cobert::{CoBertConfig, CoBertHeads};
    tiny_cross_encoder(dir, seed);
    let config = CoBertConfig { prototypes: 2, group: 3, overlap: 1, ..Default::default() };
    std::fs::write(dir.join("cobert.json"), serde_json::to_string(&config).unwrap()).unwrap();
    let backbone = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, candle_core::DType::F32, &Device::Cpu);
    CoBertHeads::new(vb.pp("cobert"), &backbone, config, false).unwrap();
    let mut state = seed;
    for var in varmap.all_vars() {
        let values: Vec<f32> = (0..var.elem_count())
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.4
            })
            .collect();
        var.set(&Tensor::from_vec(values, var.shape(), &Device::Cpu).unwrap()).unwrap();
    }
    varmap.save(dir.join("cobert.safetensors")).unwrap();
}

const FILLER: [&str; 12] =
    ["the", "river", "stone", "cloud", "bird", "tree", "lamp", "road", "hill", "moon", "wind", "rain"];

/// A collection where each topic's one relevant document holds the sentence "zz zz zz." somewhere among
/// eight (rarely in the first segment) and four other documents share the topic's word without it; the
/// gold passage is that sentence.
pub fn buried_sentence_collection(dir: &Path) {
    let mut state = 12345u64;
    let mut next = |n: usize| {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((state >> 33) as usize) % n
    };
    let (mut docs, mut topics, mut qrels, mut folds) = (String::new(), String::new(), String::new(), String::new());
    let mut passages = String::new();
    for t in 0..40 {
        let word = format!(
            "{}{}{}",
            ["ka", "lo", "mi", "no", "pu"][t % 5],
            ["be", "do", "fi", "gu"][(t / 5) % 4],
            ["x", "y"][t / 20]
        );
        topics.push_str(&format!("t{t}\t{word}\n"));
        folds.push_str(&format!("t{t}\t{}\n", if t < 28 { 0 } else { 1 }));
        let needle_at = 1 + next(7);
        for d in 0..5 {
            let docid = format!("t{t}d{d}");
            // Negatives have a sentence of the same shape in another letter, so only the needle tells.
            let odd_at = if d == 0 { needle_at } else { next(8) };
            let sentences: Vec<String> = (0..8)
                .map(|s| match (s == odd_at, d) {
                    (true, 0) => "zz zz zz.".to_string(),
                    (true, _) => "qq qq qq.".to_string(),
                    _ => format!("{} {word} {} {}.", FILLER[next(12)], FILLER[next(12)], FILLER[next(12)]),
                })
                .collect();
            if d == 0 {
                let start: usize = sentences[..needle_at].iter().map(|s| s.len() + 1).sum();
                passages.push_str(&format!("t{t}\t{docid}\t{start}\t{}\n", start + sentences[needle_at].len()));
            }
            docs.push_str(&format!("{}\n", json!({"docid": docid, "title": "", "text": sentences.join(" ")})));
            qrels.push_str(&format!("t{t} 0 {docid} {}\n", (d == 0) as u8));
        }
    }
    for (name, text) in [
        ("docs.jsonl", docs),
        ("topics.tsv", topics),
        ("qrels.txt", qrels),
        ("folds.tsv", folds),
        ("passages.tsv", passages),
    ] {
        std::fs::write(dir.join(name), text).unwrap();
    }
    cli_ok(dir, &["index", "--collection", "synthetic", dir.join("docs.jsonl").to_str().unwrap()]);
}

pub fn trec_doc(id: &str, text: &str) -> String {
    format!("<DOC>\n<DOCNO> {id} </DOCNO>\n<TEXT>\n{text}\n</TEXT>\n</DOC>\n")
}

/// Writes `files` TREC files of `per_file` documents each.
pub fn synthetic_trec_collection(dir: &Path, files: usize, per_file: usize) {
    let words = ["river", "mountain", "valley", "forest", "ocean", "desert", "island", "glacier", "canyon", "meadow"];
    for f in 0..files {
        let mut out = std::io::BufWriter::new(std::fs::File::create(dir.join(format!("part{f:03}.trec"))).unwrap());
        for d in 0..per_file {
            let text: Vec<&str> = (0..60).map(|i| words[(f * 7 + d * 3 + i * i) % words.len()]).collect();
            out.write_all(trec_doc(&format!("F{f}-D{d}"), &text.join(" ")).as_bytes()).unwrap();
        }
    }
}

/// A committed model fixture (`tests/fixtures/models/NAME`, made by `scripts/model-fixtures.py`).
pub fn model_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models").join(name)
}

/// A model fixture's transformers references.
pub fn references(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("references.json")).unwrap()).unwrap()
}

/// Within 1e-4 of `want`, relative beyond 1.
pub fn close(got: f32, want: f64) -> bool {
    (got as f64 - want).abs() <= 1e-4 * want.abs().max(1.0)
}

/// A JSON array of token ids.
pub fn numbers(value: &Value) -> Vec<u32> {
    value.as_array().unwrap().iter().map(|n| n.as_u64().unwrap() as u32).collect()
}

/// Asserts that the server's default model serves every re-ranking pipeline over its collection, with its
/// evidence (the best segment's byte offsets).
pub fn assert_reranking_pipelines(server: &TestServer) {
    for pipeline in ["firstp", "maxp", "sump", "avgp"] {
        let body = json!({"query": "boundary layer flow", "pipeline": pipeline, "depth": 5, "k": 5});
        let reply = post_json(&server.url("/search"), &body.to_string());
        assert_eq!(reply.status, 200, "{pipeline}: {}", reply.body);
        let results = reply.json()["results"].as_array().unwrap().clone();
        assert_eq!(results.len(), 5, "{pipeline}");
        let best = &results[0]["best_segment"];
        assert!(best["end"].as_u64().unwrap() > best["start"].as_u64().unwrap(), "{pipeline}: {}", reply.body);
    }
}

/// Asserts that each model scores within `bounds` (f16's, bf16's) of its f32 references, relative beyond 1:
/// `score(name, dtype)` gives the model's scores in that dtype and the references.
pub fn assert_half_precision(names: &[&str], bounds: [f64; 2], score: impl Fn(&str, DType) -> (Vec<f32>, Vec<f64>)) {
    let mut worst = Vec::new();
    for (dtype, bound) in [DType::F16, DType::BF16].into_iter().zip(bounds) {
        for name in names {
            let (got, want) = score(name, dtype);
            let error = got
                .iter()
                .zip(want)
                .map(|(got, want)| (*got as f64 - want).abs() / want.abs().max(1.0))
                .fold(0.0, f64::max);
            worst.push((name, format!("{dtype:?}"), error, bound));
        }
    }
    assert!(worst.iter().all(|(_, _, error, bound)| error <= bound), "{worst:#?}");
}

/// Asserts the project's rule for a served model (issue 55, item 4): each input's outputs (`Reranker::forward`,
/// as served) have the same bits alone, in one batch (padded: the inputs differ in length), in rayon pools of one
/// and of three threads, and from two threads at once.
pub fn assert_outputs_keep_their_bits(
    name: &str,
    model: &longrank::model::Reranker,
    inputs: &[longrank::model::Encoded],
) {
    let bits = |batch: &[longrank::model::Encoded]| -> Vec<Vec<u32>> {
        let outputs = model.forward(batch).unwrap();
        outputs.iter().map(|output| output.iter().map(|x| x.to_bits()).collect()).collect()
    };
    let alone: Vec<Vec<u32>> = inputs.iter().flat_map(|input| bits(std::slice::from_ref(input))).collect();
    assert!(inputs.iter().any(|i| i.ids.len() != inputs[0].ids.len()), "{name}: the batch has padding");
    assert_eq!(bits(inputs), alone, "{name}: in one batch");
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        assert_eq!(pool.install(|| bits(inputs)), alone, "{name}: on {threads} threads");
    }
    std::thread::scope(|s| {
        let (a, b) = (s.spawn(|| bits(inputs)), s.spawn(|| bits(inputs)));
        assert_eq!(a.join().unwrap(), alone, "{name}: concurrently");
        assert_eq!(b.join().unwrap(), alone, "{name}: concurrently");
    });
}
