//! The web page in a real headless Chromium, driven over WebDriver (chromedriver): search with segment
//! evidence, the document view's highlight, and a batch run to its metrics. A failing test leaves a
//! screenshot in `target/tmp/browser-*.png`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{cli_ok, data, post_json, TestServer};

/// A chromedriver process and one browser session; both end when dropped (with a screenshot on panic).
struct Browser {
    driver: Child,
    base: String,
    session: String,
    name: &'static str,
    _profile: tempfile::TempDir,
}

fn find_binary(names: &[&str]) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    names
        .iter()
        .flat_map(|n| std::env::split_paths(&path).map(move |dir| dir.join(n)))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("none of {names:?} on PATH: install chromium and chromium-driver (.ci/run does)"))
}

impl Browser {
    fn start(name: &'static str) -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut command = Command::new(find_binary(&["chromedriver"]));
        command.arg(format!("--port={port}")).stdout(Stdio::null()).stderr(Stdio::null());
        // Like the servers, chromedriver dies with the test thread, even when the test fails before `Drop`.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let driver = command.spawn().expect("start chromedriver");
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while ureq::get(&format!("{base}/status")).call().is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        let profile = tempfile::tempdir().unwrap();
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1200,900",
            &format!("--user-data-dir={}", profile.path().display()),
        ];
        let chromium = find_binary(&["chromium", "chromium-browser", "google-chrome"]);
        let capabilities = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": args}}}});
        let mut browser = Browser { driver, base, session: String::new(), name, _profile: profile };
        let created = browser.call("POST", "/session", Some(capabilities));
        browser.session = created["sessionId"].as_str().expect("a session id").to_string();
        browser
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = if path == "/session" {
            format!("{}{path}", self.base)
        } else {
            format!("{}/session/{}{path}", self.base, self.session)
        };
        let body = body.map(|b| b.to_string());
        let reply = crate::common::request(method, &url, &[("content-type", "application/json")], body.as_deref());
        let value = reply.json();
        assert!(reply.status < 300, "WebDriver {method} {path}: {}", reply.body);
        value["value"].clone()
    }

    fn goto(&self, url: &str) {
        self.call("POST", "/url", Some(json!({"url": url})));
    }

    /// Elements matching a CSS selector now.
    fn find_all(&self, css: &str) -> Vec<String> {
        let found = self.call("POST", "/elements", Some(json!({"using": "css selector", "value": css})));
        found
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_object().unwrap().values().next().unwrap().as_str().unwrap().to_string())
            .collect()
    }

    /// Waits until at least one element matches.
    fn wait_for(&self, css: &str) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let found = self.find_all(css);
            if !found.is_empty() {
                return found;
            }
            assert!(Instant::now() < deadline, "nothing matched {css:?}; page status: {:?}", self.script("return document.getElementById('status').textContent + ' | ' + (document.getElementById('batch-status') || {}).textContent"));
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn click(&self, element: &str) {
        self.call("POST", &format!("/element/{element}/click"), Some(json!({})));
    }

    fn type_into(&self, element: &str, text: &str) {
        self.call("POST", &format!("/element/{element}/value"), Some(json!({"text": text})));
    }

    fn text(&self, element: &str) -> String {
        self.call("GET", &format!("/element/{element}/text"), None).as_str().unwrap().to_string()
    }

    fn script(&self, js: &str) -> Value {
        self.call("POST", "/execute/sync", Some(json!({"script": js, "args": []})))
    }

    fn screenshot(&self) -> Option<PathBuf> {
        let png = self.call("GET", "/screenshot", None);
        let png = decode_base64(png.as_str()?);
        let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("browser-{}.png", self.name));
        std::fs::write(&path, png).ok()?;
        Some(path)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if std::thread::panicking() && !self.session.is_empty() {
            // A screenshot of the page as the failure left it.
            let shot = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.screenshot())).ok().flatten();
            if let Some(path) = shot {
                eprintln!("browser test {}: screenshot at {}", self.name, path.display());
            }
        }
        if !self.session.is_empty() {
            let url = format!("{}/session/{}", self.base, self.session);
            let _ = std::panic::catch_unwind(|| crate::common::request("DELETE", &url, &[], None));
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn decode_base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let clean: Vec<u8> = text.bytes().filter(|c| !matches!(c, b'=' | b'\n' | b'\r')).collect();
    clean
        .chunks(4)
        .flat_map(|chunk| {
            let n = chunk.iter().fold(0u32, |acc, &c| (acc << 6) | value(c) as u32) << (6 * (4 - chunk.len()));
            let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
            bytes.into_iter().take(chunk.len().saturating_sub(1))
        })
        .collect()
}

