//! The tools longrank's users already run, installed from PyPI (ci/requirements.txt), against the real server:
//! PyTerrier's `pt.Experiment` over the Python package in `clients/python`, Cohere's SDK and LangChain's
//! reranker over the compatible routes, text-embeddings-inference's request bodies, and OpenAI's client for
//! embeddings. The server has a search key, which every client sends as `Authorization: Bearer KEY`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use crate::common::{cli_env, data, python, TestServer};
use crate::fixtures::{cranfield_data_dir, tiny_cross_encoder};

const KEY: &str = "ecosystem-test-key";

fn server(models: &Path) -> (tempfile::TempDir, TestServer) {
    tiny_cross_encoder(models, 5);
    let dir = cranfield_data_dir();
    let env = [("LONGRANK_MODEL_PATH", models.to_str().unwrap()), ("LONGRANK_SERVER_SEARCH_KEYS", KEY)];
    let server = TestServer::start(dir.path(), &env).wait_ready();
    (dir, server)
}

/// Runs one of the tests' Python scripts with `PYTHONPATH`; its one JSON line.
fn script(name: &str, args: &[&str], pythonpath: &Path) -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python").join(name);
    let out = Command::new(python()).arg(path).args(args).env("PYTHONPATH", pythonpath).output().unwrap();
    assert!(out.status.success(), "{name} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn cohere_langchain_and_tei_clients_rerank_long_documents_by_maxp() {
    let models = tempfile::tempdir().unwrap();
    let (_dir, server) = server(models.path());
    let seen = script("rerank_clients.py", &[&server.url(""), KEY], models.path());
    assert_eq!(seen["v2"]["order"].as_array().unwrap().len(), 2, "top_n: {seen}");
    assert_eq!(seen["v2_error"], "empty_query");
    assert_eq!(seen["key_error"], "invalid_key");
    assert_eq!(seen["v1"], seen["langchain"], "{seen}");
    assert_eq!(seen["tei_error"], "out_of_range");
}

/// TEI's `/embed` and OpenAI's client on `/v1/embeddings` get sentence-transformers' embeddings of the real
/// MiniLM (within 1e-5 a component), long texts refused or cut as they ask; `normalize: false` gives the
/// model's own output (a copy of the MiniLM without its Normalize module); a cross-encoder embeds nothing.
#[test]
fn tei_and_openai_clients_get_the_reference_embeddings() {
    let models = tempfile::tempdir().unwrap();
    let minilm = crate::common::minilm();
    let raw = models.path().join("raw");
    std::fs::create_dir(&raw).unwrap();
    for entry in std::fs::read_dir(&minilm).unwrap() {
        let path = entry.unwrap().path();
        std::os::unix::fs::symlink(&path, raw.join(path.file_name().unwrap())).unwrap();
    }
    let modules: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(minilm.join("modules.json")).unwrap()).unwrap();
    let unnormalized: Vec<_> =
        modules.into_iter().filter(|m| !m["type"].as_str().unwrap().ends_with("Normalize")).collect();
    assert_eq!(unnormalized.len(), 2, "the MiniLM's modules: transformer, pooling, normalize");
    std::fs::remove_file(raw.join("modules.json")).unwrap();
    std::fs::write(raw.join("modules.json"), serde_json::to_string(&unnormalized).unwrap()).unwrap();
    let ce = models.path().join("ce");
    tiny_cross_encoder(&ce, 5);
    let dir = tempfile::tempdir().unwrap();
    let config = format!("[model.named]\nraw = {:?}\nce = {:?}\n", raw.to_str().unwrap(), ce.to_str().unwrap());
    std::fs::write(dir.path().join("longrank.toml"), config).unwrap();
    let env = [
        ("LONGRANK_CONFIG", "longrank.toml"),
        ("LONGRANK_MODEL_PATH", minilm.to_str().unwrap()),
        ("LONGRANK_SERVER_SEARCH_KEYS", KEY),
    ];
    let server = TestServer::start(dir.path(), &env).wait_ready();
    let reference = crate::common::shared().join("reference/models/minilm-l6.json");
    let seen = script("embedding_clients.py", &[&server.url(""), KEY, reference.to_str().unwrap()], models.path());
    assert!(seen["tei_worst"].as_f64().unwrap() <= 1e-5, "{seen}");
    assert!(seen["openai_worst"].as_f64().unwrap() <= 1e-5, "{seen}");
    assert_eq!(seen["tei_error"], "input_too_long");
    assert_eq!(seen["openai_error"], "unknown_model");
}

