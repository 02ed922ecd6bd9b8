//! Real clients against the served OpenAPI document: a Python client generated from it
//! (openapi-python-client) used as a user would, and schemathesis's fuzzing of every operation (bounded by
//! examples and wall time): no server error, no response outside the schema.

use std::path::Path;
use std::process::Command;

use crate::common::{data, get, python, TestServer};
use crate::fixtures::{cranfield_data_dir, tiny_cross_encoder};

/// A tool of the tests' Python environment, with that environment's `bin` first on its PATH (the generator
/// formats its output with the environment's ruff).
fn tool(name: &str) -> Command {
    let bin = python().parent().expect("the environment's bin").to_path_buf();
    let mut cmd = Command::new(bin.join(name));
    let path = std::env::var_os("PATH").unwrap_or_default();
    let paths = std::iter::once(bin).chain(std::env::split_paths(&path));
    cmd.env("PATH", std::env::join_paths(paths).unwrap());
    cmd
}

/// A server of cranfield with a tiny cross-encoder as its default model, so the re-ranking operations run.
fn server(models: &Path) -> (tempfile::TempDir, TestServer) {
    tiny_cross_encoder(models, 5);
    let dir = cranfield_data_dir();
    let server = TestServer::start(dir.path(), &[("LONGRANK_MODEL_PATH", models.to_str().unwrap())]).wait_ready();
    (dir, server)
}

#[test]
fn a_generated_python_client_searches_submits_a_batch_and_reads_typed_errors() {
    let models = tempfile::tempdir().unwrap();
    let (_dir, server) = server(models.path());
    let work = tempfile::tempdir().unwrap();
    let (status, spec) = get(&server.url("/openapi.json"));
    assert_eq!(status, 200);
    let spec_path = work.path().join("openapi.json");
    std::fs::write(&spec_path, spec).unwrap();
    let package = work.path().join("longrank_client");
    let generated = tool("openapi-python-client")
        .args(["generate", "--meta", "none", "--path"])
        .arg(&spec_path)
        .arg("--output-path")
        .arg(&package)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&generated.stdout).to_string() + &String::from_utf8_lossy(&generated.stderr);
    assert!(generated.status.success() && !said.contains("Warning"), "the generator refused the document: {said}");

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/generated_client.py");
    let out = Command::new(python())
        .arg(script)
        .arg(server.url(""))
        .arg(work.path())
        .arg(data("cranfield/topics.tsv"))
        .arg(data("cranfield/qrels.txt"))
        .output()
        .unwrap();
    assert!(out.status.success(), "the generated client failed: {}", String::from_utf8_lossy(&out.stderr));
    let seen: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(seen["search"].as_array().unwrap().len(), 3, "{seen}");
    let timing = &seen["timing"];
    assert!(timing["pairs"].as_u64().is_some_and(|p| p > 0) && timing["inference_ms"].is_number(), "{seen}");
    assert_eq!(seen["batch"]["status"], "done", "{seen}");
    assert!(seen["batch"]["map"].as_f64().unwrap() > 0.0, "{seen}");
    assert_eq!(seen["error"], serde_json::json!({"status": 422, "code": "unknown_pipeline"}));
}

#[test]
fn schemathesis_finds_no_server_error_and_no_response_outside_the_schema() {
    let models = tempfile::tempdir().unwrap();
    let (_dir, server) = server(models.path());
    let work = tempfile::tempdir().unwrap();
    // Bounded: 50 examples per operation from a fixed seed, and five minutes at most.
    let out = Command::new("timeout")
        .arg("300")
        .arg(python().parent().unwrap().join("schemathesis"))
        .args(["--no-color", "run", &server.url("/openapi.json"), "--max-examples", "50", "--seed", "20261201"])
        .args(["--checks", "not_a_server_error,response_schema_conformance"])
        .current_dir(work.path())
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "schemathesis found failures:\n{report}\n{}", String::from_utf8_lossy(&out.stderr));
    let spec: serde_json::Value = serde_json::from_str(&get(&server.url("/openapi.json")).1).unwrap();
    let operations: usize = spec["paths"].as_object().unwrap().values().map(|p| p.as_object().unwrap().len()).sum();
    assert!(report.contains(&format!("Tested: {operations}\n")), "all {operations} operations tested:\n{report}");
}
