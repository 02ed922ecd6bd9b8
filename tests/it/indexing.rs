//! `longrank index`: error reporting, duplicates, incremental updates, --replace, and crash safety.

use std::path::Path;
use std::time::{Duration, Instant};

use longrank::index::Catalog;

use crate::common::{cli, cli_ok};
use crate::fixtures::{synthetic_trec_collection, trec_doc};

fn count(data_dir: &Path, collection: &str) -> u64 {
    let (catalog, failures) = Catalog::open(data_dir).unwrap();
    assert!(failures.is_empty(), "{failures:?}");
    catalog.get(collection).unwrap().num_docs()
}

#[test]
fn malformed_documents_are_reported_with_file_and_offset_then_skipped_or_abort() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.trec");
    let good = trec_doc("OK-1", "fine text");
    let bad = "<DOC>\n<TEXT>\nno docno here\n</TEXT>\n</DOC>\n";
    // An empty document (whitespace alone) is left out and counted apart, as Anserini does, under abort too.
    let empty = trec_doc("EMPTY-1", " \n\t ");
    // A document in Latin-1 (not UTF-8, no encoding named) is read as windows-1252 and counted.
    let latin = trec_doc("OK-2", "caf@").into_bytes().into_iter().map(|b| if b == b'@' { 0xe9 } else { b });
    let bytes: Vec<u8> = format!("{good}{empty}{bad}").into_bytes().into_iter().chain(latin).collect();
    std::fs::write(&file, bytes).unwrap();
    let path = file.to_str().unwrap();

    let out = cli(dir.path(), &["index", "--collection", "c", "--on-error", "abort", path]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let at = format!("{path} at byte {}: no <DOCNO>", good.len() + empty.len());
    assert!(stderr.contains(&at), "{stderr}");
    // A first build that aborts leaves no collection behind, empty or partial.
    let (catalog, _) = Catalog::open(dir.path()).unwrap();
    assert!(catalog.names().is_empty(), "{:?}", catalog.names());
    assert!(!dir.path().join("collections/c").exists());

    let out = cli_ok(dir.path(), &["index", "--collection", "c", path]);
    assert!(
        out.contains(
            "indexed 2 documents, skipped 1 document and 0 files, 1 empty, 1 read as windows-1252, duplicates 0"
        ),
        "{out}"
    );
    let search = cli_ok(dir.path(), &["search", "--collection", "c", "café"]);
    assert!(search.contains("OK-2"), "{search}");
    // A small collection's size in the unit that shows it (it read "0.0" in megabytes).
    let list = cli_ok(dir.path(), &["collections"]);
    let row = list.lines().nth(1).unwrap();
    assert!(row.contains(" kB ") && !row.contains(" 0.0 "), "{list}");
    assert_eq!(count(dir.path(), "c"), 2);
}

/// A directory walked for documents that also holds the experiment's topics and qrels: those are reported as
/// skipped files (not documents), counted apart from skipped documents, under `--on-error abort` too.
#[test]
fn topics_and_qrels_beside_the_documents_are_skipped_files() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("robust");
    std::fs::create_dir(&input).unwrap();
    std::fs::write(input.join("docs.trec"), format!("{}{}", trec_doc("D1", "apples"), trec_doc("D2", "pears")))
        .unwrap();
    std::fs::write(input.join("topics.txt"), "<top>\n<num> Number: 301\n<title> apples\n</top>\n").unwrap();
    std::fs::write(input.join("qrels.txt"), "301 0 D1 1\n301 0 D2 0\n").unwrap();
    std::fs::write(input.join("bm25.run"), "301 Q0 D1 1 3.5 bm25\n301 Q0 D2 2 1.25 bm25\n").unwrap();
    let out = cli(dir.path(), &["index", "--collection", "c", "--on-error", "abort", input.to_str().unwrap()]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("indexed 2 documents, skipped 0 documents and 3 files"), "{stdout}");
    for (file, what) in [("topics.txt", "a topic file"), ("qrels.txt", "qrels"), ("bm25.run", "a TREC run")] {
        let line = format!("skipped file {}: {what}, not documents", input.join(file).display());
        assert!(stderr.contains(&line), "{line} in {stderr}");
    }
    assert_eq!(count(dir.path(), "c"), 2);
}

