//! Collections written over HTTP (issue 24): tasks that create, feed, update and delete collections, applied
//! in order, searchable once `succeeded`, and kept across a kill -9.

use std::path::Path;

use serde_json::{json, Value};

use crate::common::{get, post_json, request, Reply, TestServer};

fn start(dir: &Path, env: &[(&str, &str)]) -> TestServer {
    let env = [&[("LONGRANK_SERVER_DEMO_WHEN_EMPTY", "false")][..], env].concat();
    TestServer::start(dir, &env).wait_ready()
}

fn send(server: &TestServer, method: &str, path: &str, content_type: &str, body: Option<&str>) -> Reply {
    request(method, &server.url(path), &[("content-type", content_type)], body)
}

/// A task answer: 200 with the task when it has finished (waited for), else 202 with it and `Location`.
fn task(reply: Reply) -> Value {
    let view = reply.json();
    match view["status"].as_str() {
        Some("succeeded" | "failed" | "cancelled") => assert_eq!(reply.status, 200, "{}", reply.body),
        _ => {
            assert_eq!(reply.status, 202, "{}", reply.body);
            assert_eq!(reply.header("location"), Some(format!("/tasks/{}", view["id"]).as_str()));
        }
    }
    view
}

fn docids(server: &TestServer, collection: &str, query: &str) -> Vec<String> {
    let body = json!({"query": query, "collection": collection, "k": 100});
    let reply = post_json(&server.url("/search"), &body.to_string());
    assert_eq!(reply.status, 200, "{}", reply.body);
    let mut ids: Vec<String> =
        reply.json()["results"].as_array().unwrap().iter().map(|h| h["docid"].as_str().unwrap().to_string()).collect();
    ids.sort();
    ids
}

fn collections(server: &TestServer) -> Vec<(String, u64)> {
    let (_, body) = get(&server.url("/collections"));
    let listed: Vec<Value> = serde_json::from_str(&body).unwrap();
    listed.iter().map(|c| (c["name"].as_str().unwrap().to_string(), c["documents"].as_u64().unwrap())).collect()
}

