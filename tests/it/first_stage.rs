//! The dense and hybrid first stages on ADI with the real MiniLM bi-encoder: dense is the bi-encoder's MaxP
//! over every document, hybrid fuses it with BM25 as asked, every pipeline runs on top, and what cannot run is
//! refused with what to do.

use serde_json::{json, Value};

use crate::common::{cli_env, data, minilm, post_json, spawn_cli, TestServer};
use crate::fixtures::tiny_cross_encoder;

const QUERY: &str = "automatic retrieval of articles from their titles";

/// ADI indexed, a server with MiniLM as the default model and a tiny cross-encoder named `ce`.
struct Setup {
    dir: tempfile::TempDir,
    env: Vec<(&'static str, String)>,
    server: TestServer,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let adi = data("adi/docs.jsonl");
        crate::common::cli_ok(dir.path(), &["index", "--collection", "adi", adi.to_str().unwrap()]);
        let ce = dir.path().join("ce");
        tiny_cross_encoder(&ce, 5);
        let env = vec![
            ("LONGRANK_MODEL_PATH", minilm().to_str().unwrap().to_string()),
            ("LONGRANK_MODEL_NAMED_CE", ce.to_str().unwrap().to_string()),
        ];
        let server = TestServer::start(dir.path(), &borrowed(&env)).wait_ready();
        Setup { dir, env, server }
    }

    fn search(&self, body: Value) -> Value {
        let mut request = json!({"query": QUERY, "collection": "adi"});
        request.as_object_mut().unwrap().extend(body.as_object().unwrap().clone());
        let reply = post_json(&self.server.url("/search"), &request.to_string());
        assert_eq!(reply.status, 200, "{request}: {}", reply.body);
        reply.json()
    }

    fn refused(&self, body: Value, status: u16, code: &str) -> String {
        let mut request = json!({"query": QUERY, "collection": "adi"});
        request.as_object_mut().unwrap().extend(body.as_object().unwrap().clone());
        let reply = post_json(&self.server.url("/search"), &request.to_string());
        reply.assert_error(status, code);
        reply.json()["error"]["message"].as_str().unwrap().to_string()
    }

