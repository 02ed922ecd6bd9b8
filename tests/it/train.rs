//! `longrank train` on tiny random BERTs: every variable gets a gradient, the training forward pass agrees
//! with inference, a synthetic task where the relevant sentence sits anywhere in long documents is learned
//! and BeST beats FirstP on it, a killed run resumes where its checkpoint left it, and the server scores a
//! trained checkpoint exactly as training's dev evaluation did.

use std::path::Path;
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use longrank::model::{CrossEncoder, TrainableEncoder};
use longrank::train::{learning_rate, AdamW, Loss};
use serde_json::{json, Value};

use crate::common::{cli, cli_ok, post_json, tsv_value, TestServer};
use crate::fixtures::{buried_sentence_collection, tiny_bi_encoder, tiny_cross_encoder};

/// One training step against PyTorch's on the same batch (`scripts/training-fixtures.py`, committed beside each
/// tiny model): the inputs token for token, the loss, every parameter's gradient, and the weights after ten
/// updates at longrank's schedule. Each family that trains is listed here.
#[test]
fn a_training_step_and_ten_updates_match_pytorchs() {
    let families = ["bert", "roberta", "xlm-roberta", "electra", "distilbert", "deberta-v3", "modernbert"];
    for name in families.map(|f| format!("{f}-train")) {
        let name = name.as_str();
        let dir = crate::fixtures::model_fixture(name);
        let read = |file: &str| -> Value { serde_json::from_slice(&std::fs::read(dir.join(file)).unwrap()).unwrap() };
        let (references, training) = (read("references.json"), read("training.json"));
        let want = candle_core::safetensors::load(dir.join("training.safetensors"), &Device::Cpu).unwrap();
        let model = TrainableEncoder::init(&dir, &Device::Cpu, DType::F32, 0).unwrap();
        assert!(model.initialized().is_empty(), "{name}: {:?}", model.initialized());
        let number = |v: &Value| v.as_u64().unwrap() as usize;
        let (max_length, max_query) = (number(&references["max_length"]), number(&references["max_query_tokens"]));
        let examples = training["examples"].as_array().unwrap();
        let per_example = examples[0].as_array().unwrap().len();
        let encoded: Vec<_> = examples
            .iter()
            .flat_map(|e| e.as_array().unwrap().iter().map(|i| &references["pairs"][number(i)]))
            .map(|pair| {
                let (query, document) = (pair["query"].as_str().unwrap(), pair["document"].as_str().unwrap());
                let encoded = model.encode(query, document, max_length, max_query).unwrap();
                assert_eq!(json!(encoded.ids), pair["ids"], "{name}: {query} / {document}");
                assert_eq!(json!(encoded.type_ids), pair["type_ids"], "{name}: {query} / {document}");
                encoded
            })
            .collect();
        let loss = || {
            let scores = model.forward(&encoded).unwrap().reshape((examples.len(), per_example)).unwrap();
            Loss::Softmax.of(&scores).unwrap()
        };
        let first = loss();
        let got = first.to_scalar::<f32>().unwrap() as f64;
        assert!((got - training["loss"].as_f64().unwrap()).abs() < 1e-5, "{name}: loss {got}, {}", training["loss"]);
        let grads = first.backward().unwrap();
        let norm = |t: &Tensor| t.sqr().unwrap().sum_all().unwrap().sqrt().unwrap().to_scalar::<f32>().unwrap();
        let worst = |a: &Tensor, b: &Tensor| (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>();
        let vars = model.variables();
        assert_eq!(vars.len() * 2, want.len(), "{name}: every parameter, and only those");
        for (var_name, var) in &vars {
            let want =
                want.get(&format!("grad.{var_name}")).unwrap_or_else(|| panic!("{name}: PyTorch has no {var_name}"));
            let got = grads.get(var.as_tensor()).unwrap();
            let (entries, norms) = (worst(got, want).unwrap(), (norm(got) - norm(want)).abs());
            // A gradient that is zero in exact arithmetic (the classifier's bias under a softmax over scores,
            // the keys' biases under attention's) is rounding on both sides: the entries' bound alone.
            let relative = if norm(want) > 1e-5 { norms / norm(want) } else { 0.0 };
            assert!(entries < 1e-5 && relative < 1e-4, "{name} {var_name}: entries {entries}, norm {relative}");
        }
        // Ten updates on the same batch at longrank's schedule.
        let (lr, warmup, steps) =
            (training["lr"].as_f64().unwrap(), number(&training["warmup"]), number(&training["steps"]));
        let mut optimizer = AdamW::new(vars.clone(), training["weight_decay"].as_f64().unwrap()).unwrap();
        for step in 1..=steps {
            let grads = loss().backward().unwrap();
            let grads: Vec<Tensor> = vars.iter().map(|(_, v)| grads.get(v.as_tensor()).unwrap().clone()).collect();
            optimizer.step(&grads, learning_rate(lr, step, warmup, steps)).unwrap();
        }
        // Adam divides each gradient by its own size, so a gradient that is only rounding (zero in exact
        // arithmetic: the biases above, or a head's bias whose unit every pair activates, the softmax's gradients
        // summing to zero over each example) moves its weight by up to the learning rate each step, in rounding's
        // direction: the weights are compared where the first gradient is above 1e-6.
        let mut largest = 0f32;
        for (var_name, var) in &vars {
            let first = want[&format!("grad.{var_name}")].abs().unwrap().gt(1e-6).unwrap().to_dtype(DType::F32);
            let diff = (var.as_tensor() - &want[&format!("final.{var_name}")]).unwrap().abs().unwrap();
            let diff = (diff * first.unwrap()).unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            largest = largest.max(diff);
        }
        assert!(largest < 1e-5, "{name}: after ten updates the weights differ by up to {largest}");
        // The checkpoint is the family's own sequence classifier, which the server scores as training does.
        let saved = tempfile::tempdir().unwrap();
        model.save(saved.path()).unwrap();
        let config: Value = serde_json::from_slice(&std::fs::read(saved.path().join("config.json")).unwrap()).unwrap();
        assert_eq!(config["architectures"], read("config.json")["architectures"], "{name}");
        let trained: Vec<f32> = model.forward(&encoded).unwrap().to_vec1().unwrap();
        let served = CrossEncoder::load(saved.path(), &Device::Cpu, DType::F32, None).unwrap().score(&encoded).unwrap();
        for (a, b) in trained.iter().zip(&served) {
            assert!((a - b).abs() < 1e-5, "{name}: trained {trained:?}, served {served:?}");
        }
        if let Ok(out) = std::env::var("LONGRANK_TRAINED_OUT") {
            // By hand, for the check in transformers (CI has no PyTorch): the checkpoint and its scores.
            let out = Path::new(&out).join(name);
            model.save(&out).unwrap();
            std::fs::write(out.join("scores.json"), json!({"pairs": encoded.iter().map(|e| json!({"ids": e.ids, "type_ids": e.type_ids})).collect::<Vec<_>>(), "scores": trained}).to_string()).unwrap();
        }
    }
}

#[test]
fn every_variable_receives_a_gradient_and_training_scores_as_inference() {
    let dir = tempfile::tempdir().unwrap();
    tiny_cross_encoder(dir.path(), 3);
    let model = TrainableEncoder::init(dir.path(), &Device::Cpu, DType::F32, 1).unwrap();
    assert!(model.initialized().is_empty(), "the tiny model has every weight: {:?}", model.initialized());
    // Unequal lengths, so the padding mask is on the graph too.
    let pairs = [("a river", "the river runs north."), ("hills", "a long text about hills and valleys, and more.")];
    let encoded: Vec<_> = pairs.iter().map(|(q, s)| model.encode(q, s, 64, 16).unwrap()).collect();
    let logits = model.forward(&encoded).unwrap();
    let grads = logits.sqr().unwrap().sum_all().unwrap().backward().unwrap();
    let vars = model.variables();
    assert!(vars.len() > 30, "{} variables", vars.len());
    for (name, var) in &vars {
        let grad = grads.get(var.as_tensor()).unwrap_or_else(|| panic!("{name} received no gradient"));
        let size = grad.abs().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(size > 0.0, "{name}: zero gradient");
    }
    // The differentiable pass, the fused inference model over the same weights, and the saved checkpoint
    // loaded as the server loads it all give the same logits.
    let trained: Vec<f32> = logits.to_vec1().unwrap();
    let inference = model.snapshot().unwrap().score(&encoded).unwrap();
    model.save(&dir.path().join("saved")).unwrap();
    let loaded =
        CrossEncoder::load(&dir.path().join("saved"), &Device::Cpu, DType::F32, None).unwrap().score(&encoded).unwrap();
    for ((a, b), c) in trained.iter().zip(&inference).zip(&loaded) {
        assert!((a - b).abs() < 1e-5 && (a - c).abs() < 1e-5, "{trained:?} {inference:?} {loaded:?}");
    }

    // A bare encoder (no pooler, no classifier) gets seeded heads: the same seed, the same heads.
    let bare = tempfile::tempdir().unwrap();
    tiny_cross_encoder(bare.path(), 3);
    let tensors = candle_core::safetensors::load(bare.path().join("model.safetensors"), &Device::Cpu).unwrap();
    let kept: std::collections::HashMap<_, _> =
        tensors.into_iter().filter(|(n, _)| !n.contains("pooler") && !n.starts_with("classifier")).collect();
    candle_core::safetensors::save(&kept, bare.path().join("model.safetensors")).unwrap();
    let a = TrainableEncoder::init(bare.path(), &Device::Cpu, DType::F32, 9).unwrap();
    let b = TrainableEncoder::init(bare.path(), &Device::Cpu, DType::F32, 9).unwrap();
    assert_eq!(
        a.initialized(),
        ["bert.pooler.dense.bias", "bert.pooler.dense.weight", "classifier.bias", "classifier.weight"]
    );
    let logits = |m: &TrainableEncoder| m.forward(&encoded).unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(logits(&a), logits(&b));

    // Another family's bare encoder (DistilBertModel's names: no prefix, no head) gets its family's head, seeded,
    // with one label.
    let distil = tempfile::tempdir().unwrap();
    let source = crate::fixtures::model_fixture("distilbert-train");
    for file in ["config.json", "tokenizer.json"] {
        std::fs::copy(source.join(file), distil.path().join(file)).unwrap();
    }
    let tensors = candle_core::safetensors::load(source.join("model.safetensors"), &Device::Cpu).unwrap();
    let bare: std::collections::HashMap<_, _> =
        tensors.into_iter().filter_map(|(n, t)| Some((n.strip_prefix("distilbert.")?.to_string(), t))).collect();
    candle_core::safetensors::save(&bare, distil.path().join("model.safetensors")).unwrap();
    let model = TrainableEncoder::init(distil.path(), &Device::Cpu, DType::F32, 9).unwrap();
    assert_eq!(
        model.initialized(),
        ["classifier.bias", "classifier.weight", "pre_classifier.bias", "pre_classifier.weight"]
    );
    let encoded: Vec<_> = pairs.iter().map(|(q, s)| model.encode(q, s, 48, 8).unwrap()).collect();
    assert_eq!(model.forward(&encoded).unwrap().dims(), [2]);

    // Another family is refused by name, saying that it serves.
    let decoder = crate::fixtures::model_fixture("qwen3-seq-cls");
    let refused = TrainableEncoder::init(&decoder, &Device::Cpu, DType::F32, 1).err().unwrap().to_string();
    let takes = "training takes BERT, RoBERTa and XLM-R, ELECTRA, DistilBERT, DeBERTa and ModernBERT models";
    assert!(refused.contains(takes) && refused.contains("Qwen3"), "{refused}");
}

fn train_args<'a>(model: &'a str, out: &'a str, method: &'a str, steps: &'a str) -> Vec<&'a str> {
    vec![
        "train",
        "--topics",
        "topics.tsv",
        "--qrels",
        "qrels.txt",
        "--folds",
        "folds.tsv",
        "--dev-fold",
        "1",
        "--init",
        model,
        "--out",
        out,
        "--method",
        method,
        "--steps",
        steps,
        "--batch",
        "8",
        "--lr",
        "2e-3",
        "--warmup",
        "0.05",
        "--max-length",
        "64",
        "--max-query-tokens",
        "16",
        "--doc-tokens",
        "all",
        "--eval-every",
        "20",
        "--checkpoint-every",
        "5",
        "--patience",
        "0",
        "--candidates",
        "5",
        "--dev-depth",
        "5",
        "--iterations",
        "2",
        "--seed",
        "5",
    ]
}

fn summary(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap()
}

/// Whether a Co-BERT run under `dir` started its heads from the backbone, as its `train.json` records.
fn heads_from_backbone(dir: &Path) -> bool {
    let options: Value = serde_json::from_slice(&std::fs::read(dir.join("train.json")).unwrap()).unwrap();
    options["options"]["cobert"]["from_backbone"].as_bool().unwrap()
}

fn best_dev(summary: &Value, name: &str) -> f64 {
    let models = summary["models"].as_array().unwrap();
    let model = models.iter().find(|m| m["name"] == name).unwrap_or_else(|| panic!("no {name}: {summary}"));
    model["best_dev"].as_f64().unwrap()
}

#[test]
fn best_segment_training_learns_a_buried_sentence_beats_firstp_and_teaches_a_selector() {
    let models = tempfile::tempdir().unwrap();
    tiny_cross_encoder(models.path(), 11);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    buried_sentence_collection(d);
    let model = models.path().to_str().unwrap();
    let firstp_run = cli(d, &train_args(model, "firstp", "firstp", "80"));
    let said = String::from_utf8_lossy(&firstp_run.stderr);
    assert!(firstp_run.status.success(), "{said}");
    // Off a terminal, progress comes as log lines: training's rate counts the steps since it took up again after
    // a dev evaluation (it read millions of steps a second there, counting those before).
    let rates: Vec<f64> = said
        .lines()
        .filter(|l| l.starts_with("training "))
        .filter_map(|l| l.split(", ").nth(1)?.strip_suffix("/s")?.parse().ok())
        .collect();
    assert!(rates.len() >= 4 && rates.iter().all(|r| *r < 10_000.0), "{rates:?}\n{said}");
    let best_out = cli_ok(d, &train_args(model, "best", "best", "80"));
    let (firstp, best) = (summary(&d.join("firstp")), summary(&d.join("best")));
    let firstp_mrr = best_dev(&firstp, "firstp");
    let allp_mrr = best_dev(&best, "allp");
    let best_mrr = best_dev(&best, "best-1").max(best_dev(&best, "best-2"));
    eprintln!("dev MRR@10: firstp {firstp_mrr:.3}, allp {allp_mrr:.3}, best {best_mrr:.3}\n{best_out}");
    assert!(best_mrr >= 0.9, "BeST learned the task: {best_mrr}");
    assert!(best_mrr > firstp_mrr + 0.2, "BeST {best_mrr} vs FirstP {firstp_mrr}");
    let selections = std::fs::read_to_string(d.join("best/best-2/selections.tsv")).unwrap();
    assert!(selections.lines().count() > 20, "{selections}");
    for name in ["allp", "best-1", "best-2"] {
        let path = d.join("best").join(name);
        assert!(path.join("model/model.safetensors").exists() && path.join("curves.svg").exists(), "{name}");
    }

    // The paper's Table 2 on trained checkpoints: the best segment of the relevant document is the needle's.
    let config = "[model]\nmax_length = 64\nmax_query_tokens = 16\n[model.segments]\nrepeat_title = true\n";
    std::fs::write(d.join("config.toml"), config).unwrap();
    let selection = |model: &Path| {
        let args = [
            "--config",
            "config.toml",
            "--model",
            model.to_str().unwrap(),
            "eval-segments",
            "--topics",
            "topics.tsv",
            "--passages",
            "passages.tsv",
        ];
        let out = cli_ok(d, &args);
        (tsv_value(&out, "p1_model"), tsv_value(&out, "p1_first"))
    };
    let (best_p1, first_p1) = selection(&d.join("best/best-2/model"));
    assert!(best_p1 >= 0.9 && first_p1 < 0.5, "BeST selects the needle: P@1 {best_p1}, first segment {first_p1}");

    // A learned preselection: a bi-encoder distilled from best-2's segment scores finds the needle's segment,
    // which the untrained one does not.
    tiny_bi_encoder(&models.path().join("bi"), 13);
    let (teacher, bi) = (d.join("best/best-2/model"), models.path().join("bi"));
    let mut args = train_args(bi.to_str().unwrap(), "selector", "selector", "80");
    args.extend(["--negatives", "3"]);
    let args: Vec<&str> =
        ["--config", "config.toml", "--model", teacher.to_str().unwrap()].into_iter().chain(args).collect();
    cli_ok(d, &args);
    let learned = best_dev(&summary(&d.join("selector")), "selector");
    let log = std::fs::read_to_string(d.join("selector/selector/log.jsonl")).unwrap();
    let initial: Value = serde_json::from_str(log.lines().next().unwrap()).unwrap();
    let initial = initial["dev"]["best_recall@1"].as_f64().unwrap();
    assert!(learned >= 0.6 && initial < 0.3, "dev best recall@1: {initial} at step 0, {learned} trained");
    let named = format!(
        "{config}[model.named]\nlearned = {:?}\nuntrained = {:?}\n",
        d.join("selector/selector/model").display(),
        bi.display()
    );
    std::fs::write(d.join("named.toml"), named).unwrap();
    let recall = |selector: &str| {
        let preselect = format!("{{\"selector\": \"bi-encoder:{selector}\", \"per_doc\": 1}}");
        let args = [
            "--config",
            "named.toml",
            "--model",
            teacher.to_str().unwrap(),
            "eval-segments",
            "--topics",
            "topics.tsv",
            "--passages",
            "passages.tsv",
            "--preselect",
            &preselect,
        ];
        tsv_value(&cli_ok(d, &args), "best_recall")
    };
    let (learned, untrained) = (recall("learned"), recall("untrained"));
    assert!(learned >= 0.75 && untrained < 0.3, "best recall at s = 1: learned {learned}, untrained {untrained}");

    // The server loads the selected checkpoint and scores dev's candidates as training's dev run did.
    let selected = d.join("best").join(best["selected"].as_str().unwrap());
    served_as_in_training(d, &selected.join("model"), &selected.join("dev-run.txt"), "maxp");
}

/// FirstP and BeST (all segments, then two iterations) train every family's tiny model through the CLI: each
/// writes its checkpoints, selects one on dev, and the server loads the selected one and scores dev's
/// candidates as training did.
#[test]
fn every_family_trains_by_firstp_and_best() {
    for family in ["xlm-roberta", "roberta", "distilbert", "electra", "deberta-v3", "modernbert"] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        buried_sentence_collection(d);
        let model = crate::fixtures::model_fixture(&format!("{family}-train"));
        let model = model.to_str().unwrap();
        let out = cli_ok(d, &train_args(model, "firstp", "firstp", "10"));
        assert!(out.contains("selected on dev: "), "{family}: {out}");
        cli_ok(d, &train_args(model, "best", "best", "10"));
        let best = summary(&d.join("best"));
        for name in ["allp", "best-1", "best-2"] {
            assert!(d.join("best").join(name).join("model/model.safetensors").exists(), "{family}: {name}");
        }
        let selected = d.join("best").join(best["selected"].as_str().unwrap());
        served_as_in_training(d, &selected.join("model"), &selected.join("dev-run.txt"), "maxp");
    }
}