#[test]
fn search_shows_segment_evidence_and_the_best_segment_in_the_document() {
    let models = tempfile::tempdir().unwrap();
    crate::fixtures::tiny_cross_encoder(models.path(), 23);
    let dir = tempfile::tempdir().unwrap();
    let gov2 = data("trec-format-samples/gov2-style/GX000");
    cli_ok(dir.path(), &["index", "--collection", "gov2", gov2.to_str().unwrap()]);
    let server =
        TestServer::start(dir.path(), &[("LONGRANK_MODEL_PATH", models.path().to_str().unwrap())]).wait_ready();
    let browser = Browser::start("search");

    browser.goto(&server.url("/"));
    let query = browser.wait_for("#q")[0].clone();
    browser.wait_for("#pipeline option[value=maxp]");
    browser.script("const s = document.getElementById('pipeline'); s.value = 'maxp';");
    // U+E007 is WebDriver's Enter key.
    browser.type_into(&query, "oil industry history\u{E007}");
    let results = browser.wait_for("#results li[data-docid]");
    let expected = post_json(
        &server.url("/search"),
        r#"{"query": "oil industry history", "pipeline": "maxp", "k": 10, "depth": 20, "segment_text": true}"#,
    )
    .json();
    let hits = expected["results"].as_array().unwrap();
    assert_eq!(results.len(), hits.len());
    let docids = browser.script("return [...document.querySelectorAll('#results li')].map(li => li.dataset.docid)");
    let want: Vec<Value> = hits.iter().map(|h| h["docid"].clone()).collect();
    assert_eq!(docids.as_array().unwrap(), &want);
    // One strip button per segment, and the passage shown first is the best segment.
    let first = &hits[0];
    let strip = browser.find_all("#results li:first-child .strip .seg");
    assert_eq!(strip.len(), first["segments"].as_array().unwrap().len());
    let passage_text = || {
        let shown = browser
            .script("return document.querySelector('#results li:first-child .passage span:last-child').textContent");
        shown.as_str().unwrap().to_string()
    };
    let best_text = first["best_segment"]["text"].as_str().unwrap();
    assert_eq!(passage_text(), best_text);
    // Clicking another segment shows its text.
    if strip.len() > 1 {
        let other = first["segments"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["index"] != first["best_segment"]["index"])
            .unwrap();
        let button = &strip[other["index"].as_u64().unwrap() as usize];
        browser.click(button);
        assert_eq!(passage_text(), other["text"].as_str().unwrap());
    }
    // The title opens the document with the best segment highlighted (byte offsets turned into UTF-16).
    let title = browser.find_all("#results li:first-child .title")[0].clone();
    browser.click(&title);
    let best = browser.wait_for("#doc-text mark.best")[0].clone();
    let shown = browser.script("return document.getElementById('best-segment').textContent");
    assert_eq!(shown.as_str().unwrap(), best_text);
    assert!(!browser.text(&best).is_empty());
    // The URL holds the search, and the back button returns to the previous one.
    let url = browser.script("return location.search").as_str().unwrap().to_string();
    assert!(url.contains("q=oil+industry+history") && url.contains("pipeline=maxp"), "{url}");
    let query = browser.find_all("#q")[0].clone();
    browser.call("POST", &format!("/element/{query}/clear"), Some(json!({})));
    browser.type_into(&query, "pearls\u{E007}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !browser.script("return location.search").as_str().unwrap().contains("q=pearls") {
        assert!(Instant::now() < deadline, "the second search never reached the URL");
        std::thread::sleep(Duration::from_millis(50));
    }
    browser.call("POST", "/back", Some(json!({})));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let shown = browser
            .script("return [document.getElementById('q').value, document.querySelectorAll('#results li').length]");
        if shown[0] == "oil industry history" && shown[1] == hits.len() {
            break;
        }
        assert!(Instant::now() < deadline, "back did not restore the first search: {shown}");
        std::thread::sleep(Duration::from_millis(50));
    }

    // An error is the server's message, not a stack trace.
    browser.goto(&server.url("/?q=oil&k=100000"));
    browser.wait_for("#status.error");
    let status = browser.script("return document.getElementById('status').textContent");
    assert!(status.as_str().unwrap().contains("k must be between 1 and"), "{status}");
}

