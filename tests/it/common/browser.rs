//! A real headless Chromium driven over WebDriver (chromedriver), for the page's tests: one session per
//! `Browser`, ended when it is dropped, with a screenshot when a test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};

use super::free_port;

/// A chromedriver process and one browser session; both end when dropped (with a screenshot on panic).
pub struct Browser {
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
    pub fn start(name: &'static str) -> Browser {
        let port = free_port();
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

    pub fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
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

    pub fn goto(&self, url: &str) {
        self.call("POST", "/url", Some(json!({"url": url})));
    }

    /// Elements matching a CSS selector now.
    pub fn find_all(&self, css: &str) -> Vec<String> {
        let found = self.call("POST", "/elements", Some(json!({"using": "css selector", "value": css})));
        found
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_object().unwrap().values().next().unwrap().as_str().unwrap().to_string())
            .collect()
    }

    /// Waits until at least one element matches.
    pub fn wait_for(&self, css: &str) -> Vec<String> {
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

    /// Waits until the first element matching is rendered (the page shows a view after its script has run:
    /// an element there before that cannot take input yet).
    pub fn wait_displayed(&self, css: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let element = self.wait_for(css).remove(0);
            if self.displayed(&element) {
                return element;
            }
            assert!(Instant::now() < deadline, "{css:?} never shown");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn click(&self, element: &str) {
        self.call("POST", &format!("/element/{element}/click"), Some(json!({})));
    }

    pub fn type_into(&self, element: &str, text: &str) {
        self.call("POST", &format!("/element/{element}/value"), Some(json!({"text": text})));
    }

    pub fn text(&self, element: &str) -> String {
        self.call("GET", &format!("/element/{element}/text"), None).as_str().unwrap().to_string()
    }

    /// Whether an element is rendered (WebDriver's "displayed": not `hidden`, not `display: none`).
    pub fn displayed(&self, element: &str) -> bool {
        self.call("GET", &format!("/element/{element}/displayed"), None).as_bool().unwrap()
    }

    pub fn script(&self, js: &str) -> Value {
        self.call("POST", "/execute/sync", Some(json!({"script": js, "args": []})))
    }

    pub fn screenshot(&self) -> Option<PathBuf> {
        let png = self.call("GET", "/screenshot", None);
        let png = base64::engine::general_purpose::STANDARD.decode(png.as_str()?).ok()?;
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