/// The learned preselection across families: an ELECTRA cross-encoder teaches ModernBERT, DeBERTa-v3 and XLM-R
/// bi-encoders (sentence-transformers checkpoints); each selector is written as one, and the CLI serves it as
/// `bi-encoder:NAME` in front of its teacher. Tiny random models: this checks the path, not what they learn.
#[test]
fn a_selector_distils_from_and_into_other_families() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    buried_sentence_collection(d);
    let config = "[model]\nmax_length = 64\nmax_query_tokens = 16\n[model.segments]\nrepeat_title = true\n";
    let teacher = crate::fixtures::model_fixture("electra-train");
    let teacher = teacher.to_str().unwrap();
    for student in ["modernbert-bi", "deberta-v3-bi", "xlm-roberta-bi"] {
        let (bi, out) = (crate::fixtures::model_fixture(student), format!("selector-{student}"));
        let mut args = vec!["--model", teacher];
        args.extend(train_args(bi.to_str().unwrap(), &out, "selector", "10"));
        args.extend(["--negatives", "2"]);
        cli_ok(d, &args);
        let learned = d.join(&out).join("selector/model");
        for file in ["modules.json", "config.json", "model.safetensors"] {
            assert!(learned.join(file).exists(), "{student}: {file}");
        }
        let log = std::fs::read_to_string(d.join(&out).join("selector/log.jsonl")).unwrap();
        assert!(log.lines().any(|l| l.contains("\"step\":10")), "{student}: ten steps logged\n{log}");
        let named = format!("{config}[model.named]\nlearned = {:?}\n", learned.display());
        std::fs::write(d.join("named.toml"), named).unwrap();
        let preselect = r#"{"selector": "bi-encoder:learned", "per_doc": 1}"#;
        let args = ["--config", "named.toml", "--model", teacher, "eval-segments", "--topics", "topics.tsv"];
        let out = cli_ok(d, &[&args[..], &["--passages", "passages.tsv", "--preselect", preselect]].concat());
        let recall = tsv_value(&out, "best_recall");
        assert!((0.0..=1.0).contains(&recall), "{student}: {out}");
    }
}