/// Work on a snapshot stops once its request is gone or past its deadline: BM25 and RM3 answer `Cancelled`
/// instead of running on (a request's timeout stops its first stage too).
#[test]
fn cancelled_searches_stop() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a.trec");
    std::fs::write(&file, (0..50).map(|i| trec_doc(&format!("d{i}"), "apples and pears")).collect::<String>()).unwrap();
    cli_ok(dir.path(), &["index", "--collection", "c", file.to_str().unwrap()]);
    let (catalog, _) = Catalog::open(dir.path()).unwrap();
    let collection = catalog.get("c").unwrap();
    let params = longrank::index::Bm25Params::default();
    assert_eq!(collection.snapshot().search("apples", 5, params).unwrap().len(), 5);
    let gone = longrank::cancel::Cancel::default();
    gone.cancel();
    let past = longrank::cancel::Cancel::until(Instant::now() - Duration::from_millis(1));
    for cancel in [gone, past] {
        let snapshot = collection.snapshot().cancellable(&cancel);
        let stopped = |e: longrank::index::IndexError| matches!(e, longrank::index::IndexError::Cancelled);
        assert!(stopped(snapshot.search("apples", 5, params).unwrap_err()));
        assert!(stopped(snapshot.search_rm3("apples", 5, params, Default::default()).map(|e| e.hits).unwrap_err()));
    }
}

/// Documents tied at rank k make the cut by docid, so two builds of one collection (documents added in another
/// order) rank alike.
#[test]
fn ties_at_rank_k_go_to_the_smaller_docid_whatever_the_build_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut rankings = Vec::new();
    for (name, order) in [("a", ["d3", "d1", "d5", "d2", "d4"]), ("b", ["d4", "d5", "d2", "d1", "d3"])] {
        let file = dir.path().join(format!("{name}.trec"));
        std::fs::write(&file, order.iter().map(|id| trec_doc(id, "apples and pears")).collect::<String>()).unwrap();
        cli_ok(dir.path(), &["index", "--collection", name, file.to_str().unwrap()]);
        let out = cli_ok(dir.path(), &["search", "--collection", name, "-k", "2", "apples"]);
        let docids: Vec<String> =
            out.lines().skip(1).map(|l| l.split_whitespace().nth(2).unwrap().to_string()).collect();
        rankings.push(docids);
    }
    assert_eq!(rankings[0], ["d1", "d2"]);
    assert_eq!(rankings[1], ["d1", "d2"]);
}

#[test]
fn duplicates_are_reported_and_reruns_add_and_replace() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.trec");
    std::fs::write(&a, format!("{}{}{}", trec_doc("D1", "apples"), trec_doc("D2", "pears"), trec_doc("D1", "plums")))
        .unwrap();
    let out = cli_ok(dir.path(), &["index", "--collection", "c", a.to_str().unwrap()]);
    assert!(
        out.contains(
            "indexed 3 documents, skipped 0 documents and 0 files, 0 empty, 0 read as windows-1252, duplicates 1"
        ),
        "{out}"
    );
    assert!(out.contains("2 documents in the collection"), "{out}");
    // The later D1 won.
    let search = cli_ok(dir.path(), &["search", "--collection", "c", "plums"]);
    assert!(search.contains("D1"), "{search}");
    let search = cli_ok(dir.path(), &["search", "--collection", "c", "apples"]);
    assert!(!search.contains("D1"), "{search}");

    // A second file: D2 replaced, D3 added.
    let b = dir.path().join("b.trec");
    std::fs::write(&b, format!("{}{}", trec_doc("D2", "cherries"), trec_doc("D3", "grapes"))).unwrap();
    let out = cli_ok(dir.path(), &["index", "--collection", "c", b.to_str().unwrap()]);
    assert!(out.contains("3 documents in the collection"), "{out}");
    assert!(cli_ok(dir.path(), &["search", "--collection", "c", "cherries"]).contains("D2"));
    assert!(!cli_ok(dir.path(), &["search", "--collection", "c", "pears"]).contains("D2"));

    // --replace rebuilds from only what is given.
    let out = cli_ok(dir.path(), &["index", "--collection", "c", "--replace", b.to_str().unwrap()]);
    assert!(out.contains("2 documents in the collection"), "{out}");
    assert!(!cli_ok(dir.path(), &["search", "--collection", "c", "plums"]).contains("D1"));
}