#[test]
fn a_batch_run_shows_progress_then_metrics_and_compares() {
    let dir = crate::fixtures::cranfield_data_dir();
    let server = TestServer::start(dir.path(), &[]).wait_ready();
    let browser = Browser::start("batch");
    browser.goto(&server.url("/?view=batch"));
    // Chromium takes only canonical paths for uploads.
    let topics = std::fs::canonicalize(data("cranfield/topics.tsv")).unwrap();
    let qrels = std::fs::canonicalize(data("cranfield/qrels.txt")).unwrap();
    let mut runs: Vec<String> = Vec::new();
    for pipeline in ["bm25", "bm25+rm3"] {
        browser.wait_for(&format!("#batch-pipeline option[value='{pipeline}']"));
        browser.script(&format!("document.getElementById('batch-pipeline').value = '{pipeline}'"));
        browser.type_into(&browser.find_all("#topics-file")[0], topics.to_str().unwrap());
        browser.type_into(&browser.find_all("#qrels-file")[0], qrels.to_str().unwrap());
        browser.click(&browser.find_all("#batch-form button[type=submit]")[0]);
        // The new run's page follows the job until its metrics table appears (read in one script: the page
        // re-renders while it polls).
        let visible = "#job-results:not([hidden]) #job-metrics tr[data-measure=map]";
        let state = format!(
            "const id = new URLSearchParams(location.search).get('job'); const row = document.querySelector('{visible} td'); \
             return [id, document.getElementById('job-title').textContent, row && row.textContent, \
             document.querySelectorAll('#job-chart rect').length]"
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        let shown = loop {
            let shown = browser.script(&state);
            let id = shown[0].as_str().unwrap_or_default().to_string();
            let fresh = !id.is_empty() && !runs.contains(&id) && shown[1].as_str().unwrap().contains(&id);
            if fresh && shown[2].is_string() {
                break shown;
            }
            assert!(Instant::now() < deadline, "the {pipeline} run never showed its metrics: {shown}");
            std::thread::sleep(Duration::from_millis(100));
        };
        let map: f64 = shown[2].as_str().unwrap().parse().unwrap();
        assert!((0.1..0.6).contains(&map), "MAP {map}");
        assert_eq!(shown[3], 225, "one bar per cranfield topic");
        runs.push(shown[0].as_str().unwrap().to_string());
        // Reloading keeps the run: jobs come from the server.
        browser.goto(&server.url(&format!("/?view=batch&job={}", runs.last().unwrap())));
        browser.wait_for(visible);
        // Clear the file inputs for the next run.
        browser.script("document.getElementById('batch-form').reset()");
    }
    browser.goto(&server.url(&format!("/?view=batch&a={}&b={}&measure=map", runs[0], runs[1])));
    browser.wait_for("#compare-result:not([hidden]) #compare-table tbody tr");
    let shown = browser.script(
        "return [document.querySelectorAll('#compare-table tbody tr').length, \
         document.querySelectorAll('#compare-chart rect').length, document.querySelectorAll('#jobs tbody tr').length]",
    );
    assert!(shown[0].as_u64().unwrap() > 5, "{shown}");
    assert_eq!(shown[1], 225, "one delta per topic");
    assert_eq!(shown[2], 2, "both runs listed");
}

/// A server with keys: the page asks for one, then searches, follows a job (its warnings shown) and downloads its
/// run with it.
#[test]
fn the_page_works_with_keys_downloads_included() {
    let dir = crate::fixtures::cranfield_data_dir();
    let key = "page-key-5d1e";
    let server = TestServer::start(dir.path(), &[("LONGRANK_SERVER_ADMIN_KEYS", key)]).wait_ready();
    let job = crate::common::request(
        "POST",
        &server.url("/batch?wait=true"),
        &[("content-type", "application/json"), ("authorization", &format!("Bearer {key}"))],
        Some(r#"{"topics": "1\twing flutter\n2\theat transfer\n3\tzzzzqqq\n", "k": 5}"#),
    );
    assert_eq!(job.status, 200, "{}", job.body);
    let id = job.json()["id"].as_str().unwrap().to_string();
    let run = crate::common::request(
        "GET",
        &server.url(&format!("/batch/{id}/run")),
        &[("authorization", &format!("Bearer {key}"))],
        None,
    )
    .body;

    let browser = Browser::start("keys");
    browser.goto(&server.url(&format!("/?view=batch&job={id}")));
    let field = browser.wait_for("#key-form:not([hidden]) #key")[0].clone();
    browser.type_into(&field, &format!("{key}\u{E007}"));
    browser.wait_for("#job-download:not([hidden])");
    // The job's warnings are shown as the server words them.
    assert_eq!(browser.find_all("#job-warnings li").len(), 1);
    let warning = browser.text(&browser.find_all("#job-warnings li")[0]);
    assert!(warning.starts_with("1 topic retrieved nothing") && warning.ends_with(": 3"), "{warning}");
    // The run arrives through the page's own download (fetched with the key), caught as it is saved.
    browser.script(
        "URL.createObjectURL = (blob) => { blob.text().then((t) => { window.__run = t; }); return 'blob:caught'; }; \
         URL.revokeObjectURL = () => {};",
    );
    browser.click(&browser.find_all("#job-download")[0]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let downloaded = loop {
        if let Some(text) = browser.script("return window.__run || null").as_str() {
            break text.to_string();
        }
        assert!(Instant::now() < deadline, "the run was never downloaded");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(downloaded, run);
    browser.goto(&server.url("/?q=wing+flutter"));
    let hits = browser.wait_for("#results li[data-docid]");
    assert_eq!(hits.len(), 10, "the session's key serves searches too");
}
