//! The GPU machine's device run (scripts/gpu), rehearsed on the CPU so that it can fail there only for GPU
//! reasons: the pack's layout from this build's binary, then the device script with `--device cpu` on a tiny
//! cross-encoder (and the packed decoder and ModernBERT fixtures), without PyTorch (longrank's side of every part,
//! and the summary).

use std::path::Path;
use std::process::Command;

use crate::common::{isolated, minilm, python, BIN};
use crate::fixtures::tiny_cross_encoder;

#[test]
fn the_device_run_rehearses_on_the_cpu_and_reports_every_part() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let work = tempfile::tempdir().unwrap();
    let pack = work.path().join("pack");
    let packed = Command::new("bash")
        .arg(root.join("scripts/gpu/pack.sh"))
        .arg("--binary")
        .args([Path::new(BIN), &pack])
        .env("LONGRANK_MINILM", minilm())
        .output()
        .unwrap();
    assert!(packed.status.success(), "pack.sh: {}", String::from_utf8_lossy(&packed.stderr));
    for file in ["longrank.xz", "device.sh", "device.py", "synth.py", "vocab/tokenizer.json", "vocab/vocab.txt"] {
        assert!(pack.join(file).is_file(), "the pack lacks {file}");
    }
    let size: u64 = walk(&pack).iter().map(|p| p.metadata().unwrap().len()).sum();
    assert!(size <= 60 << 20, "the pack is {size} bytes, over the 60 MiB that travel");

    let model = work.path().join("tiny");
    tiny_cross_encoder(&model, 3);
    let out = work.path().join("out");
    let mut device = Command::new("bash");
    isolated(&mut device)
        .arg(pack.join("device.sh"))
        .args(["--device", "cpu", "--quick", "--model-dir"])
        .arg(&model)
        .env("OUT", &out)
        .env("PYTHON", python())
        .env("TMPDIR", work.path());
    let ran = device.output().unwrap();
    let said = String::from_utf8_lossy(&ran.stdout).to_string() + &String::from_utf8_lossy(&ran.stderr);
    assert!(ran.status.success(), "device.sh failed: {said}");

    let summary: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["errors"], serde_json::json!([]), "{summary}");
    let parts = &summary["parts"];
    for name in ["env", "models", "correctness", "speed", "e2e", "train", "decoder", "long"] {
        assert!(parts[name]["seconds"].is_number() && parts[name]["error"].is_null(), "{name}: {summary}");
    }
    assert!(parts["env"]["longrank_version"].as_str().unwrap().starts_with("longrank "), "{summary}");
    let check = &parts["correctness"]["given"];
    assert_eq!(check["pairs"], 10, "{check}");
    let lengths: Vec<u64> = check["pair_lengths"].as_array().unwrap().iter().map(|n| n.as_u64().unwrap()).collect();
    assert!(lengths.iter().any(|&n| n < 64) && lengths.contains(&64), "padded and truncated pairs: {lengths:?}");
    assert_eq!(check["within_tolerance_cpu"], true, "{check}");
    let table = parts["speed"]["table"].as_array().unwrap();
    assert_eq!(table.len(), 2, "one row per batch size: {table:?}");
    assert!(table.iter().all(|row| row["longrank_pairs_per_s"].as_f64().unwrap() > 0.0), "{table:?}");
    let e2e = &parts["e2e"];
    assert_eq!(e2e["search"]["requests"], 4, "{e2e}");
    assert!(e2e["search"]["pairs_per_request"].as_f64().unwrap() > 0.0, "{e2e}");
    assert_eq!(e2e["batch"]["status"], "done", "{e2e}");
    // The libraries the server mapped, each with its version: on the CPU, the BLAS it loaded when there is one.
    let libraries = e2e["libraries"].as_array().unwrap_or_else(|| panic!("{e2e}"));
    assert!(libraries.iter().all(|l| l["path"].is_string() && l["version"].is_string()), "{libraries:?}");
    if std::env::var_os("LONGRANK_EXPECT_BLAS").is_some() {
        let blas = libraries
            .iter()
            .find(|l| l["path"].as_str().unwrap().contains("blas") || l["path"].as_str().unwrap().contains("mkl"));
        let version = blas.unwrap_or_else(|| panic!("no BLAS among {libraries:?}"))["version"].as_str().unwrap();
        assert!(!version.starts_with("unknown"), "{libraries:?}");
    }
    assert_eq!(parts["env"]["gpu_state"]["absent"], "not a GPU run", "{summary}");
    assert!(e2e["batch"]["pairs"].as_f64().unwrap() > 0.0, "{e2e}");
    assert!(parts["train"]["longrank_step_s"].as_f64().unwrap() > 0.0, "{summary}");
    // The decoder reranker and the long-input encoder: the packed fixtures, scored and timed.
    let decoder = &parts["decoder"];
    assert_eq!(decoder["longrank_f32_scores"].as_array().map(Vec::len), Some(10), "{decoder}");
    assert!(decoder["speed"][0]["longrank_pairs_per_s"].as_f64().unwrap() > 0.0, "{decoder}");
    assert!(parts["long"]["speed"][0]["longrank_f32_pairs_per_s"].as_f64().unwrap() > 0.0, "{summary}");
    let files = walk(&out);
    assert!(files.len() <= 8, "at most 8 files come back from the device: {files:?}");
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}