/// A re-run over files already indexed commits nothing: meta.json is not rewritten (tantivy orders segments
/// of equal size as its hash map does, so a rewrite could change its bytes and the collection's fingerprint).
#[test]
fn a_rerun_with_nothing_new_leaves_the_commit_as_it_was() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.trec");
    std::fs::write(&a, format!("{}{}", trec_doc("D1", "apples"), trec_doc("D2", "pears"))).unwrap();
    cli_ok(dir.path(), &["index", "--collection", "c", a.to_str().unwrap()]);
    let meta = dir.path().join("collections/c/meta.json");
    let before = (std::fs::metadata(&meta).unwrap().ino(), std::fs::read(&meta).unwrap());
    let out = cli_ok(dir.path(), &["index", "--collection", "c", a.to_str().unwrap()]);
    assert!(out.contains("indexed 0 documents") && out.contains("1 files already indexed"), "{out}");
    let after = (std::fs::metadata(&meta).unwrap().ino(), std::fs::read(&meta).unwrap());
    assert!(before == after, "meta.json was rewritten by a run that added nothing");
}

#[test]
fn killed_build_leaves_a_usable_index_and_a_rerun_completes() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input");
    std::fs::create_dir(&input).unwrap();
    let (files, per_file) = (40, 5_000);
    synthetic_trec_collection(&input, files, per_file);
    let data_dir = dir.path().join("data");
    std::fs::create_dir(&data_dir).unwrap();

    // A first, committed state.
    cli_ok(&data_dir, &["index", "--collection", "c", input.join("part000.trec").to_str().unwrap()]);
    assert_eq!(count(&data_dir, "c"), per_file as u64);

    // Kill -9 a full build after its first commit (every 10,000 documents), where a test hook holds it: the kill
    // lands mid-build, whatever the machine's speed.
    let mut child = crate::common::spawn_cli(
        &data_dir,
        &["index", "--collection", "c", input.to_str().unwrap()],
        &[("LONGRANK_INDEX_COMMIT_EVERY", "10000"), ("LONGRANK_TEST_HOLD", "index.commit:1")],
    );
    let meta = data_dir.join("collections/c/meta.json");
    let first_meta = std::fs::read_to_string(&meta).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while std::fs::read_to_string(&meta).unwrap() == first_meta && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(child.try_wait().unwrap().is_none(), "the build ended before its first commit was seen");
    child.kill().unwrap(); // SIGKILL
    assert!(!child.wait().unwrap().success());

    // Whatever was committed opens and searches.
    let partial = count(&data_dir, "c");
    assert!(partial >= per_file as u64, "{partial}");
    cli_ok(&data_dir, &["search", "--collection", "c", "glacier canyon"]);

    // Re-running completes the collection, skipping the files already committed.
    let out = cli_ok(&data_dir, &["index", "--collection", "c", input.to_str().unwrap()]);
    assert_eq!(count(&data_dir, "c"), (files * per_file) as u64, "{out}");
    // part000 from the first state, plus at least part001 from the killed run's first commit.
    let resumed: usize =
        out.split(" files already indexed").next().unwrap().rsplit(' ').next().unwrap().parse().unwrap();
    assert!(resumed >= 2, "nothing was resumed: {out}");
    assert!(partial < (files * per_file) as u64, "the killed build was complete: {partial}");
}