/// trec_eval's `measure all value` lines of `longrank eval` on a run, by measure.
fn longrank_eval(data_dir: &Path, run: &Path, qrels: &Path) -> BTreeMap<String, f64> {
    let measures = ["-m", "map", "-m", "ndcg_cut.10", "-m", "P.10", "-m", "recip_rank"];
    let args = [&["eval"][..], &measures, &[run.to_str().unwrap(), qrels.to_str().unwrap()]].concat();
    let out = cli_env(data_dir, &args, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            Some((fields[0].to_string(), fields[2].parse().ok()?))
        })
        .collect()
}

#[test]
fn a_pyterrier_experiment_equals_the_clis_runs_through_longrank_eval() {
    let models = tempfile::tempdir().unwrap();
    let (dir, server) = server(models.path());
    let work = tempfile::tempdir().unwrap();
    // The package, installed with pip from the checkout (into its own folder: the environment stays as built).
    let site = work.path().join("site");
    let package = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/python");
    let installed = Command::new(python())
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps"])
        .args(["--no-build-isolation", "--target"])
        .arg(&site)
        .arg(&package)
        .output()
        .unwrap();
    assert!(installed.status.success(), "pip install: {}", String::from_utf8_lossy(&installed.stderr));

    let topics = work.path().join("topics.tsv");
    let text = std::fs::read_to_string(data("cranfield/topics.tsv")).unwrap();
    std::fs::write(&topics, text.lines().take(50).map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    let qrels = data("cranfield/qrels.txt");
    let runs = work.path().join("runs");
    std::fs::create_dir(&runs).unwrap();
    let seen = script(
        "pyterrier_experiment.py",
        &[&server.url(""), KEY, topics.to_str().unwrap(), qrels.to_str().unwrap(), runs.to_str().unwrap()],
        &site,
    );
    let evidence = &seen["evidence"];
    assert_eq!(evidence["rows"], 20, "{evidence}");
    assert_eq!(evidence["best_segment_ok"], true, "{evidence}");
    assert_eq!(evidence["model_score_is_score"], true, "{evidence}");
    for column in ["best_segment_start", "best_segment_end", "best_segment_text", "model_score"] {
        assert!(evidence["columns"].as_array().unwrap().iter().any(|c| c == column), "{column}: {evidence}");
    }

    let model = models.path().to_str().unwrap();
    for (name, k, depth) in [("bm25", "1000", "1000"), ("bm25+rm3", "1000", "1000"), ("maxp", "20", "20")] {
        let cli_run = work.path().join(format!("{name}.cli.run"));
        let args = ["batch", "--topics", topics.to_str().unwrap(), "--pipeline", name, "-k", k, "--depth", depth];
        let out = cli_env(
            dir.path(),
            &[&args[..], &["--out", cli_run.to_str().unwrap()]].concat(),
            &[("LONGRANK_MODEL_PATH", model)],
        );
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let cli = longrank_eval(dir.path(), &cli_run, &qrels);
        let pyterrier_run = longrank_eval(dir.path(), &runs.join(format!("{name}.run")), &qrels);
        assert_eq!(pyterrier_run, cli, "{name}: longrank eval of PyTerrier's run and of the CLI's");
        let table = &seen["table"][name];
        // PyTerrier (ir_measures) names the measures as trec_eval prints them.
        for measure in ["map", "ndcg_cut_10", "P_10", "recip_rank"] {
            let (printed, exact) = (cli[measure], table[measure].as_f64().unwrap());
            // trec_eval prints four decimals.
            assert!(
                exact > 0.0 && (printed - exact).abs() <= 5e-5,
                "{name} {measure}: longrank eval {printed}, pt.Experiment {exact}"
            );
        }
    }
}