#[test]
fn collections_are_created_fed_updated_and_deleted_over_http_by_tasks_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let server =
        start(dir.path(), &[("LONGRANK_SERVER_MAX_BODY_BYTES", "2000"), ("LONGRANK_LIMITS_MAX_UPLOAD_BYTES", "20000")]);

    let created = task(send(&server, "PUT", "/collections/news?wait=true", "application/json", None));
    assert_eq!((created["kind"].as_str(), created["status"].as_str()), (Some("create_collection"), Some("succeeded")));
    assert_eq!(collections(&server), [("news".to_string(), 0)]);
    for bad in ["/collections/.hidden", "/collections/a%20b"] {
        send(&server, "PUT", bad, "application/json", None).assert_error(400, "invalid_collection_name");
    }

    // JSON lines, one of them malformed: reported with its line and skipped; one empty (whitespace alone): left
    // out with its docid, as Anserini leaves empty documents out, so that no model scores an empty segment.
    let lines = "{\"id\": \"d1\", \"text\": \"harbor lantern\"}\n{\"id\": \"d2\", \"text\": \"copper meadow\"}\n\
                 not json\n{\"id\": \"d3\", \"text\": \"harbor copper\"}\n{\"id\": \"d0\", \"text\": \" \\n \"}\n";
    let added =
        task(send(&server, "POST", "/collections/news/documents?wait=true", "application/x-ndjson", Some(lines)));
    assert_eq!(added["status"], "succeeded", "{added}");
    assert_eq!(added["documents"], json!({"read": 5, "indexed": 3, "skipped": 2, "deleted": 0}), "{added}");
    let problem = &added["errors"][0];
    assert_eq!((&problem["file"], &problem["line"], &problem["offset"]), (&json!("upload"), &json!(3), &json!(77)));
    assert!(problem["message"].as_str().unwrap().contains("invalid JSON"), "{problem}");
    let empty = &added["errors"][1];
    assert_eq!((&empty["file"], &empty["docid"]), (&json!("upload"), &json!("d0")), "{added}");
    assert!(empty["message"].as_str().unwrap().starts_with("empty document"), "{empty}");
    send(&server, "GET", "/documents/d0?collection=news", "application/json", None)
        .assert_error(404, "unknown_document");
    assert_eq!(docids(&server, "news", "harbor"), ["d1", "d3"], "searchable once succeeded");

    // A JSON array, replacing d2 (same docid) and adding d4; then a TREC SGML file, its format detected.
    let array = json!([{"id": "d2", "text": "lantern festival"}, {"id": "d4", "title": "t", "text": "meadow"}]);
    let added = task(send(
        &server,
        "POST",
        "/collections/news/documents?wait=true",
        "application/json",
        Some(&array.to_string()),
    ));
    assert_eq!(added["documents"]["indexed"], 2, "{added}");
    let trec = "<DOC>\n<DOCNO> d5 </DOCNO>\n<TEXT>\nharbor pilots\n</TEXT>\n</DOC>\n";
    let added = task(send(&server, "POST", "/collections/news/documents?wait=true", "text/plain", Some(trec)));
    assert_eq!(added["documents"]["indexed"], 1, "{added}");
    // Gzipped (known by its bytes), TSV (known by its content), in Latin-1: read as windows-1252, and the task
    // says so.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, b"d8\tgzipped tab separated pilots caf\xe9\n").unwrap();
    let reply = ureq::post(&server.url("/collections/news/documents?wait=true"))
        .set("content-type", "application/gzip")
        .send_bytes(&gz.finish().unwrap())
        .unwrap();
    let added: Value = serde_json::from_str(&reply.into_string().unwrap()).unwrap();
    assert_eq!(added["documents"]["indexed"], 1, "{added}");
    assert_eq!(added["errors"][0]["docid"], "d8", "{added}");
    assert!(added["errors"][0]["message"].as_str().unwrap().ends_with("read as windows-1252"), "{added}");
    assert_eq!(docids(&server, "news", "pilots"), ["d5", "d8"]);
    assert_eq!(docids(&server, "news", "café"), ["d8"]);
    assert_eq!(docids(&server, "news", "copper"), ["d3"], "d2's old text is gone");
    assert_eq!(docids(&server, "news", "lantern"), ["d1", "d2"]);
    let (_, document) = get(&server.url("/documents/d2?collection=news"));
    assert_eq!(serde_json::from_str::<Value>(&document).unwrap()["text"], "lantern festival");

    // With on_error=abort, a malformed document fails the task, and nothing of its upload is applied.
    let bad = "{\"id\": \"d7\", \"text\": \"harbor seven\"}\n{broken\n";
    let failed = task(send(
        &server,
        "POST",
        "/collections/news/documents?wait=true&on_error=abort",
        "application/x-ndjson",
        Some(bad),
    ));
    assert_eq!(failed["status"], "failed", "{failed}");
    assert!(failed["error"].as_str().unwrap().contains("upload line 2"), "{failed}");
    assert!(!docids(&server, "news", "harbor").contains(&"d7".to_string()));

    // Tasks apply in the order accepted: the later text of d6 wins.
    let first = task(send(
        &server,
        "POST",
        "/collections/news/documents",
        "application/x-ndjson",
        Some("{\"id\": \"d6\", \"text\": \"first version\"}\n"),
    ));
    let second = task(send(
        &server,
        "POST",
        "/collections/news/documents",
        "application/x-ndjson",
        Some("{\"id\": \"d6\", \"text\": \"second version\"}\n"),
    ));
    assert!(second["id"].as_i64() > first["id"].as_i64());
    wait_succeeded(&server, second["id"].as_i64().unwrap());
    let (_, document) = get(&server.url("/documents/d6?collection=news"));
    assert_eq!(serde_json::from_str::<Value>(&document).unwrap()["text"], "second version");

    // Deletions: one docid, then several (those held are counted).
    let deleted = task(send(&server, "DELETE", "/collections/news/documents/d1?wait=true", "application/json", None));
    assert_eq!(deleted["documents"]["deleted"], 1, "{deleted}");
    let body = json!({"ids": ["d3", "nope"]}).to_string();
    let deleted =
        task(send(&server, "POST", "/collections/news/documents/delete?wait=true", "application/json", Some(&body)));
    assert_eq!(deleted["documents"]["deleted"], 1, "{deleted}");
    assert_eq!(docids(&server, "news", "harbor"), ["d5"]);
    assert_eq!(collections(&server), [("news".to_string(), 5)]);

    // An upload larger than max_body_bytes is taken (uploads have their own limit); one over that is refused
    // whole, announced or not.
    let big: String =
        (0..100).map(|i| format!("{{\"id\": \"b{i}\", \"text\": \"bulk document number {i}\"}}\n")).collect();
    assert!(big.len() > 2000 && big.len() < 20000);
    let added =
        task(send(&server, "POST", "/collections/news/documents?wait=true", "application/x-ndjson", Some(&big)));
    assert_eq!(added["documents"]["indexed"], 100, "{added}");
    // Over the upload limit: refused at once when announced; when chunked, once the bytes pass it. (Raw
    // requests, so that no unread body makes the server's answer a reset.)
    let announced = raw_request(&server, "Content-Length: 1000000\r\n", b"");
    assert!(announced.starts_with("HTTP/1.1 413") && announced.contains("upload_too_large"), "{announced}");
    let over = vec![b'x'; 20001];
    let chunk = [format!("{:x}\r\n", over.len()).into_bytes(), over, b"\r\n".to_vec()].concat();
    let chunked = raw_request(&server, "Transfer-Encoding: chunked\r\n", &chunk);
    assert!(chunked.starts_with("HTTP/1.1 413") && chunked.contains("upload_too_large"), "{chunked}");
    let uploads: Vec<_> = std::fs::read_dir(dir.path().join("uploads")).unwrap().collect();
    assert!(uploads.is_empty(), "nothing of a refused or applied upload stays: {uploads:?}");

    // The list, newest first, a page at a time; one task; an unknown one.
    let (_, listed) = get(&server.url("/tasks?collection=news&limit=3"));
    let listed: Vec<Value> = serde_json::from_str(&listed).unwrap();
    let ids: Vec<i64> = listed.iter().map(|t| t["id"].as_i64().unwrap()).collect();
    assert!(ids.len() == 3 && ids.windows(2).all(|w| w[0] > w[1]), "{ids:?}");
    let (_, page) = get(&server.url(&format!("/tasks?collection=news&limit=3&cursor={}", ids[2])));
    let page: Vec<Value> = serde_json::from_str(&page).unwrap();
    assert!(page.iter().all(|t| t["id"].as_i64().unwrap() < ids[2]) && page.len() == 3, "{page:?}");
    let (status, _) = get(&server.url("/tasks/999999"));
    assert_eq!(status, 404);
    send(&server, "DELETE", &format!("/tasks/{}", ids[0]), "application/json", None).assert_error(409, "task_conflict");

    let deleted = task(send(&server, "DELETE", "/collections/news?wait=true", "application/json", None));
    assert_eq!(deleted["status"], "succeeded", "{deleted}");
    assert!(collections(&server).is_empty());
}

