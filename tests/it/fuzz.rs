//! The fuzzing corpora replayed: every input cargo-fuzz kept (`fuzz/corpus/TARGET/`) and every crash found
//! and fixed (`fuzz/regressions/TARGET/`) goes through its parser again, in seconds and without a sanitizer
//! build. A parser that panics again on one of them fails here.

#[path = "../../fuzz/src/lib.rs"]
mod entries;

use std::path::Path;

fn inputs(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_file()).collect())
        .unwrap_or_default();
    files.sort();
    files
}

#[test]
fn every_kept_and_crashing_input_parses_without_panic() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    for (name, parse) in entries::TARGETS {
        assert!(root.join("fuzz_targets").join(format!("{name}.rs")).is_file(), "no cargo-fuzz target {name}");
        let corpus = inputs(&root.join("corpus").join(name));
        assert!(!corpus.is_empty(), "the {name} corpus is empty: run `cargo +nightly fuzz run {name}` and keep it");
        for file in corpus.iter().chain(&inputs(&root.join("regressions").join(name))) {
            let data = std::fs::read(file).unwrap();
            if std::panic::catch_unwind(|| parse(&data)).is_err() {
                panic!("{name}: {} panics its parser", file.display());
            }
        }
    }
}
