//! The images' build, checked without a Docker engine: the context `.dockerignore` lets through holds what each
//! Dockerfile copies and nothing built, the binary is stripped, and every documented `docker run` gives the server an admin key (in a
//! container it listens beyond loopback, where a keyless server serves reads only).

use std::path::Path;

fn read(name: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(name)).unwrap()
}

#[test]
fn the_build_context_holds_what_the_images_copy_and_runs_have_an_admin_key() {
    let ignore = read(".dockerignore");
    let rules: Vec<&str> = ignore.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    assert_eq!(rules[0], "*", "everything out first, then what the images copy");
    let allowed: Vec<&str> =
        rules[1..].iter().map(|r| r.strip_prefix('!').expect("after `*`, only exceptions")).collect();
    for dockerfile in ["Dockerfile", "Dockerfile.cuda"] {
        let text = read(dockerfile);
        let copies = text.lines().filter(|l| l.starts_with("COPY ") && !l.contains("--from"));
        for line in copies {
            let words: Vec<&str> = line.split_whitespace().collect();
            for source in &words[1..words.len() - 1] {
                let source = source.trim_end_matches('/');
                assert!(allowed.contains(&source), "{dockerfile} copies {source}, which .dockerignore keeps out");
                assert!(Path::new(env!("CARGO_MANIFEST_DIR")).join(source).exists(), "{source}");
            }
        }
        // The binary an image carries is stripped where it is built (the release profile keeps line tables).
        let built = text.find("cargo build --release").expect("a release build");
        let stripped = text.find("strip --strip-all target/release/longrank");
        assert!(stripped.is_some_and(|at| at > built), "{dockerfile} copies an unstripped binary");
        let runs: Vec<&str> = text.lines().filter(|l| l.contains("docker run")).collect();
        assert!(!runs.is_empty() && runs.iter().all(|l| l.contains("LONGRANK_SERVER_ADMIN_KEYS")), "{dockerfile}");
    }
    assert!(allowed.iter().all(|a| !["target", "data", ".git"].contains(a)), "{allowed:?}");
    let readme = read("docs/operations.md");
    let runs: Vec<&str> = readme.lines().filter(|l| l.trim_start().starts_with("docker run")).collect();
    assert!(!runs.is_empty() && runs.iter().all(|l| l.contains("LONGRANK_SERVER_ADMIN_KEYS")), "{runs:?}");
}