#[test]
fn interrupted_replace_keeps_the_old_index() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.trec");
    std::fs::write(&a, trec_doc("OLD", "old text")).unwrap();
    cli_ok(dir.path(), &["index", "--collection", "c", a.to_str().unwrap()]);
    // Simulate a crash between the two renames of a swap: the old index sits aside, nothing in place.
    let root = dir.path().join("collections");
    std::fs::rename(root.join("c"), root.join(".c.old")).unwrap();
    assert_eq!(count(dir.path(), "c"), 1);
    assert!(!root.join(".c.old").exists());
}

/// Searches racing a reindex loop on the same collection: every hit's title, snippet and best segment belong to
/// its docid, and no request fails, whatever commits (replacements, merges) land while a request runs. Each
/// request reads one snapshot of the collection.
#[test]
fn searches_while_indexing_see_each_document_whole() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = d.join("model");
    crate::fixtures::tiny_cross_encoder(&model, 7);
    // Every sentence names its document, so any text fetched for a docid shows whose it is.
    let write = |path: &Path, round: usize, range: std::ops::Range<usize>| {
        let docs: String = range
            .map(|i| {
                let words = ["harbor", "lantern", "copper", "meadow"][(i + round) % 4];
                let text =
                    format!("The {words} report of doc{i}. Round {round} of doc{i}. Notes on {words} for doc{i}.");
                format!(
                    "{}\n",
                    serde_json::json!({"docid": format!("doc{i}"), "title": format!("title of doc{i}"), "text": text})
                )
            })
            .collect();
        std::fs::write(path, docs).unwrap();
    };
    let first = d.join("all.jsonl");
    write(&first, 0, 0..1500);
    cli_ok(d, &["index", "--collection", "live", first.to_str().unwrap()]);
    let server = crate::common::TestServer::start(d, &[("LONGRANK_MODEL_PATH", model.to_str().unwrap())]).wait_ready();

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (url, stop) = (server.url("/search"), stop.clone());
            std::thread::spawn(move || {
                let (mut requests, mut checked) = (0, 0);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let body = if c == 3 {
                        serde_json::json!({"query": "harbor lantern report", "k": 10, "depth": 10, "pipeline": "maxp"})
                    } else {
                        serde_json::json!({"query": "harbor lantern copper meadow report", "k": 1000})
                    };
                    let reply = crate::common::post_json(&url, &body.to_string());
                    assert_eq!(reply.status, 200, "{}", reply.body);
                    for hit in reply.json()["results"].as_array().unwrap() {
                        let docid = hit["docid"].as_str().unwrap();
                        assert_eq!(hit["title"], format!("title of {docid}"), "{hit}");
                        let shown = hit.get("best_segment").map_or(&hit["snippet"], |b| &b["text"]);
                        assert!(shown.as_str().unwrap().contains(&format!("{docid}.")), "{docid}: {shown}");
                        checked += 1;
                    }
                    requests += 1;
                }
                (requests, checked)
            })
        })
        .collect();
    // Rounds of replacements, each committed while the searches run: small ones, so that segments pile up and
    // merge, and documents move.
    for round in 1..=40 {
        let part = d.join(format!("round{round}.jsonl"));
        let start = (round * 100) % 1500;
        write(&part, round, start..start + 100);
        cli_ok(d, &["index", "--collection", "live", part.to_str().unwrap()]);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut requests, mut checked) = (0, 0);
    for client in clients {
        let (r, c) = client.join().expect("a search saw another document's text or failed");
        (requests, checked) = (requests + r, checked + c);
    }
    assert!(requests >= 40 && checked >= 10_000, "{requests} requests, {checked} hits checked");
}

