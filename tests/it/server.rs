//! The real server over HTTP: every route, and every error status with a bad request of each kind.

use std::path::Path;

use crate::common::{data, fixture, get, isolated, post_json, request, TestServer, BIN};

#[test]
fn post_search_ranks_with_bm25() {
    let s = &fixture().server;
    let r = post_json(
        &s.url("/search"),
        r#"{"query": "similarity laws aeroelastic models heated high speed aircraft", "collection": "cranfield", "k": 5}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["pipeline"], "bm25");
    assert_eq!(v["collection"], "cranfield");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 5);
    assert_eq!(results[0]["rank"], 1);
    let scores: Vec<f64> = results.iter().map(|h| h["score"].as_f64().unwrap()).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    assert_eq!(results[0]["score"], results[0]["first_stage_score"]);
    // Relevant documents of topic 1 (qrels) lead the ranking.
    let top: Vec<&str> = results.iter().map(|h| h["docid"].as_str().unwrap()).collect();
    assert!(top.contains(&"486") && top.contains(&"184"), "{top:?}");
    assert!(results[0]["snippet"].as_str().unwrap().len() > 20);
    assert!(v["took_ms"].as_f64().unwrap() >= 0.0);
}

/// `bm25+rm3` answers with the query RM3 searched with: the original terms and up to `fb_terms` feedback terms,
/// weights summing to one, heaviest first; other pipelines have no `expansion`.
#[test]
fn rm3_returns_its_expanded_query() {
    let s = &fixture().server;
    let body =
        r#"{"query": "wing flutter", "collection": "cranfield", "pipeline": "bm25+rm3", "rm3": {"fb_terms": 5}}"#;
    let v = post_json(&s.url("/search"), body).json();
    let terms = v["expansion"].as_array().unwrap();
    let weights: Vec<f64> = terms.iter().map(|t| t["weight"].as_f64().unwrap()).collect();
    assert!((5..=7).contains(&terms.len()), "{terms:?}");
    assert!(weights.windows(2).all(|w| w[0] >= w[1]), "{weights:?}");
    assert!((weights.iter().sum::<f64>() - 1.0).abs() < 1e-5, "{weights:?}");
    let words: Vec<&str> = terms.iter().map(|t| t["term"].as_str().unwrap()).collect();
    assert!(words.contains(&"wing") && words.contains(&"flutter"), "{words:?}");
    let plain = post_json(&s.url("/search"), r#"{"query": "wing flutter", "collection": "cranfield"}"#).json();
    assert!(plain.get("expansion").is_none(), "{plain}");
}

/// The server's first log lines and `/metrics` say how the encoder's products run: candle's own with
/// `LONGRANK_BLAS=off`, the built-in kernels with `builtin`, else the library the inherited `LONGRANK_BLAS`
/// names (CI runs the suite once through MKL, once through OpenBLAS), with the thread count.
#[test]
fn the_log_and_metrics_say_which_gemm_the_encoder_uses() {
    let inherited = std::env::var("LONGRANK_BLAS").unwrap_or_default();
    let expected = |blas: &str| match blas {
        "off" => Some("candle"),
        "builtin" => Some("builtin"),
        b if b.contains("mkl") => Some("mkl"),
        b if b.contains("openblas") => Some("openblas"),
        _ => None,
    };
    for blas in ["off", "builtin", inherited.as_str()] {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("server.log");
        let env = [("LONGRANK_BLAS", blas), ("RUST_LOG", "info")];
        let server = TestServer::start_logging(dir.path(), &env, &log).wait_ready();
        server.wait_log(&log, "the encoder's products on the CPU");
        let (_, metrics) = get(&server.url("/metrics"));
        let info = metrics.lines().find(|l| l.starts_with("longrank_encoder_info{")).expect("an encoder info line");
        assert!(info.contains("threads=\"") && info.ends_with("} 1"), "{info}");
        if let Some(gemm) = expected(blas) {
            assert!(info.contains(&format!("gemm=\"{gemm}\"")), "LONGRANK_BLAS={blas}: {info}");
            let logged = std::fs::read_to_string(&log).unwrap();
            assert!(logged.contains(&format!("products on the CPU: {gemm}")), "{logged}");
        }
    }
}

/// Slow clients that reopen their connections as soon as the server closes them, twice as many as it allows
/// (each sends part of its headers and nothing more), do not keep a well-behaved client out: from the same
/// address, each of its requests during the attack is answered 200, well before the header timeout.
#[test]
fn reconnecting_slow_clients_do_not_keep_a_well_behaved_client_out() {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = crate::fixtures::cranfield_data_dir();
    let env = [("LONGRANK_SERVER_MAX_CONNECTIONS", "16"), ("LONGRANK_SERVER_HEADER_READ_TIMEOUT_MS", "10000")];
    let server = TestServer::start(dir.path(), &env).wait_ready();
    let addr = server.base.trim_start_matches("http://").to_string();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let attackers: Vec<_> = (0..32)
        .map(|_| {
            let (addr, stop) = (addr.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut stream) = std::net::TcpStream::connect(&addr) else { continue };
                    let _ = stream.write_all(b"GET /health HTTP/1.1\r\nHost: 127");
                    stream.set_read_timeout(Some(std::time::Duration::from_millis(100))).unwrap();
                    // Held until the server closes it (or the attack ends), then reopened at once.
                    let mut byte = [0u8; 1];
                    while !stop.load(Ordering::Relaxed) {
                        match stream.read(&mut byte) {
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => continue,
                            _ => break,
                        }
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let client = ureq::AgentBuilder::new().timeout(std::time::Duration::from_secs(3)).build();
    let answered: Vec<_> = (0..20)
        .map(|_| match client.get(&server.url("/search?q=boundary+layer")).call() {
            Ok(response) => response.status().to_string(),
            Err(e) => e.to_string(),
        })
        .collect();
    stop.store(true, Ordering::Relaxed);
    for attacker in attackers {
        attacker.join().unwrap();
    }
    assert!(answered.iter().all(|a| a == "200"), "{answered:?}");
}

/// Slow and idle clients cannot hold the server: a connection that sends no request headers within
/// `header_read_timeout_ms` is closed, at most `max_connections` are open (a client beyond them is served once
/// one frees), and a body announced larger than the limit is refused before it is sent.
#[test]
fn slow_clients_are_cut_off_and_connections_are_bounded() {
    use std::io::{Read, Write};
    let dir = crate::fixtures::cranfield_data_dir();
    // Whether a connection sending half a request line is closed within 5 s (the end of the stream, or a reset
    // when its request was never read).
    let closed_soon = |mut stream: std::net::TcpStream| {
        stream.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let read = stream.read_to_end(&mut Vec::new());
        read.is_ok() || read.is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset)
    };
    let half_request = |addr: &str| {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream.write_all(b"GET /health HTTP/1.1\r\nHost: 127").unwrap();
        stream
    };
    // The bound: four slow clients hold every connection the server allows, and the header timeout is far off;
    // a fifth client is served because the one idle longest is closed to make room (ignoring the bound, the
    // fifth would be served too, and no slow one closed for 30 s).
    let env = [("LONGRANK_SERVER_MAX_CONNECTIONS", "4"), ("LONGRANK_SERVER_HEADER_READ_TIMEOUT_MS", "30000")];
    let server = TestServer::start(dir.path(), &env).wait_ready();
    let addr = server.base.trim_start_matches("http://").to_string();
    let slow: Vec<std::net::TcpStream> = (0..4).map(|_| half_request(&addr)).collect();
    let (status, _) = get(&server.url("/health"));
    assert_eq!(status, 200);
    let closed = slow.into_iter().next().map(closed_soon).unwrap();
    assert!(closed, "the connection idle longest was left open past the bound");
    drop(server);
    // The header timeout: a slow client alone is closed after 500 ms.
    let env = [("LONGRANK_SERVER_MAX_CONNECTIONS", "64"), ("LONGRANK_SERVER_HEADER_READ_TIMEOUT_MS", "500")];
    let server = TestServer::start(dir.path(), &env).wait_ready();
    let addr = server.base.trim_start_matches("http://").to_string();
    assert!(closed_soon(half_request(&addr)), "a slow connection was left open past the header timeout");
    // A body announced at 1 GB: 413 at once, before any of it is sent.
    let mut stream = std::net::TcpStream::connect(&addr).unwrap();
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    let head = format!(
        "POST /search HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    let mut answer = [0u8; 12];
    stream.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"HTTP/1.1 413");
}

#[test]
fn get_search_and_query_syntax_is_plain_text() {
    let s = &fixture().server;
    let (status, body) = get(&s.url("/search?q=polio%20AND%20(vaccine)%20-immunisation&collection=robust04&k=3"));
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let ids: Vec<&str> = v["results"].as_array().unwrap().iter().map(|h| h["docid"].as_str().unwrap()).collect();
    assert!(ids.contains(&"FT921-14537"), "{ids:?}");
}

/// Paging: `offset` beside `k` (Elasticsearch's `from` and `size`), in the JSON body and the query string: the
/// pages, put together, are the ranking, ranks counted from the top; a page ends within `limits.max_k`.
#[test]
fn offset_pages_through_the_ranking() {
    let s = &fixture().server;
    let ranking = |v: &serde_json::Value| -> Vec<(u64, String)> {
        let results = v["results"].as_array().unwrap();
        results.iter().map(|h| (h["rank"].as_u64().unwrap(), h["docid"].as_str().unwrap().to_string())).collect()
    };
    let whole = post_json(&s.url("/search"), r#"{"query": "wing flutter", "collection": "cranfield", "k": 9}"#);
    let whole = ranking(&whole.json());
    assert_eq!(whole.len(), 9);
    let mut pages = Vec::new();
    for offset in [0, 3] {
        let body = format!(r#"{{"query": "wing flutter", "collection": "cranfield", "k": 3, "offset": {offset}}}"#);
        pages.extend(ranking(&post_json(&s.url("/search"), &body).json()));
    }
    let (status, body) = get(&s.url("/search?q=wing+flutter&collection=cranfield&k=3&offset=6"));
    assert_eq!(status, 200, "{body}");
    pages.extend(ranking(&serde_json::from_str(&body).unwrap()));
    assert_eq!(pages, whole);
    // Past the last match: an empty page, not an error.
    let (_, body) = get(&s.url("/search?q=wing+flutter&collection=cranfield&k=10&offset=9000"));
    assert_eq!(serde_json::from_str::<serde_json::Value>(&body).unwrap()["results"], serde_json::json!([]));
    let past = request("GET", &s.url("/search?q=wing&collection=cranfield&k=10&offset=9991"), &[], None);
    past.assert_error(400, "out_of_range");
    assert!(past.body.contains("offset must be between 0 and 9990"), "{}", past.body);
    post_json(&s.url("/search"), r#"{"query": "wing", "collection": "cranfield", "offset": -1}"#)
        .assert_error(400, "out_of_range");
}

#[test]
fn documents_by_docid_with_ambiguity_and_not_found() {
    let s = &fixture().server;
    let r = request("GET", &s.url("/documents/GX000-38-6348494"), &[], None);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["collection"], "gov2");
    assert_eq!(v["title"], "Pearl Oysters of the Pacific Islands");
    assert!(v["text"].as_str().unwrap().contains("Polynésie"));
    // The Robust04 sample is indexed twice.
    request("GET", &s.url("/documents/LA010590-0084"), &[], None).assert_error(409, "ambiguous_document");
    let r = request("GET", &s.url("/documents/LA010590-0084?collection=robust04"), &[], None);
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["title"], "ASIAN GANGS EXTEND REACH ACROSS PACIFIC");
    request("GET", &s.url("/documents/NOPE-1"), &[], None).assert_error(404, "unknown_document");
    request("GET", &s.url("/documents/LA010590-0084?collection=nope"), &[], None)
        .assert_error(404, "unknown_collection");
}

#[test]
fn collections_list_sizes_and_parameters() {
    let s = &fixture().server;
    let (status, body) = get(&s.url("/collections"));
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let cran = v.as_array().unwrap().iter().find(|c| c["name"] == "cranfield").expect("cranfield listed");
    assert_eq!(cran["documents"], 1398, "Cranfield less its 2 empty documents");
    assert!(cran["average_length"].as_f64().unwrap() > 50.0);
    assert_eq!(cran["bm25"]["k1"], 0.9);
    assert!((cran["bm25"]["b"].as_f64().unwrap() - 0.4).abs() < 1e-6);
}

#[test]
fn health_metrics_and_request_ids() {
    let s = &fixture().server;
    let r = request("GET", &s.url("/health"), &[("x-request-id", "abc-123")], None);
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["status"], "ready");
    assert_eq!(r.header("x-request-id"), Some("abc-123"));
    let health = request("GET", &s.url("/health"), &[], None);
    let generated = health.header("x-request-id").expect("generated id").to_string();
    assert!(!generated.is_empty());

    get(&s.url("/search?q=wing&collection=cranfield"));
    let r = request("GET", &s.url("/metrics"), &[], None);
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    assert!(
        r.body.contains("longrank_http_requests_total{route=\"/search\",method=\"GET\",status=\"200\"}"),
        "{}",
        r.body
    );
    assert!(r.body.contains("longrank_http_request_duration_seconds_bucket{route=\"/search\""));
    assert!(r.body.contains("longrank_collection_documents{collection=\"cranfield\"} 1398"));
    assert!(r.body.contains("longrank_collection_size_bytes{collection=\"time\"}"));
}

#[test]
fn openapi_lists_every_route_and_docs_page_is_served() {
    let s = &fixture().server;
    let (status, body) = get(&s.url("/openapi.json"));
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let paths = v["paths"].as_object().unwrap();
    for (path, method) in [
        ("/search", "post"),
        ("/search", "get"),
        ("/documents/{docid}", "get"),
        ("/collections", "get"),
        ("/pipelines", "get"),
        ("/rerank", "post"),
        ("/batch", "post"),
        ("/batch", "get"),
        ("/batch/{id}", "get"),
        ("/batch/{id}", "delete"),
        ("/batch/{id}/run", "get"),
        ("/batch/compare", "get"),
        ("/health", "get"),
        ("/metrics", "get"),
    ] {
        assert!(paths.get(path).and_then(|p| p.get(method)).is_some(), "{method} {path} missing from OpenAPI");
    }
    assert!(v["components"]["schemas"]["ErrorBody"].is_object());
    let (status, page) = get(&s.url("/docs/"));
    assert_eq!(status, 200);
    assert!(page.contains("swagger") || page.contains("Swagger"), "{page}");
    let (status, page) = get(&s.url("/"));
    assert_eq!(status, 200);
    assert!(page.contains("<html") || page.contains("<!doctype html"));
}

/// The bounds the server enforces are stated in its OpenAPI document (the configured ones with their values:
/// the fixture's server takes queries of at most 1000 characters), so that a generated client or a fuzzer
/// sends what is accepted; the model's part of `timing` is a plain object part, and `?wait` answers are typed.
#[test]
fn openapi_states_the_limits_the_server_enforces() {
    let s = &fixture().server;
    let spec: serde_json::Value = serde_json::from_str(&get(&s.url("/openapi.json")).1).unwrap();
    let property = |schema: &str, name: &str| {
        let property = crate::common::schema_properties(&spec, schema).remove(name);
        let property = property.unwrap_or_else(|| panic!("{schema} has no {name}"));
        // Through a nullable alternative, or a reference.
        let alternatives = property["oneOf"].as_array().cloned().unwrap_or_default();
        let inner = alternatives.into_iter().find(|a| a["type"] != "null").unwrap_or(property);
        match inner["$ref"].as_str() {
            Some(r) => spec["components"]["schemas"][r.rsplit('/').next().unwrap()].clone(),
            None => inner,
        }
    };
    let bounds = |schema: &str, name: &str| {
        let p = property(schema, name);
        (p["minimum"].as_f64(), p["maximum"].as_f64())
    };
    assert_eq!(bounds("SearchRequest", "k"), (Some(1.0), Some(10000.0)));
    assert_eq!(bounds("SearchRequest", "offset"), (Some(0.0), Some(9999.0)));
    // `offset` in a query string: a search's page, or the batch list's.
    let offset = |path: &str| {
        let parameters = spec["paths"][path]["get"]["parameters"].as_array().unwrap();
        let p = &parameters.iter().find(|p| p["name"] == "offset").unwrap()["schema"];
        (p["minimum"].as_f64(), p["maximum"].as_f64())
    };
    assert_eq!(offset("/search"), (Some(0.0), Some(9999.0)));
    assert_eq!(offset("/batch"), (Some(0.0), Some(i64::MAX as f64)));
    assert_eq!(bounds("BatchRequest", "depth"), (Some(1.0), Some(10000.0)));
    assert_eq!(bounds("SearchRequest", "interpolate"), (Some(0.0), Some(1.0)));
    assert_eq!(bounds("Bm25Params", "k1"), (Some(0.0), Some(100.0)));
    assert_eq!(bounds("Rm3Params", "fb_terms"), (Some(1.0), Some(200.0)));
    assert_eq!(bounds("CohereV2Request", "top_n"), (Some(1.0), Some(10000.0)));
    for schema in ["SearchRequest", "RerankRequest", "TeiRequest", "V1Request"] {
        assert_eq!(property(schema, "query")["maxLength"], 1000, "{schema}");
        assert_eq!(property(schema, "query")["minLength"], 1, "{schema}");
    }
    assert_eq!(property("TeiRequest", "texts")["minItems"], 1);
    assert_eq!(
        spec["components"]["schemas"]["RankParams"]["dependentSchemas"]["rm3"]["properties"]["pipeline"]["const"],
        "bm25+rm3"
    );
    let rerank = crate::common::schema_properties(&spec, "RerankRequest");
    assert!(rerank.contains_key("segments") && !rerank.contains_key("depth") && !rerank.contains_key("rm3"));
    let parameter = |path: &str, method: &str, name: &str| {
        let parameters = spec["paths"][path][method]["parameters"].as_array().unwrap();
        parameters.iter().find(|p| p["name"] == name).unwrap()["schema"].clone()
    };
    assert_eq!(parameter("/search", "get", "q")["maxLength"], 1000);
    assert_eq!(parameter("/batch", "get", "limit")["maximum"], 1000);
    assert!(parameter("/collections/{name}", "put", "name")["pattern"].as_str().unwrap().starts_with('^'));
    // The Idempotency-Key rule, on every write that takes one.
    for (path, method) in
        [("/batch", "post"), ("/collections/{name}/documents", "post"), ("/collections/{name}", "put")]
    {
        let key = parameter(path, method, "Idempotency-Key");
        assert_eq!(
            (&key["minLength"], &key["maxLength"], &key["pattern"]),
            (&1.into(), &255.into(), &"^[ -~]{1,255}$".into())
        );
    }
    // The model's timing: a part of `allOf` that is an object, not a nullable alternative.
    let timing = &spec["components"]["schemas"]["Timing"]["allOf"];
    assert!(timing.as_array().unwrap().iter().any(|p| p["$ref"] == "#/components/schemas/ModelTiming"), "{timing}");
    // `?wait` answers 200 finished or 202 with Location.
    let submit = &spec["paths"]["/batch"]["post"]["responses"];
    assert!(submit["200"].is_object() && submit["202"]["headers"]["location"].is_object(), "{submit}");
    let upload = &spec["paths"]["/collections/{name}/documents"]["post"]["responses"];
    assert!(upload["200"].is_object() && upload["202"]["headers"]["location"].is_object(), "{upload}");
}

#[test]
fn every_bad_request_gets_the_json_error_shape() {
    let s = &fixture().server;
    let search = s.url("/search");
    post_json(&search, "{not json").assert_error(400, "malformed_json");
    post_json(&search, r#"{"k": 5}"#).assert_error(400, "invalid_body");
    post_json(&search, r#"{"query": 42}"#).assert_error(400, "invalid_body");
    post_json(&search, r#"{"query": "x", "k": "ten"}"#).assert_error(400, "invalid_body");
    post_json(&search, r#"{"query": "x", "surprise": 1}"#).assert_error(400, "invalid_body");
    post_json(&search, r#"{"query": "   ", "collection": "cranfield"}"#).assert_error(400, "empty_query");
    post_json(&search, r#"{"query": "\u0000\u0000", "collection": "cranfield"}"#).assert_error(400, "empty_query");
    // Size-like parameters are bounded, infinities included (1e39 is an f32 infinity).
    for bad in [r#""bm25": {"k1": 1e39, "b": 0.4}"#, r#""rm3": {"fb_docs": 100000}"#, r#""rm3": {"fb_terms": 5000}"#] {
        let body = format!(r#"{{"query": "wing", "collection": "cranfield", "pipeline": "bm25+rm3", {bad}}}"#);
        post_json(&search, &body).assert_error(400, "out_of_range");
    }
    post_json(&search, r#"{"query": "wing", "collection": "cranfield", "k": 0}"#).assert_error(400, "out_of_range");
    post_json(&search, r#"{"query": "wing", "collection": "cranfield", "k": 100000}"#)
        .assert_error(400, "out_of_range");
    post_json(&search, r#"{"query": "wing", "collection": "cranfield", "depth": -1}"#)
        .assert_error(400, "out_of_range");
    post_json(&search, r#"{"query": "wing", "collection": "cranfield", "bm25": {"k1": 1.0, "b": 3}}"#)
        .assert_error(400, "out_of_range");
    post_json(&search, &format!(r#"{{"query": "{}", "collection": "cranfield"}}"#, "w".repeat(2000)))
        .assert_error(400, "query_too_long");
    post_json(&search, r#"{"query": "wing"}"#).assert_error(400, "collection_required");
    post_json(&search, r#"{"query": "wing", "collection": "nope"}"#).assert_error(404, "unknown_collection");
    post_json(&search, r#"{"query": "wing", "collection": "cranfield", "pipeline": "magic"}"#)
        .assert_error(422, "unknown_pipeline");
    let big = format!(r#"{{"query": "{}"}}"#, "x".repeat(8000));
    post_json(&search, &big).assert_error(413, "body_too_large");
    request("POST", &search, &[], Some(r#"{"query": "wing"}"#)).assert_error(415, "unsupported_media_type");
    request("GET", &s.url("/search?k=3"), &[], None).assert_error(400, "invalid_query_string");
    request("GET", &s.url("/search?q=wing&k=many&collection=cranfield"), &[], None)
        .assert_error(400, "invalid_query_string");
    // Object-valued parameters belong in a body; a parameter given twice is refused, not silently one of them.
    let object = request("GET", &s.url("/search?q=wing&collection=cranfield&bm25=%7B%7D"), &[], None);
    object.assert_error(400, "invalid_query_string");
    assert!(object.body.contains("bm25"), "{}", object.body);
    request("GET", &s.url("/search?q=wing&k=3&k=4&collection=cranfield"), &[], None)
        .assert_error(400, "duplicate_field");
    // So is a JSON key, at any depth: serde_json alone would keep the last one.
    post_json(&search, r#"{"query": "wing", "query": "flutter", "collection": "cranfield"}"#)
        .assert_error(400, "duplicate_field");
    post_json(&search, r#"{"query": "wing", "collection": "cranfield", "bm25": {"k1": 1.0, "k1": 2.0}}"#)
        .assert_error(400, "duplicate_field");
    // Settings a pipeline would ignore are refused, naming the one that takes them.
    let rm3 = post_json(&search, r#"{"query": "wing", "collection": "cranfield", "rm3": {"fb_docs": 5}}"#);
    rm3.assert_error(400, "not_applicable");
    assert!(rm3.body.contains("bm25+rm3"), "{}", rm3.body);
    // A request head past its bounds gets the JSON error too.
    let long = format!("/search?collection=cranfield&q={}", "wing+".repeat(7000));
    request("GET", &s.url(&long), &[], None).assert_error(414, "uri_too_long");
    let many: Vec<(String, String)> = (0..120).map(|i| (format!("x-extra-{i}"), "1".to_string())).collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    request("GET", &s.url("/search?q=wing&collection=cranfield"), &many, None).assert_error(431, "headers_too_large");
    let big = "v".repeat(70_000);
    request("GET", &s.url("/health"), &[("x-big", big.as_str())], None).assert_error(431, "headers_too_large");
    request("GET", &s.url("/static/nope.js"), &[], None).assert_error(404, "not_found");
    request("GET", &s.url("/no/such/route"), &[], None).assert_error(404, "not_found");
    request("DELETE", &s.url("/search"), &[], None).assert_error(405, "method_not_allowed");
}

#[test]
fn unready_server_answers_503_and_first_start_serves_the_demo() {
    // A data directory where the demo cannot be written: start-up preparation fails and the server stays unready.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("demo-source"), "a file where a directory should be").unwrap();
    let log = dir.path().join("server.log");
    let server = TestServer::start_logging(dir.path(), &[], &log);
    server.wait_log(&log, "start-up failed, staying unready");
    request("GET", &server.url("/health"), &[], None).assert_error(503, "not_ready");
    request("GET", &server.url("/search?q=bees"), &[], None).assert_error(503, "not_ready");
    drop(server);

    // A fresh, empty data directory: the demo collection is indexed and served.
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path(), &[]).wait_ready();
    let (status, body) = get(&server.url("/search?q=waggle%20dance%20bees"));
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["collection"], "demo");
    assert_eq!(v["results"][0]["docid"], "demo-07");
}

/// README's first command as written, on a fresh machine: `serve` run in an empty directory that holds only a
/// copy of the repository's config.toml (no data directory yet), offline with an empty hub cache (the default
/// model unavailable), on a free port: BM25 serves the demo collection, and the model's pipelines say why not.
#[test]
fn readme_quick_start_serves_the_demo_from_an_empty_directory() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let section = readme.split("\n## Quick start\n").nth(1).expect("README has a quick start section");
    let block = section.split("```sh\n").nth(1).and_then(|b| b.split("```").next()).expect("a sh block");
    let command = block.trim();
    let args = command
        .strip_prefix("cargo run --release -- ")
        .unwrap_or_else(|| panic!("README's quick start is not `cargo run --release -- ARGS`: {command:?}"));
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(repo.join("config.toml"), dir.path().join("config.toml")).unwrap();
    let hub = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new(BIN);
    isolated(&mut cmd)
        .env_remove("LONGRANK_MODEL_PATH")
        .env("HF_HOME", hub.path())
        .env("LONGRANK_SERVER_ADDR", "127.0.0.1:0")
        .args(args.split_whitespace())
        .current_dir(dir.path());
    let server = TestServer::spawn(cmd).wait_ready();
    assert!(dir.path().join("data/longrank.db").is_file(), "the store is in config.toml's data directory");

    let (status, body) = get(&server.url("/search?q=waggle%20dance%20bees"));
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!((v["collection"].as_str(), v["pipeline"].as_str()), (Some("demo"), Some("bm25")), "{v}");
    assert_eq!(v["results"][0]["docid"], "demo-07", "{v}");
    let (_, pipelines) = get(&server.url("/pipelines"));
    let pipelines: serde_json::Value = serde_json::from_str(&pipelines).unwrap();
    let maxp = pipelines["pipelines"].as_array().unwrap().iter().find(|p| p["name"] == "maxp").unwrap();
    assert_eq!(maxp["available"], false, "{pipelines}");
    assert!(maxp["reason"].as_str().unwrap().contains("not in the hub cache"), "{maxp}");
    drop(server);

    // A data directory named in the environment that does not exist yet is made too.
    let mut cmd = std::process::Command::new(BIN);
    isolated(&mut cmd)
        .env("LONGRANK_DATA_DIR", dir.path().join("fresh/nested"))
        .env("LONGRANK_SERVER_ADDR", "127.0.0.1:0")
        .arg("serve")
        .current_dir(dir.path());
    let server = TestServer::spawn(cmd).wait_ready();
    assert_eq!(get(&server.url("/search?q=bees")).0, 200);
    assert!(dir.path().join("fresh/nested/longrank.db").is_file());
}

#[test]
fn demo_never_shadows_a_users_collection() {
    let dir = tempfile::tempdir().unwrap();
    crate::common::cli_ok(
        dir.path(),
        &["index", "--collection", "mine", data("cranfield/docs.jsonl").to_str().unwrap()],
    );
    let server = TestServer::start(dir.path(), &[]).wait_ready();
    let (_, body) = get(&server.url("/collections"));
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let names: Vec<&str> = v.as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["mine"]);
}

#[test]
fn sigterm_shuts_down_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = TestServer::start(dir.path(), &[]).wait_ready();
    unsafe {
        libc::kill(server.child.id() as i32, libc::SIGTERM);
    }
    let status = server.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

/// With keys set: the page, the OpenAPI document and /health need none; reads take a search or an admin key;
/// jobs an admin key; a wrong key is refused without being echoed; no key appears in a job's provenance.
#[test]
fn keys_open_routes_by_what_they_do_and_never_show() {
    let dir = crate::fixtures::cranfield_data_dir();
    let (admin, search) = ("admin-secret-7f3a", "search-secret-91c2");
    let env = [("LONGRANK_SERVER_ADMIN_KEYS", admin), ("LONGRANK_SERVER_SEARCH_KEYS", search)];
    let server = TestServer::start(dir.path(), &env).wait_ready();
    let call = |method: &str, path: &str, key: Option<&str>, body: Option<&str>| {
        let auth = key.map(|k| format!("Bearer {k}"));
        let mut headers = vec![("content-type", "application/json")];
        if let Some(auth) = &auth {
            headers.push(("authorization", auth.as_str()));
        }
        request(method, &server.url(path), &headers, body)
    };
    for open in ["/health", "/", "/openapi.json", "/static/common.js"] {
        assert_eq!(call("GET", open, None, None).status, 200, "{open}");
    }
    let query = r#"{"query": "wing flutter", "k": 3}"#;
    call("POST", "/search", None, Some(query)).assert_error(401, "missing_key");
    let wrong = call("POST", "/search", Some("guess-1234"), Some(query));
    wrong.assert_error(403, "invalid_key");
    assert!(!wrong.body.contains("guess-1234"), "{}", wrong.body);
    assert_eq!(call("POST", "/search", Some(search), Some(query)).status, 200);
    assert_eq!(call("GET", "/search?q=wing", Some(admin), None).status, 200);
    call("GET", "/metrics", None, None).assert_error(401, "missing_key");
    assert_eq!(call("GET", "/metrics", Some(search), None).status, 200);
    let job = serde_json::json!({"topics": "1\twing flutter\n", "k": 5}).to_string();
    call("POST", "/batch", Some(search), Some(&job)).assert_error(403, "insufficient_key");
    let done = call("POST", "/batch?wait=true", Some(admin), Some(&job));
    assert_eq!(done.status, 200, "{}", done.body);
    let id = done.json()["id"].as_str().unwrap().to_string();
    let shown = call("GET", &format!("/batch/{id}"), Some(search), None);
    assert_eq!(shown.status, 200);
    assert!(!shown.body.contains(admin) && !shown.body.contains(search), "a key in the job: {}", shown.body);
    assert_eq!(shown.json()["provenance"]["configuration"]["server"]["admin_keys"][0], "<redacted>");
    call("DELETE", &format!("/batch/{id}"), Some(search), None).assert_error(403, "insufficient_key");
}

/// Beyond loopback without keys: reads serve, writes are refused. On any server: a write from a foreign page
/// is refused (a form post needs no CORS preflight) unless its origin is allowed, and a loopback server answers
/// only to its own names (DNS rebinding).
#[test]
fn writes_need_a_key_beyond_loopback_and_foreign_pages_and_hosts_are_refused() {
    let dir = crate::fixtures::cranfield_data_dir();
    let job = serde_json::json!({"topics": "1\twing flutter\n", "k": 5}).to_string();
    let json = [("content-type", "application/json")];
    let open = TestServer::start_everywhere(dir.path(), &[]).wait_ready();
    assert_eq!(get(&open.url("/search?q=wing")).0, 200);
    post_json(&open.url("/batch"), &job).assert_error(403, "admin_key_required");
    drop(open);

    let app = "https://app.example";
    let server = TestServer::start(dir.path(), &[("LONGRANK_SERVER_CORS_ORIGINS", app)]).wait_ready();
    let own = server.base.clone();
    let posted =
        |origin: &str| request("POST", &server.url("/batch?wait=true"), &[json[0], ("origin", origin)], Some(&job));
    posted("http://evil.example").assert_error(403, "forbidden_origin");
    assert_eq!(posted(&own).status, 200, "the server's own page");
    let allowed = posted(app);
    assert_eq!(allowed.status, 200, "{}", allowed.body);
    assert_eq!(allowed.header("access-control-allow-origin"), Some(app), "a configured origin may read the answer");
    let preflight = request(
        "OPTIONS",
        &server.url("/search"),
        &[
            ("origin", app),
            ("access-control-request-method", "POST"),
            ("access-control-request-headers", "authorization,content-type"),
        ],
        None,
    );
    assert_eq!(preflight.header("access-control-allow-origin"), Some(app));
    let foreign = request("GET", &server.url("/search?q=wing"), &[("origin", "http://evil.example")], None);
    assert_eq!(foreign.status, 200);
    assert_eq!(foreign.header("access-control-allow-origin"), None, "a foreign page may not read the answer");

    request("GET", &server.url("/search?q=wing"), &[("host", "evil.example")], None)
        .assert_error(403, "forbidden_host");
    let port = server.base.rsplit(':').next().unwrap().to_string();
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}"), format!("[::1]:{port}")] {
        assert_eq!(request("GET", &server.url("/search?q=wing"), &[("host", &host)], None).status, 200, "{host}");
    }
    assert_eq!(request("GET", &server.url("/health"), &[("host", "evil.example")], None).status, 200);
}

/// After a load the runtime's blocking threads end (tokio's 10 s keep-alive), and the memory the load left in
/// their heaps goes with them: nothing periodic keeps them alive (the catalog's sync every second did, by waking
/// them in turn; it has a thread of its own).
#[test]
fn blocking_threads_end_after_a_load() {
    let dir = crate::fixtures::cranfield_data_dir();
    let server = TestServer::start(dir.path(), &[]).wait_ready();
    // The runtime's threads (workers and blocking ones share tokio's name; the store's connections and the
    // catalog's sync have their own, and may start during the load).
    let threads = || {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", server.child.id())).unwrap();
        let name = |t: std::fs::DirEntry| std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        tasks.flatten().map(name).filter(|n| n.trim() == "tokio-rt-worker").count()
    };
    let before = threads();
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let url = server.url("/search");
            std::thread::spawn(move || {
                for _ in 0..10 {
                    let r =
                        post_json(&url, r#"{"query": "boundary layer flow", "collection": "cranfield", "k": 1000}"#);
                    assert_eq!(r.status, 200, "{}", r.body);
                }
            })
        })
        .collect();
    clients.into_iter().for_each(|c| c.join().unwrap());
    let loaded = threads();
    assert!(loaded > before, "the load ran on blocking threads: {before} then {loaded}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while threads() > before {
        assert!(std::time::Instant::now() < deadline, "{} threads a minute after the load, {before} before", threads());
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

/// Issue 59 item 4: searches hand their query-log entries to one bounded queue and one writer. With the writer
/// held at its first batch, the queue fills to `server.query_log_queue` and every search past it is dropped and
/// counted, while searches, `GET /batch` and `GET /tasks` still answer; released, the writer writes what was
/// queued, and every search is either in the log or counted dropped.
#[test]
fn the_query_log_is_one_bounded_queue_whose_drops_are_counted() {
    let dir = crate::fixtures::cranfield_data_dir();
    let d = dir.path();
    let (release, log) = (d.join("release"), d.join("serve.log"));
    let hold = format!("query_log.write:1:{}", release.display());
    let env = [("LONGRANK_SERVER_QUERY_LOG_QUEUE", "10"), ("LONGRANK_TEST_HOLD", hold.as_str())];
    let server = TestServer::start_logging(d, &env, &log).wait_ready();
    let search = |q: usize| {
        let reply = post_json(&server.url("/search"), &serde_json::json!({"query": format!("wing {q}")}).to_string());
        assert_eq!(reply.status, 200, "{}", reply.body);
    };
    search(0);
    server.wait_log(&log, "holding at query_log.write");
    for q in 1..=30 {
        search(q);
    }
    for route in ["/batch", "/tasks"] {
        assert_eq!(get(&server.url(route)).0, 200, "{route} while the query log's writer is held");
    }
    let metric = |name: &str| -> f64 {
        let text = get(&server.url("/metrics")).1;
        let line = text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name}:\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let outcome = |o: &str| metric(&format!("longrank_query_log_entries_total{{outcome=\"{o}\"}}"));
    assert_eq!(metric("longrank_query_log_queued "), 10.0, "the queue holds its bound");
    assert_eq!(outcome("dropped_full"), 20.0, "the 20 searches past the bound");
    std::fs::write(&release, "").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while outcome("written") < 11.0 {
        assert!(std::time::Instant::now() < deadline, "the writer never wrote the 11 queued searches");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!((outcome("written"), outcome("dropped_full"), outcome("dropped_failed")), (11.0, 20.0, 0.0));
    assert_eq!(metric("longrank_query_log_queued "), 0.0);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let store = runtime.block_on(longrank::store::Store::open(&d.join("longrank.db"))).unwrap();
    assert_eq!(runtime.block_on(store.query_log_len()).unwrap(), 11);
}