/// The server, with training's input settings and `model`, gives the first ten (query, document) pairs of
/// a dev run the same model scores.
fn served_as_in_training(d: &Path, model: &Path, dev_run: &Path, pipeline: &str) {
    let config = "[model]\nmax_length = 64\nmax_query_tokens = 16\n[model.segments]\nrepeat_title = true\n";
    std::fs::write(d.join("serve.toml"), config).unwrap();
    let env = [
        ("LONGRANK_CONFIG", d.join("serve.toml").to_str().unwrap().to_string()),
        ("LONGRANK_MODEL_PATH", model.to_str().unwrap().to_string()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let server = TestServer::start(d, &env).wait_ready();
    let dev_run = std::fs::read_to_string(dev_run).unwrap();
    let topics = std::fs::read_to_string(d.join("topics.tsv")).unwrap();
    let mut compared = 0;
    for line in dev_run.lines().take(10) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let (qid, docid, score): (&str, &str, f64) = (cols[0], cols[2], cols[4].parse().unwrap());
        let query = topics.lines().find_map(|l| l.strip_prefix(&format!("{qid}\t"))).unwrap();
        // Every segment read, as the dev run read them.
        let every_segment = json!({"selector": "none"});
        let body = json!({"query": query, "pipeline": pipeline, "depth": 5, "k": 5, "preselect": every_segment});
        let body = body.to_string();
        let reply = post_json(&server.url("/search"), &body);
        assert_eq!(reply.status, 200, "{}", reply.body);
        let hits = reply.json()["results"].as_array().unwrap().clone();
        let hit = hits.iter().find(|h| h["docid"] == docid).unwrap_or_else(|| panic!("{docid} not in {hits:?}"));
        let served = hit["model_score"].as_f64().unwrap();
        assert!((served - score).abs() < 1e-4, "{qid} {docid}: served {served}, dev run {score}");
        compared += 1;
    }
    assert_eq!(compared, 10);
}

/// Losses by step from a log.
fn losses(log: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter_map(|e| Some((e["step"].as_u64()?, e.get("loss")?.as_f64()?)))
        .collect()
}

#[test]
fn a_killed_run_resumes_from_its_last_checkpoint_and_trains_as_if_never_stopped() {
    let models = tempfile::tempdir().unwrap();
    tiny_cross_encoder(models.path(), 13);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    buried_sentence_collection(d);
    let model = models.path().to_str().unwrap();
    // The softmax loss over three negatives, two passes per step: those paths resume exactly too.
    let extra = ["--loss", "softmax", "--negatives", "3", "--accumulate", "2"];
    let args = killed_and_resumed_as_whole(d, model, &extra);
    assert!(best_dev(&summary(&d.join("whole")), "allp") >= 0.9, "learned with the softmax loss");

    // Other options in the same directory are refused, naming the file.
    let mut other = args.clone();
    let seed = other.iter().position(|a| *a == "--seed").unwrap();
    other[seed + 1] = "6";
    let out = crate::common::cli(d, &other);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("train.json"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Each family's kill and resume, as BERT's above (its tiny training fixture, the pairwise loss; ELECTRA's with
/// `--dropout`).
#[test]
fn every_family_resumes_a_killed_run_as_if_never_stopped() {
    for family in ["electra", "deberta-v3", "modernbert"] {
        let dir = tempfile::tempdir().unwrap();
        buried_sentence_collection(dir.path());
        let model = crate::fixtures::model_fixture(&format!("{family}-train"));
        // ELECTRA's with dropout: its masks resume with the step too.
        let extra: &[&str] = if family == "electra" { &["--dropout"] } else { &[] };
        killed_and_resumed_as_whole(dir.path(), model.to_str().unwrap(), extra);
    }
}

/// `allp` from `model` for 60 steps in `d/whole`, then in `d/killed`, killed after its checkpoint at step 15
/// and run again: each step once, the same losses within 1e-4, the same best dev score, the initial model's
/// dev score logged once. Returns the killed run's arguments.
fn killed_and_resumed_as_whole<'a>(d: &Path, model: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let whole: Vec<&str> = train_args(model, "whole", "allp", "60").into_iter().chain(extra.iter().copied()).collect();
    cli_ok(d, &whole);
    // The log starts with the initial model's dev score (step 0), once even in a resumed run (below).
    let initial_evaluations = |log: &Path| {
        let text = std::fs::read_to_string(log).unwrap();
        let entries: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!((entries[0]["step"].as_u64(), entries[0]["dev"].is_object()), (Some(0), true), "{}", entries[0]);
        entries.iter().filter(|e| e["step"] == 0 && e["dev"].is_object()).count()
    };
    assert_eq!(initial_evaluations(&d.join("whole/allp/log.jsonl")), 1);

    let args: Vec<&str> = train_args(model, "killed", "allp", "60").into_iter().chain(extra.iter().copied()).collect();
    // Held by a test hook after its fourth checkpoint (steps 0, 5, 10, 15): the kill lands mid-run.
    let mut child = crate::common::spawn_cli(d, &args, &[("LONGRANK_TEST_HOLD", "train.checkpoint:4")]);
    let progress = d.join("killed/allp/state/progress.json");
    let deadline = Instant::now() + Duration::from_secs(120);
    let step = || -> Option<u64> {
        let state: Value = serde_json::from_slice(&std::fs::read(&progress).ok()?).ok()?;
        state["step"].as_u64()
    };
    while step() != Some(15) {
        assert!(Instant::now() < deadline && child.try_wait().unwrap().is_none(), "{model}: no checkpoint at step 15");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(child.try_wait().unwrap().is_none(), "the run ended at its hold");
    child.kill().unwrap(); // SIGKILL
    assert!(!child.wait().unwrap().success());

    cli_ok(d, &args);
    assert_eq!(initial_evaluations(&d.join("killed/allp/log.jsonl")), 1);
    let (whole, resumed) = (losses(&d.join("whole/allp/log.jsonl")), losses(&d.join("killed/allp/log.jsonl")));
    assert_eq!(resumed.iter().map(|(s, _)| *s).collect::<Vec<_>>(), (1..=60).collect::<Vec<_>>(), "each step once");
    for ((step, a), (_, b)) in whole.iter().zip(&resumed) {
        assert!((a - b).abs() < 1e-4, "{model}, step {step}: uninterrupted {a}, resumed {b}");
    }
    assert_eq!(best_dev(&summary(&d.join("whole")), "allp"), best_dev(&summary(&d.join("killed")), "allp"));
    args
}

#[test]
fn cobert_heads_train_over_a_frozen_model_and_the_server_scores_as_training_did() {
    let models = tempfile::tempdir().unwrap();
    tiny_cross_encoder(models.path(), 17);
    cobert_over(models.path());
}

/// Co-BERT's heads over the other families' backbones (their `[CLS]` states), as over BERT's, frozen and end to
/// end; DeBERTa's and ModernBERT's layers are not BERT's, so heads cannot start as them.
#[test]
fn cobert_heads_train_over_every_familys_backbone() {
    for family in ["electra", "deberta-v3", "modernbert"] {
        cobert_over(&crate::fixtures::model_fixture(&format!("{family}-train")));
    }
    let dir = tempfile::tempdir().unwrap();
    buried_sentence_collection(dir.path());
    let model = crate::fixtures::model_fixture("modernbert-train");
    let cobert = ["--cobert-depth", "5", "--prototypes", "2", "--group", "3", "--overlap", "1", "--heads", "backbone"];
    let args: Vec<&str> = train_args(model.to_str().unwrap(), "co", "cobert", "30").into_iter().chain(cobert).collect();
    let out = cli(dir.path(), &args);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("draw them from the seed (--heads random)"), "{said}");

    // End to end over ModernBERT: the backbone trains with the heads, the first round stays the starting model.
    let d = dir.path();
    let cobert = ["--cobert-depth", "5", "--prototypes", "2", "--group", "3", "--overlap", "1", "--end-to-end"];
    let args: Vec<&str> =
        train_args(model.to_str().unwrap(), "e2e", "cobert", "12").into_iter().chain(cobert).collect();
    cli_ok(d, &args);
    let saved = d.join("e2e/cobert/model");
    let first_round = std::fs::read(saved.join("first-round/model.safetensors")).unwrap();
    assert_eq!(first_round, std::fs::read(model.join("model.safetensors")).unwrap());
    assert_ne!(first_round, std::fs::read(saved.join("model.safetensors")).unwrap(), "the backbone trained");
    served_as_in_training(d, &saved, &d.join("e2e/cobert/dev-run.txt"), "cobert");
}

/// Co-BERT's heads trained for 30 steps over the frozen cross-encoder `model`: the run resumes as done, its
/// checkpoint loads in the server as a Co-BERT model, which scores dev's candidates as training did.
fn cobert_over(model: &Path) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    buried_sentence_collection(d);
    let model = model.to_str().unwrap();
    let cobert = ["--cobert-depth", "5", "--prototypes", "2", "--group", "3", "--overlap", "1"];
    let args: Vec<&str> = train_args(model, "co", "cobert", "30").into_iter().chain(cobert).collect();
    cli_ok(d, &args);
    let report = summary(&d.join("co"));
    assert!(best_dev(&report, "cobert") > 0.0, "{report}");
    assert!(!heads_from_backbone(&d.join("co")), "heads are drawn from the seed by default");
    let steps: Vec<u64> = losses(&d.join("co/cobert/log.jsonl")).into_iter().map(|(s, _)| s).collect();
    assert_eq!(steps, (1..=30).collect::<Vec<_>>());
    let saved = d.join("co/cobert/model");
    for file in ["cobert.json", "cobert.safetensors", "model.safetensors", "config.json", "tokenizer.json"] {
        assert!(saved.join(file).exists(), "{file}");
    }
    // A second run finds everything done: the first round is not recomputed, nothing retrains.
    let features = std::fs::read_to_string(d.join("co/cobert/features-train.jsonl")).unwrap();
    assert_eq!(features.lines().count(), 28, "one line per training query");
    cli_ok(d, &args);
    assert!(std::fs::read_to_string(d.join("co/cobert/features-train.jsonl")).unwrap() == features, "recomputed");

    // The server loads the checkpoint as a Co-BERT model and scores dev's candidates as training did.
    served_as_in_training(d, &saved, &d.join("co/cobert/dev-run.txt"), "cobert");
}

#[test]
fn cobert_heads_start_as_the_backbones_last_layers_or_from_the_seed() {
    use longrank::model::cobert::CoBertConfig;
    use longrank::model::CoBertInit;
    use std::collections::HashMap;
    let models = tempfile::tempdir().unwrap();
    tiny_cross_encoder(models.path(), 23);
    let config = CoBertConfig { prototypes: 2, group: 3, overlap: 1, calibrator_layers: 1, ..Default::default() };
    let weights = |from_backbone| -> HashMap<String, Vec<f32>> {
        let init = CoBertInit { config, from_backbone };
        let model = TrainableEncoder::init_with(models.path(), &Device::Cpu, DType::F32, 1, Some(init)).unwrap();
        let values = |var: &candle_core::Var| var.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        model.variables().iter().map(|(name, var)| (name.clone(), values(var))).collect()
    };
    let (copied, drawn) = (weights(true), weights(false));
    // The tiny backbone has 2 layers: the 1-layer calibrator starts as layer 1, the 4-layer groupwise scorer
    // as layers 0, 1, 0, 1.
    let source = |head: &str, i: usize| match head {
        "calibrator" => 1,
        _ => i % 2,
    };
    let mut checked = 0;
    for (name, values) in copied.iter().filter(|(n, _)| n.ends_with("dense.weight") || n.ends_with("query.weight")) {
        let Some(rest) = name.strip_prefix("cobert.") else { continue };
        let (head, rest) = rest.split_once('.').unwrap();
        let (i, tail) = rest.strip_prefix("encoder.layer.").unwrap().split_once('.').unwrap();
        let backbone = &copied[&format!("bert.encoder.layer.{}.{tail}", source(head, i.parse().unwrap()))];
        assert_eq!(values, backbone, "{name} copies the backbone's layer");
        assert_ne!(&drawn[name], backbone, "{name} drawn from the seed");
        checked += 1;
    }
    assert_eq!(checked, 5 * 4, "query, attention output, intermediate and output weights of 5 layers");
}

#[test]
fn cobert_trains_end_to_end_and_the_server_runs_its_first_round_with_the_model_it_started_from() {
    use longrank::model::cobert::CoBertConfig;
    use longrank::model::CoBertInit;
    let models = tempfile::tempdir().unwrap();
    tiny_cross_encoder(models.path(), 19);
    // Through the backbone's `[CLS]` states and the heads, every variable but the pooler and the classifier
    // (which the heads never read) and the unused no-groupwise projection gets a gradient.
    let config = CoBertConfig { prototypes: 2, group: 3, overlap: 1, ..Default::default() };
    let init = CoBertInit { config, from_backbone: true };
    let model = TrainableEncoder::init_with(models.path(), &Device::Cpu, DType::F32, 1, Some(init)).unwrap();
    let texts = ["the river runs north.", "hills and valleys.", "a lamp on the road, and more words.", "moon"];
    let encoded: Vec<_> = texts.iter().map(|t| model.encode("river hills", t, 64, 16).unwrap()).collect();
    let states = model.cls_states(&encoded).unwrap();
    let first = candle_core::Tensor::new(&[2.0f32, 1.0, 0.5, 0.0], &Device::Cpu).unwrap();
    let scores = model.cobert().unwrap().forward(&states, &first).unwrap();
    let grads = scores.sqr().unwrap().sum_all().unwrap().backward().unwrap();
    let skipped = ["bert.pooler.", "classifier.", "cobert.relevance."];
    let mut checked = 0;
    for (name, var) in model.variables().iter().filter(|(n, _)| !skipped.iter().any(|s| n.starts_with(s))) {
        let grad = grads.get(var.as_tensor()).unwrap_or_else(|| panic!("{name} received no gradient"));
        assert!(grad.abs().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap() > 0.0, "{name}: zero gradient");
        checked += usize::from(name.starts_with("bert."));
    }
    assert!(checked > 30, "{checked} backbone variables");

    // `--end-to-end` trains the backbone with the heads; the checkpoint keeps the starting cross-encoder for
    // the first round, and the server scores dev's candidates as training did.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    buried_sentence_collection(d);
    let cobert = [
        "--cobert-depth",
        "5",
        "--prototypes",
        "2",
        "--group",
        "3",
        "--overlap",
        "1",
        "--end-to-end",
        "--heads",
        "backbone",
    ];
    let args: Vec<&str> =
        train_args(models.path().to_str().unwrap(), "e2e", "cobert", "12").into_iter().chain(cobert).collect();
    cli_ok(d, &args);
    assert!(best_dev(&summary(&d.join("e2e")), "cobert") > 0.0);
    assert!(heads_from_backbone(&d.join("e2e")), "--heads backbone");
    let saved = d.join("e2e/cobert/model");
    let first_round = std::fs::read(saved.join("first-round/model.safetensors")).unwrap();
    assert_eq!(first_round, std::fs::read(models.path().join("model.safetensors")).unwrap());
    assert_ne!(first_round, std::fs::read(saved.join("model.safetensors")).unwrap(), "the backbone trained");
    served_as_in_training(d, &saved, &d.join("e2e/cobert/dev-run.txt"), "cobert");

    // Its FLOPs count the own backbone's pass over each candidate's best passage besides the heads.
    let loaded = longrank::model::cobert::CoBert::load(&saved, &Device::Cpu, DType::F32).unwrap();
    let own = loaded.own.as_ref().expect("an own backbone");
    let server = TestServer::start(d, &[("LONGRANK_MODEL_PATH", saved.to_str().unwrap())]).wait_ready();
    let topics = std::fs::read_to_string(d.join("topics.tsv")).unwrap();
    let query = topics.lines().next().unwrap().split('\t').nth(1).unwrap();
    let flops = |pipeline: &str| {
        // Every segment read, as the dev run read them.
        let every_segment = json!({"selector": "none"});
        let body = json!({"query": query, "pipeline": pipeline, "depth": 5, "k": 5, "preselect": every_segment});
        let body = body.to_string();
        let reply = post_json(&server.url("/search"), &body).json();
        (reply["timing"]["flops"].as_f64().unwrap(), reply["results"].as_array().unwrap().len())
    };
    let ((maxp, n), (co, _)) = (flops("maxp"), flops("cobert"));
    let passes = co - maxp - loaded.heads.flops(&loaded.backbone, n);
    assert!(passes >= n as f64 * own.pair_flops(5), "{co} - {maxp}: {passes} for {n} passages");
}

/// Training's first stage (negatives, dev candidates) is the configured BM25, not Anserini's defaults.
#[test]
fn training_takes_its_candidates_from_the_configured_bm25() {
    let models = tempfile::tempdir().unwrap();
    tiny_cross_encoder(models.path(), 3);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (docs, topics, qrels) = (
        crate::common::data("cranfield/docs.jsonl"),
        crate::common::data("cranfield/topics.tsv"),
        crate::common::data("cranfield/qrels.txt"),
    );
    let (topics, qrels) = (topics.to_str().unwrap(), qrels.to_str().unwrap());
    cli_ok(d, &["index", "--collection", "cranfield", docs.to_str().unwrap()]);
    let model = models.path().to_str().unwrap();
    let args = [
        "train",
        "--topics",
        topics,
        "--qrels",
        qrels,
        "--init",
        model,
        "--out",
        "run",
        "--method",
        "firstp",
        "--steps",
        "1",
        "--dev-queries",
        "30",
        "--dev-depth",
        "5",
        "--candidates",
        "5",
        "--max-length",
        "64",
        "--max-query-tokens",
        "16",
    ];
    let bm25 = [("LONGRANK_BM25_K1", "2.0"), ("LONGRANK_BM25_B", "1.0")];
    let out = crate::common::cli_env(d, &args, &bm25);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let options: Value = serde_json::from_str(&std::fs::read_to_string(d.join("run/train.json")).unwrap()).unwrap();
    assert_eq!(options["options"]["bm25"], json!({"k1": 2.0, "b": 1.0}));
    // Each dev query's candidates are its top 5 under those parameters.
    let sets = |run: &str| -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
        let mut sets: std::collections::BTreeMap<_, std::collections::BTreeSet<_>> = Default::default();
        for line in run.lines() {
            let cols: Vec<&str> = line.split_whitespace().collect();
            sets.entry(cols[0].to_string()).or_default().insert(cols[2].to_string());
        }
        sets
    };
    let dev = sets(&std::fs::read_to_string(d.join("run/firstp/dev-run.txt")).unwrap());
    let first_stage = |name: &str, extra: &[&str]| {
        let out = d.join(name);
        let args = [&["batch", "--topics", topics, "-k", "5", "--out", out.to_str().unwrap()], extra].concat();
        cli_ok(d, &args);
        sets(&std::fs::read_to_string(&out).unwrap())
    };
    let configured = first_stage("configured.run", &["--bm25", r#"{"k1": 2.0, "b": 1.0}"#]);
    let anserini = first_stage("anserini.run", &[]);
    assert_eq!(dev.len(), 30);
    for (qid, candidates) in &dev {
        assert_eq!(candidates, &configured[qid], "dev query {qid}");
    }
    assert!(dev.iter().any(|(qid, c)| c != &anserini[qid]), "the parameters change no dev query's top 5");
}

/// Dropout in training (`--dropout`), as each family's transformers model drops in `train()` mode: off outside
/// a step, the same masks from the same seed and others from another, every variable still getting its
/// gradient. ModernBERT drops only where its config says (ModernBERT-base's, like its fixture's, says nowhere).
#[test]
fn dropout_draws_seeded_masks_in_training_steps_only() {
    for family in ["bert", "roberta", "xlm-roberta", "electra", "distilbert", "deberta-v3", "modernbert", "modernbert+"]
    {
        let fixture = crate::fixtures::model_fixture(&format!("{}-train", family.trim_end_matches('+')));
        let copy = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(&fixture).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(&path, copy.path().join(path.file_name().unwrap())).unwrap();
        }
        let set = |rates: Value| {
            let path = copy.path().join("config.json");
            let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            config.as_object_mut().unwrap().extend(rates.as_object().unwrap().clone());
            std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
        };
        if family == "modernbert+" {
            set(
                json!({"embedding_dropout": 0.1, "attention_dropout": 0.1, "mlp_dropout": 0.1, "classifier_dropout": 0.1}),
            );
        }
        let model = TrainableEncoder::init(copy.path(), &Device::Cpu, DType::F32, 0).unwrap();
        let pairs = [("where is the sentence", "buried deep in a long document"), ("what else", "another text")];
        let encoded: Vec<_> = pairs.iter().map(|(q, d)| model.encode(q, d, 64, 16).unwrap()).collect();
        let logits = || model.forward(&encoded).unwrap().to_vec1::<f32>().unwrap();
        let off = logits();
        model.dropout().start(1);
        let on = logits();
        model.dropout().start(1);
        assert_eq!(logits(), on, "{family}: the same seed, the same masks");
        model.dropout().start(2);
        let other = logits();
        if family == "modernbert" {
            assert_eq!((&on, &other), (&off, &off), "{family}: no rate, no dropout");
        } else {
            assert_ne!(on, off, "{family}: dropped");
            assert_ne!(other, on, "{family}: another seed, other masks");
        }
        model.dropout().start(3);
        let grads = model.forward(&encoded).unwrap().sum_all().unwrap().backward().unwrap();
        for (name, var) in model.variables() {
            assert!(grads.get(var.as_tensor()).is_some(), "{family}: {name} received no gradient with dropout");
        }
        model.dropout().stop();
        assert_eq!(logits(), off, "{family}: off again");
    }
}

/// `longrank train --dropout`: the same run twice logs the same losses, bit for bit, and others than without
/// dropout (the kill-and-resume of a run with dropout: `every_family_resumes_a_killed_run_...`).
#[test]
fn training_with_dropout_repeats_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    buried_sentence_collection(d);
    let model = crate::fixtures::model_fixture("electra-train");
    let model = model.to_str().unwrap();
    let run = |out: &str, dropout: bool| {
        let mut args = train_args(model, out, "firstp", "10");
        if dropout {
            args.push("--dropout");
        }
        cli_ok(d, &args);
        losses(&d.join(out).join("firstp/log.jsonl"))
    };
    let (once, again, without) = (run("once", true), run("again", true), run("without", false));
    assert_eq!(once.len(), 10);
    assert_eq!(once, again, "the same masks, the same losses to the last bit");
    assert_ne!(once, without, "dropout changed the training");
}