/// A running server follows what the CLI does to its data directory, without a restart: a collection built
/// appears, one rebuilt with `--replace` serves its new documents, one deleted goes.
#[test]
fn the_server_follows_collections_the_cli_builds_replaces_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let write = |name: &str, docs: &[(&str, &str)]| {
        let lines: String = docs
            .iter()
            .map(|(id, text)| format!("{}\n", serde_json::json!({"id": id, "title": "", "text": text})))
            .collect();
        std::fs::write(d.join(name), lines).unwrap();
        d.join(name).to_str().unwrap().to_string()
    };
    cli_ok(d, &["index", "--collection", "first", &write("first.jsonl", &[("f1", "first collection")])]);
    let server = crate::common::TestServer::start(d, &[("LONGRANK_SERVER_CATALOG_POLL_MS", "100")]).wait_ready();
    let collections = || -> Vec<(String, u64)> {
        let (_, body) = crate::common::get(&server.url("/collections"));
        let listed: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
        listed.iter().map(|c| (c["name"].as_str().unwrap().to_string(), c["documents"].as_u64().unwrap())).collect()
    };
    // Until the listing (name, documents) satisfies `done`.
    type Listing = [(String, u64)];
    let wait_for = |what: &str, done: &dyn Fn(&Listing) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let seen = collections();
            if done(&seen) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: /collections still says {seen:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let search = |query: &str| {
        let body = serde_json::json!({"query": query, "collection": "extra", "k": 10});
        crate::common::post_json(&server.url("/search"), &body.to_string())
    };
    let docids = |reply: crate::common::Reply| -> Vec<String> {
        assert_eq!(reply.status, 200, "{}", reply.body);
        reply.json()["results"].as_array().unwrap().iter().map(|h| h["docid"].as_str().unwrap().to_string()).collect()
    };

    let old = write("old.jsonl", &[("a1", "alpha bravo"), ("a2", "alpha delta")]);
    cli_ok(d, &["index", "--collection", "extra", &old]);
    wait_for("built", &|seen| seen.contains(&("extra".into(), 2)));
    assert_eq!(docids(search("alpha")), ["a1", "a2"]);

    let new = write("new.jsonl", &[("b1", "charlie echo"), ("b2", "charlie fox"), ("b3", "charlie golf")]);
    cli_ok(d, &["index", "--collection", "extra", "--replace", &new]);
    wait_for("replaced", &|seen| seen.contains(&("extra".into(), 3)));
    assert_eq!(docids(search("charlie")), ["b1", "b2", "b3"]);
    assert!(docids(search("alpha")).is_empty(), "the replaced documents are gone");

    cli_ok(d, &["collections", "delete", "extra"]);
    wait_for("deleted", &|seen| seen.iter().all(|(name, _)| name != "extra"));
    search("charlie").assert_error(404, "unknown_collection");
    assert_eq!(collections(), [("first".to_string(), 1)], "the other collection stays");
}

/// One writer per collection across processes: while another holds a collection's lock (a running `index`),
/// `index --replace` and `collections delete` are refused with the reason, and the other's staging directory
/// is left alone; once it is done, they run.
#[test]
fn a_second_writer_of_a_collection_is_refused_and_touches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let docs = d.join("docs.jsonl");
    std::fs::write(&docs, "{\"id\": \"a\", \"text\": \"alpha\"}\n").unwrap();
    let docs = docs.to_str().unwrap();
    cli_ok(d, &["index", "--collection", "busy", docs]);
    // What a running `index --replace` holds: the lock, and its staging directory.
    let staging = d.join("collections/.busy.building");
    std::fs::create_dir_all(&staging).unwrap();
    std::fs::write(staging.join("marker"), "the other writer's work").unwrap();
    let lock = std::fs::File::options().write(true).open(d.join("collections/.busy.lock")).unwrap();
    lock.lock().unwrap();
    for args in [&["index", "--collection", "busy", "--replace", docs][..], &["collections", "delete", "busy"]] {
        let out = cli(d, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains("\"busy\" is being written by another process"), "{stderr}");
    }
    assert!(staging.join("marker").exists(), "the other writer's staging directory is untouched");
    assert_eq!(count(d, "busy"), 1);
    lock.unlock().unwrap();
    cli_ok(d, &["index", "--collection", "busy", "--replace", docs]);
    cli_ok(d, &["collections", "delete", "busy"]);
}