    fn cli(&self, args: &[&str]) -> String {
        let out = cli_env(self.dir.path(), args, &borrowed(&self.env));
        assert!(out.status.success(), "longrank {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn borrowed<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

fn results(reply: &Value) -> &Vec<Value> {
    reply["results"].as_array().unwrap()
}

fn docids(reply: &Value) -> Vec<&str> {
    results(reply).iter().map(|h| h["docid"].as_str().unwrap()).collect()
}

#[test]
fn dense_is_the_bi_encoders_maxp_over_every_document_and_hybrid_fuses_it_with_bm25() {
    let s = Setup::new();
    // Before `longrank embed`: refused, with what to run.
    let message = s.refused(json!({"first_stage": "dense"}), 409, "no_vectors");
    assert!(message.contains("longrank embed --collection adi --name default"), "{message}");
    let out = s.cli(&["embed", "--collection", "adi"]);
    assert!(out.contains("segment embeddings computed"), "{out}");

    // Dense: the top 10 by best segment's cosine, each scored as the bi-encoder's MaxP scores it when it reads
    // every segment of every document (/rerank of all 82 by docid).
    let dense = s.search(json!({"first_stage": "dense", "k": 10}));
    assert_eq!(dense["pipeline"], "bm25");
    let all: Vec<String> = (1..=82).map(|i| i.to_string()).collect();
    let body = json!({"query": QUERY, "collection": "adi", "docids": all, "pipeline": "maxp", "k": 10,
        "preselect": {"selector": "none"}});
    let maxp = post_json(&s.server.url("/rerank"), &body.to_string());
    assert_eq!(maxp.status, 200, "{}", maxp.body);
    let maxp = maxp.json();
    assert_eq!(docids(&dense), docids(&maxp));
    for (i, (d, m)) in results(&dense).iter().zip(results(&maxp)).enumerate() {
        let score = d["score"].as_f64().unwrap();
        assert_eq!(score, m["score"].as_f64().unwrap(), "{d} against {m}");
        assert_eq!(d["first_stage_score"].as_f64(), Some(score));
        assert_eq!(d["first_stages"], json!({"dense": {"rank": i + 1, "score": score}}), "{d}");
    }
    // BM25's answers carry no such evidence.
    let bm25 = s.search(json!({"k": 10}));
    assert!(results(&bm25).iter().all(|h| h.get("first_stages").is_none()));

    // Hybrid, reciprocal rank fusion (the default): each document's score is the sum over the lists that hold
    // it of 1 / (60 + rank), and its ranks are those BM25 and dense gave it.
    let hybrid = s.search(json!({"first_stage": "hybrid", "k": 10}));
    let bm25_rank = |docid: &str| docids(&bm25).iter().position(|d| *d == docid).map(|i| i + 1);
    let dense_rank = |docid: &str| docids(&dense).iter().position(|d| *d == docid).map(|i| i + 1);
    let mut previous = f64::INFINITY;
    for h in results(&hybrid) {
        let docid = h["docid"].as_str().unwrap();
        let lists = &h["first_stages"];
        let rank = |list: &str| lists[list]["rank"].as_u64().map(|r| r as usize);
        // Within each list's top 10 the ranks agree with that first stage alone.
        for (list, alone) in [("bm25", bm25_rank(docid)), ("dense", dense_rank(docid))] {
            if let Some(alone) = alone {
                assert_eq!(rank(list), Some(alone), "{list} {h}");
            }
        }
        let want: f64 = ["bm25", "dense"].iter().filter_map(|l| rank(l)).map(|r| 1.0 / (60.0 + r as f64)).sum();
        let score = h["score"].as_f64().unwrap();
        assert!((score - want).abs() < 1e-6 && score <= previous, "{h}");
        previous = score;
    }
    let both = results(&hybrid).iter().filter(|h| h["first_stages"].as_object().unwrap().len() == 2).count();
    assert!(both > 0, "some document is in both lists: {hybrid}");

    // Linear fusion with all the weight on dense keeps dense's order at the top (dense's last normalizes to 0,
    // as the documents only BM25 found score).
    let linear = s.search(json!({"first_stage": "hybrid", "k": 3, "hybrid": {"fusion": "linear", "weight": 1.0}}));
    assert_eq!(docids(&linear)[..2], docids(&dense)[..2]);
    assert_eq!(results(&linear)[0]["score"], 1.0);

    // Re-ranking on top of each: the candidates are the first stage's, with their evidence.
    for first_stage in ["dense", "hybrid"] {
        let body = json!({"first_stage": first_stage, "pipeline": "maxp", "k": 5, "depth": 5});
        let reranked = s.search(body);
        for h in results(&reranked) {
            assert!(h["segments"].is_array() && h["first_stages"].is_object(), "{first_stage}: {h}");
        }
        // Each list is cut at max(k, depth): the first stage alone at k = 5.
        let first = s.search(json!({"first_stage": first_stage, "k": 5}));
        let mut got = docids(&reranked);
        let mut want = docids(&first);
        got.sort();
        want.sort();
        assert_eq!(got, want, "{first_stage}: maxp re-ranks the first stage's top 5");
    }

    // The CLI: the same ranking, and each list's rank under each hit.
    let out = s.cli(&["search", "--collection", "adi", "--first-stage", "hybrid", "-k", "10", QUERY]);
    let ranked = out.lines().map(|l| l.split_whitespace().collect::<Vec<_>>());
    let cli_docids: Vec<String> =
        ranked.filter(|words| words.len() > 2 && words[0].parse::<usize>().is_ok()).map(|w| w[2].to_string()).collect();
    assert_eq!(cli_docids, docids(&hybrid), "{out}");
    assert!(out.contains("first stages: bm25 #") && out.contains("dense #"), "{out}");
}

#[test]
fn first_stages_that_cannot_run_are_refused_with_the_reason() {
    let s = Setup::new();
    let message = s.refused(json!({"first_stage": "dense", "dense_model": "ce"}), 422, "not_a_bi_encoder");
    assert!(message.contains("model \"ce\" is a cross-encoder"), "{message}");
    // The request's model is tried first, then the default (a bi-encoder): this one runs (on the embeddings
    // missing here, hence the refusal that names them).
    s.refused(json!({"first_stage": "dense", "model": "ce"}), 409, "no_vectors");
    s.refused(json!({"first_stage": "dense", "dense_model": "nope"}), 422, "unknown_model");
    s.refused(json!({"hybrid": {"fusion": "rrf"}}), 400, "not_applicable");
    s.refused(json!({"dense_model": "default"}), 400, "not_applicable");
    s.refused(json!({"first_stage": "dense", "pipeline": "bm25+rm3"}), 400, "not_applicable");
    s.refused(json!({"first_stage": "hybrid", "hybrid": {"fusion": "linear", "weight": 1.5}}), 400, "out_of_range");
    s.refused(json!({"first_stage": "hybrid", "hybrid": {"fusion": "borda"}}), 400, "invalid_body");
    s.refused(json!({"first_stage": "sparse"}), 400, "invalid_body");
    let body = json!({"query": QUERY, "documents": [{"text": "titles"}], "first_stage": "dense"});
    post_json(&s.server.url("/rerank"), &body.to_string()).assert_error(400, "not_applicable");
}

/// From `approximate_from` segments (0 here) the dense first stage searches the vector index `longrank embed`
/// built: on each of ADI's topics it answers exact search's top 20, scores bit for bit; an upload keeps it
/// current; an index holding another model's vectors is refused by name.
#[test]
fn the_vector_index_answers_as_exact_search_does() {
    let s = Setup::new();
    let out = s.cli(&["embed", "--collection", "adi"]);
    assert!(out.contains("82 stored, 82 in the vector index"), "every segment indexed: {out}");
    let mut env = borrowed(&s.env);
    env.push(("LONGRANK_MODEL_APPROXIMATE_FROM", "0"));
    let approximate = TestServer::start(s.dir.path(), &env).wait_ready();
    let topics = std::fs::read_to_string(data("adi/topics.tsv")).unwrap();
    let search = |server: &TestServer, query: &str| {
        let body = json!({"query": query, "collection": "adi", "first_stage": "dense", "k": 20});
        let reply = post_json(&server.url("/search"), &body.to_string());
        assert_eq!(reply.status, 200, "{}", reply.body);
        let reply = reply.json();
        results(&reply).iter().map(|h| (h["docid"].clone(), h["score"].clone())).collect::<Vec<_>>()
    };
    for query in topics.lines().filter_map(|l| l.split('\t').nth(1)) {
        assert_eq!(search(&approximate, query), search(&s.server, query), "{query}");
    }

    // A document uploaded: the upload's task embeds its segments and adds them to the index, so dense search
    // finds it at once (without, it refuses the collection: a segment without an embedding). The exact server
    // goes first: it shares the data directory's tasks, and would apply the upload itself.
    let Setup { dir, server, env: s_env } = s;
    drop(server);
    let text = "Mooring masts for rigid airships of the nineteen twenties";
    let line = json!({"id": "new-1", "title": "Zeppelins", "text": text}).to_string() + "\n";
    let url = approximate.url("/collections/adi/documents?wait=true");
    let reply = crate::common::request("POST", &url, &[("content-type", "application/x-ndjson")], Some(&line));
    assert!(reply.status == 200 || reply.status == 202, "{} {}", reply.status, reply.body);
    assert_eq!(search(&approximate, text)[0].0, "new-1");
    // A document deleted and another replaced: the warm server reads and cuts only the commits' new documents
    // (the index segments it cut before are reused), and answers as a server that cut every document afresh.
    let first = search(&approximate, QUERY)[0].0.as_str().unwrap().to_string();
    let deleted = crate::common::request(
        "DELETE",
        &approximate.url(&format!("/collections/adi/documents/{first}?wait=true")),
        &[],
        None,
    );
    assert!(deleted.status == 200 || deleted.status == 202, "{} {}", deleted.status, deleted.body);
    let replaced = if first == "2" { "3" } else { "2" };
    let line =
        json!({"id": replaced, "title": "Zeppelins", "text": "Airship hangars and their masts"}).to_string() + "\n";
    let reply = crate::common::request("POST", &url, &[("content-type", "application/x-ndjson")], Some(&line));
    assert!(reply.status == 200 || reply.status == 202, "{} {}", reply.status, reply.body);
    let fresh = TestServer::start(dir.path(), &borrowed(&s_env)).wait_ready();
    for query in topics.lines().filter_map(|l| l.split('\t').nth(1)).chain([text, "airship hangars"]) {
        let warm = search(&approximate, query);
        assert!(warm.iter().all(|h| h.0 != first.as_str()), "{query}: the deleted document");
        assert_eq!(warm, search(&fresh, query), "{query}");
    }
    drop(fresh);

    let header = std::fs::read_dir(dir.path().join("collections/adi/embeddings"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".usearch.json"))
        .expect("the index's header beside the embeddings");
    std::fs::write(&header, r#"{"model": "e5-base", "vectors": "0123-f32", "dims": 768}"#).unwrap();
    // A new stamp is a new read: the index is opened again, and refused.
    let (index, copy) = (header.with_extension(""), header.with_extension("copy"));
    std::fs::copy(&index, &copy).unwrap();
    std::fs::rename(&copy, &index).unwrap();
    let body = json!({"query": QUERY, "collection": "adi", "first_stage": "dense"});
    let reply = post_json(&approximate.url("/search"), &body.to_string());
    reply.assert_error(409, "other_models_index");
    assert!(reply.body.contains("model e5-base's embeddings"), "{}", reply.body);
}

/// `longrank embed` killed as it writes the grown index: the last checkpoint stays whole and serves (the
/// segments it lacks searched exactly beside it), and the next run finishes the index.
#[test]
fn a_kill_while_the_index_grows_leaves_the_last_checkpoint_serving() {
    let s = Setup::new();
    s.cli(&["embed", "--collection", "adi"]);
    let text = "Mooring masts for rigid airships of the nineteen twenties";
    let more = s.dir.path().join("more.jsonl");
    std::fs::write(&more, json!({"id": "new-1", "title": "Zeppelins", "text": text}).to_string() + "\n").unwrap();
    s.cli(&["index", "--collection", "adi", more.to_str().unwrap()]);
    let embeddings = s.dir.path().join("collections/adi/embeddings");
    let index = std::fs::read_dir(&embeddings).unwrap().map(|e| e.unwrap().path());
    let index = index.into_iter().find(|p| p.extension().is_some_and(|e| e == "usearch")).expect("an index");
    let before = std::fs::read(&index).unwrap();
    let held = [borrowed(&s.env), vec![("LONGRANK_TEST_HOLD", "neighbours.checkpoint:1")]].concat();
    let mut embed = spawn_cli(s.dir.path(), &["embed", "--collection", "adi"], &held);
    let partial = || {
        let names = std::fs::read_dir(&embeddings).unwrap().map(|e| e.unwrap().file_name());
        names.into_iter().any(|n| n.to_string_lossy().ends_with(".usearch.partial"))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !partial() {
        assert!(std::time::Instant::now() < deadline, "no checkpoint written");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    embed.kill().unwrap();
    embed.wait().unwrap();
    assert!(std::fs::read(&index).unwrap() == before, "the index in place is the last checkpoint's");

    let mut env = borrowed(&s.env);
    env.push(("LONGRANK_MODEL_APPROXIMATE_FROM", "0"));
    let approximate = TestServer::start(s.dir.path(), &env).wait_ready();
    let body = json!({"query": text, "collection": "adi", "first_stage": "dense", "k": 3});
    let reply = post_json(&approximate.url("/search"), &body.to_string());
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(docids(&reply.json())[0], "new-1");
    let out = s.cli(&["embed", "--collection", "adi"]);
    assert!(out.contains("0 segment embeddings computed, 83 stored, 83 in the vector index"), "{out}");
}