/// An upload to `news` as raw HTTP: the head with `headers`, then `body`; the answer as text.
fn raw_request(server: &TestServer, headers: &str, body: &[u8]) -> String {
    use std::io::{Read, Write};
    let addr = server.url("").trim_start_matches("http://").to_string();
    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    let head = format!(
        "POST /collections/news/documents HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-ndjson\r\n\
         Connection: close\r\n{headers}\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

fn wait_succeeded(server: &TestServer, id: i64) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (status, body) = get(&server.url(&format!("/tasks/{id}")));
        assert_eq!(status, 200, "{body}");
        let view: Value = serde_json::from_str(&body).unwrap();
        match view["status"].as_str().unwrap() {
            "succeeded" => return view,
            "queued" | "running" => {}
            other => panic!("task {id} is {other}: {view}"),
        }
        assert!(std::time::Instant::now() < deadline, "task {id} still {view}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// kill -9 after the 202 loses nothing: the tasks queued are applied at the next start, a cancelled one stays
/// cancelled, and one running that was asked to stop ends cancelled; until then the collection serves its last
/// commit. (A running task killed without a cancel runs again: the next test.)
#[test]
fn accepted_uploads_survive_kill_9_and_apply_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let upload = |server: &TestServer, id: &str, text: &str| {
        let line = format!("{}\n", json!({"id": id, "text": text}));
        task(send(server, "POST", "/collections/live/documents", "application/x-ndjson", Some(&line)))
    };
    {
        let server = start(dir.path(), &[]);
        task(send(
            &server,
            "POST",
            "/collections/live/documents?wait=true",
            "application/x-ndjson",
            Some("{\"id\": \"old\", \"text\": \"harbor\"}\n"),
        ));
    }
    // The worker holds at the start of its first task, as if the process were busy with it.
    let mut server = start(dir.path(), &[("LONGRANK_TEST_HOLD", "task.start:1")]);
    let running = upload(&server, "a", "harbor lantern");
    let queued = upload(&server, "b", "harbor meadow");
    let cancelled = upload(&server, "c", "harbor copper");
    let id = |t: &Value| t["id"].as_i64().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while get(&server.url(&format!("/tasks/{}", id(&running)))).1.contains("\"queued\"") {
        assert!(std::time::Instant::now() < deadline, "the first task never started");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // The running task is asked to stop: it is held before it writes, so it never does, even across the kill.
    let stopping = send(&server, "DELETE", &format!("/tasks/{}", id(&running)), "application/json", None);
    assert_eq!(stopping.json()["status"], "running", "{}", stopping.body);
    let view = send(&server, "DELETE", &format!("/tasks/{}", id(&cancelled)), "application/json", None);
    assert_eq!(view.json()["status"], "cancelled", "{}", view.body);
    assert_eq!(docids(&server, "live", "harbor"), ["old"], "the last commit serves meanwhile");
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    drop(server);

    let server = start(dir.path(), &[]);
    wait_succeeded(&server, id(&queued));
    assert_eq!(docids(&server, "live", "harbor"), ["b", "old"]);
    for task in [&running, &cancelled] {
        let (_, view) = get(&server.url(&format!("/tasks/{}", id(task))));
        assert!(view.contains("\"cancelled\""), "{view}");
    }
    let uploads: Vec<_> = std::fs::read_dir(dir.path().join("uploads")).unwrap().collect();
    assert!(uploads.is_empty(), "{uploads:?}");
}

/// After a document is replaced or deleted over HTTP, nothing derived from its old text is served: the
/// segments and best passage a re-ranking shows, the scores kept on disk (`store_scores`), the snippet, the
/// stored document, the collection's statistics.
#[test]
fn nothing_derived_from_a_replaced_documents_old_text_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    crate::fixtures::tiny_cross_encoder(&model, 11);
    let env = [("LONGRANK_MODEL_PATH", model.to_str().unwrap()), ("LONGRANK_MODEL_STORE_SCORES", "true")];
    let server = start(dir.path(), &env);
    let upload = |lines: &str| {
        let reply = send(&server, "POST", "/collections/c/documents?wait=true", "application/x-ndjson", Some(lines));
        assert_eq!(task(reply)["status"], "succeeded");
    };
    let old = "Harbor lanterns glow at night. The old harbor keeps its lanterns lit.";
    let new = "Harbor cranes lift copper. Copper crates wait on the harbor quay.";
    let other = "Meadow grass and harbor winds. Nothing else happens in this meadow.";
    upload(&format!("{}\n{}\n", json!({"id": "x", "text": old}), json!({"id": "y", "text": other})));
    let search = |pipeline: &str| {
        let body = json!({"query": "harbor", "collection": "c", "k": 10, "pipeline": pipeline, "segment_text": true});
        let reply = post_json(&server.url("/search"), &body.to_string());
        assert_eq!(reply.status, 200, "{}", reply.body);
        let results = reply.json()["results"].as_array().unwrap().clone();
        results.into_iter().find(|hit| hit["docid"] == "x").expect("x is found").to_string()
    };
    let stats = || {
        let (_, body) = get(&server.url("/collections"));
        serde_json::from_str::<Vec<Value>>(&body).unwrap()[0].clone()
    };
    let (before_maxp, before_bm25, before_stats) = (search("maxp"), search("bm25"), stats());
    assert!(before_maxp.contains("lanterns") && before_bm25.contains("lanterns"), "{before_maxp}");

    upload(&format!("{}\n", json!({"id": "x", "text": new})));
    for hit in [search("maxp"), search("firstp"), search("bm25")] {
        assert!(!hit.contains("lantern") && hit.contains("copper"), "old text served: {hit}");
    }
    let (_, document) = get(&server.url("/documents/x?collection=c"));
    assert_eq!(serde_json::from_str::<Value>(&document).unwrap()["text"], new);
    let reranked = post_json(
        &server.url("/rerank"),
        &json!({"query": "harbor", "docids": ["x"], "collection": "c", "segment_text": true}).to_string(),
    );
    assert!(reranked.body.contains("copper") && !reranked.body.contains("lantern"), "{}", reranked.body);
    let after_stats = stats();
    assert_eq!(after_stats["documents"], before_stats["documents"], "a replacement, not an addition");
    assert_ne!(after_stats["average_length"], before_stats["average_length"], "lengths follow the new text");

    let deleted = send(&server, "DELETE", "/collections/c/documents/x?wait=true", "application/json", None);
    assert_eq!(task(deleted)["documents"]["deleted"], 1);
    let body = json!({"query": "harbor", "collection": "c", "k": 10});
    let found = post_json(&server.url("/search"), &body.to_string()).json();
    let ids: Vec<&str> = found["results"].as_array().unwrap().iter().map(|h| h["docid"].as_str().unwrap()).collect();
    assert_eq!(ids, ["y"]);
    let (status, _) = get(&server.url("/documents/x?collection=c"));
    assert_eq!(status, 404);
    assert_eq!(stats()["documents"], 1);
}

/// kill -9 in the middle of a task's build: the collection serves what the build had committed, and at the next
/// start the task runs again to the end.
#[test]
fn a_task_killed_mid_build_leaves_its_last_commit_then_completes() {
    let dir = tempfile::tempdir().unwrap();
    let docs = |prefix: &str, n: usize| -> String {
        (0..n).map(|i| format!("{}\n", json!({"id": format!("{prefix}{i}"), "text": "harbor pier"}))).collect()
    };
    {
        let server = start(dir.path(), &[]);
        let first =
            send(&server, "POST", "/collections/pier/documents?wait=true", "application/x-ndjson", Some(&docs("a", 5)));
        assert_eq!(task(first)["status"], "succeeded");
    }
    // Commits every 20 documents; the process holds after the first commit, and is killed there.
    let env = [("LONGRANK_INDEX_COMMIT_EVERY", "20"), ("LONGRANK_TEST_HOLD", "index.commit:1")];
    let mut server = start(dir.path(), &env);
    let accepted =
        task(send(&server, "POST", "/collections/pier/documents", "application/x-ndjson", Some(&docs("b", 50))));
    let id = accepted["id"].as_i64().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    // The first commit shows, while the task is held: the collection serves its last commit.
    while collections(&server) != [("pier".to_string(), 25)] {
        assert!(std::time::Instant::now() < deadline, "the build's first commit never showed");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    drop(server);

    // Started again with the worker held before it writes: the collection serves its last commit, the 5
    // documents before and the 20 of the build's first commit.
    let server = start(dir.path(), &[("LONGRANK_TEST_HOLD", "task.start:1")]);
    assert_eq!(collections(&server), [("pier".to_string(), 25)]);
    drop(server);

    let server = start(dir.path(), &[]);
    wait_succeeded(&server, id);
    assert_eq!(collections(&server), [("pier".to_string(), 55)]);
    assert_eq!(docids(&server, "pier", "harbor").len(), 55);
}

/// A running upload asked to stop stops at its next document and ends cancelled; a finished task cannot be.
#[test]
fn a_running_upload_stops_when_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let release = dir.path().join("release");
    let hold = format!("index.commit:1:{}", release.display());
    let server = start(dir.path(), &[("LONGRANK_INDEX_COMMIT_EVERY", "20"), ("LONGRANK_TEST_HOLD", &hold)]);
    let lines: String = (0..50).map(|i| format!("{}\n", json!({"id": format!("d{i}"), "text": "harbor"}))).collect();
    let started = task(send(&server, "POST", "/collections/c/documents", "application/x-ndjson", Some(&lines)));
    let id = started["id"].as_i64().unwrap();
    // Held after its first commit (20 documents, in its staging directory: a first build).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !dir.path().join("collections/.c.building/meta.json").exists() {
        assert!(std::time::Instant::now() < deadline, "the build never committed");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let stopping = send(&server, "DELETE", &format!("/tasks/{id}"), "application/json", None);
    assert_eq!(stopping.json()["status"], "running", "{}", stopping.body);
    std::fs::write(&release, "").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let view = loop {
        let (_, body) = get(&server.url(&format!("/tasks/{id}")));
        let view: Value = serde_json::from_str(&body).unwrap();
        if view["status"] != "running" {
            break view;
        }
        assert!(std::time::Instant::now() < deadline, "{view}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(view["status"], "cancelled", "{view}");
    send(&server, "DELETE", &format!("/tasks/{id}"), "application/json", None).assert_error(409, "task_conflict");
}

/// BM25's document frequency counts a replaced document until a merge (as Lucene's, ARCHITECTURE.md's
/// contract), while N and the lengths follow the live documents: replacing a document with the same text
/// moves another document's score by exactly one extra count of df, or not at all once merged.
#[test]
fn df_counts_a_replaced_document_until_a_merge() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let upload = |lines: &str| {
        let reply = send(&server, "POST", "/collections/c/documents?wait=true", "application/x-ndjson", Some(lines));
        assert_eq!(task(reply)["status"], "succeeded");
    };
    let x = format!("{}\n", json!({"id": "x", "text": "harbor"}));
    upload(&format!("{x}{}\n{}\n", json!({"id": "y", "text": "harbor lantern"}), json!({"id": "z", "text": "meadow"})));
    let score_of_y = || {
        let reply = post_json(&server.url("/search"), &json!({"query": "harbor", "collection": "c"}).to_string());
        let results = reply.json()["results"].as_array().unwrap().clone();
        results.iter().find(|h| h["docid"] == "y").unwrap()["score"].as_f64().unwrap()
    };
    let before = score_of_y();
    upload(&x);
    let after = score_of_y();
    // N = 3 live documents; df of "harbor" 2, then 3 while x's replaced copy is still counted, 2 again once
    // tantivy's background merge (at its discretion) has dropped it. Nothing else moves.
    let idf = |df: f64| (1.0 + (3.0 - df + 0.5) / (df + 0.5)).ln();
    let ratio = after / before;
    let (counted, merged) = ((ratio - idf(3.0) / idf(2.0)).abs() < 1e-5, (ratio - 1.0).abs() < 1e-6);
    assert!(counted || merged, "before {before}, after {after}");
    assert_eq!(collections(&server), [("c".to_string(), 3)]);
}

/// Writers of one collection queue, whoever they are: while another process (a running `longrank index`)
/// holds the collection, its task waits, running; once the other is done, the task applies.
#[test]
fn a_task_waits_for_another_process_writing_the_collection() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let first = send(
        &server,
        "POST",
        "/collections/c/documents?wait=true",
        "application/x-ndjson",
        Some("{\"id\": \"a\", \"text\": \"harbor\"}\n"),
    );
    assert_eq!(task(first)["status"], "succeeded");
    let lock = std::fs::File::options().write(true).open(dir.path().join("collections/.c.lock")).unwrap();
    lock.lock().unwrap();
    let waiting = task(send(
        &server,
        "POST",
        "/collections/c/documents",
        "application/x-ndjson",
        Some("{\"id\": \"b\", \"text\": \"harbor\"}\n"),
    ));
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let (_, view) = get(&server.url(&format!("/tasks/{}", waiting["id"])));
    assert!(view.contains("\"running\""), "{view}");
    assert_eq!(docids(&server, "c", "harbor"), ["a"]);
    lock.unlock().unwrap();
    wait_succeeded(&server, waiting["id"].as_i64().unwrap());
    assert_eq!(docids(&server, "c", "harbor"), ["a", "b"]);
}

/// `?wait=true` answers 200 with a task that finished in time, and 202 with the task as it is and where to follow
/// it when it did not finish within most of the request timeout (never a 503 that loses it).
#[test]
fn waiting_for_a_task_past_the_timeout_answers_202_and_where_to_follow_it() {
    let dir = tempfile::tempdir().unwrap();
    let release = dir.path().join("release");
    let hold = format!("task.start:1:{}", release.display());
    let server = start(dir.path(), &[("LONGRANK_SERVER_REQUEST_TIMEOUT_MS", "1500"), ("LONGRANK_TEST_HOLD", &hold)]);
    let held = send(&server, "PUT", "/collections/c?wait=true", "application/json", None);
    assert_eq!(held.status, 202, "{}", held.body);
    let view = task(held);
    assert_eq!(view["status"], "running", "{view}");
    std::fs::write(&release, "").unwrap();
    wait_succeeded(&server, view["id"].as_i64().unwrap());
    let again = send(&server, "PUT", "/collections/d?wait=true", "application/json", None);
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(task(again)["status"], "succeeded");
}

/// An upload with nothing to index fails and says why, rather than succeeding with nothing said: an empty body,
/// and a file of another kind (a topic file) set aside by format detection.
#[test]
fn an_upload_without_documents_fails_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let empty = task(send(&server, "POST", "/collections/c/documents?wait=true", "application/x-ndjson", Some("\n\n")));
    assert_eq!(empty["status"], "failed", "{empty}");
    assert!(empty["error"].as_str().unwrap().starts_with("the upload holds no documents"), "{empty}");
    let topics = "<top>\n<num> Number: 301\n<title> International Organized Crime\n</top>\n";
    let wrong = task(send(&server, "POST", "/collections/c/documents?wait=true", "text/plain", Some(topics)));
    assert_eq!(wrong["status"], "failed", "{wrong}");
    let error = wrong["error"].as_str().unwrap();
    assert!(error.starts_with("the upload holds no documents: ") && error.contains("topic"), "{wrong}");
}

/// A collection write repeated with its Idempotency-Key (a client's or a proxy's retry) answers the first task
/// and queues nothing more; the key given to another write is refused, and an upload repeated keeps no copy.
#[test]
fn a_write_repeated_with_its_idempotency_key_answers_the_first_task() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let keyed = |method: &str, path: &str, key: &str, body: Option<&str>| {
        request(method, &server.url(path), &[("content-type", "application/x-ndjson"), ("idempotency-key", key)], body)
    };
    let docs = "{\"id\": \"d1\", \"text\": \"harbor lantern\"}\n{\"id\": \"d2\", \"text\": \"lantern oil\"}\n";
    let first = task(keyed("POST", "/collections/k/documents?wait=true", "upload-1", Some(docs)));
    assert_eq!(first["status"], "succeeded", "{first}");
    let again = keyed("POST", "/collections/k/documents", "upload-1", Some(docs));
    assert_eq!((again.status, &again.json()["id"]), (202, &first["id"]), "the first task: {}", again.body);
    assert_eq!(again.json()["status"], "succeeded");
    let uploads = std::fs::read_dir(dir.path().join("uploads")).map_or(0, |d| d.count());
    assert_eq!(uploads, 0, "the repeated upload was not kept");
    let other = docs.replace("oil", "wick");
    keyed("POST", "/collections/k/documents", "upload-1", Some(&other)).assert_error(422, "idempotency_key_reused");
    keyed("POST", "/collections/k/documents?on_error=abort", "upload-1", Some(docs))
        .assert_error(422, "idempotency_key_reused");

    let delete = task(keyed("DELETE", "/collections/k/documents/d1?wait=true", "delete-1", None));
    assert_eq!(keyed("DELETE", "/collections/k/documents/d1", "delete-1", None).json()["id"], delete["id"]);
    keyed("DELETE", "/collections/k/documents/d2", "delete-1", None).assert_error(422, "idempotency_key_reused");
    keyed("PUT", "/collections/k", "upload-1", None).assert_error(422, "idempotency_key_reused");
    keyed("PUT", "/collections/k", "", None).assert_error(400, "invalid_idempotency_key");
    let listed: Vec<Value> = serde_json::from_str(&get(&server.url("/tasks?collection=k")).1).unwrap();
    assert_eq!(listed.len(), 2, "one task per key: {listed:?}");
    assert_eq!(docids(&server, "k", "lantern"), ["d2"]);
}
