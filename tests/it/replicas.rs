//! Replicas sharing a PostgreSQL store and one data directory: a batch job's topics are claimed with leases by
//! every replica's workers, so the job survives a replica's kill -9 and a replica stopped past its lease
//! cannot commit a stale result. Each test gets a fresh database; without a PostgreSQL server (CI has one and
//! sets LONGRANK_EXPECT_POSTGRES) they return at once.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{data, fresh_postgres, get, post_json, wait_for_job, Cluster, TestServer, BIN};

const LEASE_MS: &str = "1500";

/// A replica named `name` on `url`'s store, with a short lease, logging to `log`.
fn replica(dir: &Path, url: &str, name: &str, hold: Option<&str>, log: &Path) -> TestServer {
    let mut env = vec![("LONGRANK_STORE_URL", url), ("LONGRANK_BATCH_LEASE_MS", LEASE_MS)];
    env.push(("LONGRANK_SERVER_REPLICA_ID", name));
    if let Some(hold) = hold {
        env.push(("LONGRANK_TEST_HOLD", hold));
    }
    TestServer::start_logging(dir, &env, log).wait_ready()
}

/// 60 topics made from cranfield's, with qrels.
fn job_body() -> Value {
    let topics: String = std::fs::read_to_string(data("cranfield/topics.tsv"))
        .unwrap()
        .lines()
        .take(60)
        .map(|l| format!("{l}\n"))
        .collect();
    let qrels = std::fs::read_to_string(data("cranfield/qrels.txt")).unwrap();
    json!({"collection": "cranfield", "topics": topics, "qrels": qrels, "k": 100, "pipeline": "bm25+rm3"})
}

/// The same job run by one process on a SQLite store: its run and metrics.
fn single_process_run(body: &Value) -> (String, Value) {
    let dir = crate::fixtures::cranfield_data_dir();
    let server = TestServer::start(dir.path(), &[]).wait_ready();
    let job = post_json(&server.url("/batch?wait=true"), &body.to_string()).json();
    assert_eq!(job["status"], "done", "{job}");
    (get(&server.url(&format!("/batch/{}/run", job["id"].as_str().unwrap()))).1, job["metrics"].clone())
}

/// A counter of `/metrics`, summed over events named `event`.
fn topics_counter(server: &TestServer, event: &str) -> u64 {
    let (_, text) = get(&server.url("/metrics"));
    let prefix = "longrank_batch_topics_total{";
    text.lines()
        .filter(|l| l.starts_with(prefix) && l.contains(&format!("event=\"{event}\"")))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// Topics in the run, in order of appearance, each once.
fn topics_in(run: &str) -> Vec<&str> {
    let mut topics: Vec<&str> = run.lines().map(|l| l.split(' ').next().unwrap()).collect();
    topics.dedup();
    topics
}

#[test]
fn a_job_survives_the_kill_of_a_replica_and_equals_a_single_process_run() {
    let Some(url) = fresh_postgres() else { return };
    let dir = crate::fixtures::cranfield_data_dir();
    let logs = tempfile::tempdir().unwrap();
    let log = |name: &str| logs.path().join(format!("{name}.log"));
    // r1 holds, lease in hand, before its third commit: killed there, it dies holding a topic.
    let mut r1 = replica(dir.path(), &url, "r1", Some("batch.commit:3"), &log("r1"));
    let r2 = replica(dir.path(), &url, "r2", None, &log("r2"));
    let r3 = replica(dir.path(), &url, "r3", None, &log("r3"));
    let health: Value = serde_json::from_str(&get(&r2.url("/health")).1).unwrap();
    assert_eq!(health["replica"], "r2");
    assert!(get(&r2.url("/metrics")).1.contains("longrank_replica_info{replica=\"r2\""));

    let body = job_body();
    let id = post_json(&r1.url("/batch"), &body.to_string()).json()["id"].as_str().unwrap().to_string();
    r1.wait_log(&log("r1"), "holding at batch.commit");
    wait_for_job(&r2, &id, |v| v["progress"]["done"].as_i64().unwrap() >= 20);
    r1.child.kill().unwrap(); // SIGKILL, holding a lease
    r1.child.wait().unwrap();

    // Any replica answers for the job; it completes once the dead replica's lease runs out.
    let job = wait_for_job(&r3, &id, |v| v["status"] != "running" && v["status"] != "queued");
    assert_eq!((&job["status"], &job["progress"]), (&json!("done"), &json!({"done": 60, "total": 60})), "{job}");
    assert!(topics_counter(&r2, "retried") + topics_counter(&r3, "retried") >= 1, "no topic was retried");
    let (_, run) = get(&r2.url(&format!("/batch/{id}/run")));
    assert_eq!(topics_in(&run).len(), 60, "every topic exactly once, in order");
    let (single_run, single_metrics) = single_process_run(&body);
    assert!(run == single_run, "the replicas' run differs from a single process's");
    assert_eq!(job["metrics"], single_metrics);

    // The killed replica comes back under its name, passes its health check and takes topics again.
    drop(r1);
    let r1 = replica(dir.path(), &url, "r1", None, &log("r1-again"));
    let body = json!({"collection": "cranfield", "topics": body["topics"], "k": 10});
    let deadline = Instant::now() + Duration::from_secs(60);
    while topics_counter(&r1, "claimed") == 0 {
        let job = post_json(&r1.url("/batch?wait=true"), &body.to_string()).json();
        assert_eq!(job["status"], "done", "{job}");
        assert!(Instant::now() < deadline, "the restarted replica never claimed a topic");
    }
    drop((r2, r3));
}

#[test]
fn a_replica_stopped_past_its_lease_cannot_commit_its_late_result() {
    let Some(url) = fresh_postgres() else { return };
    let dir = crate::fixtures::cranfield_data_dir();
    let logs = tempfile::tempdir().unwrap();
    let go = logs.path().join("go");
    let hold = format!("batch.commit:1:{}", go.display());
    let stalled = replica(dir.path(), &url, "stalled", Some(&hold), &logs.path().join("stalled.log"));
    let body = job_body();
    let id = post_json(&stalled.url("/batch"), &body.to_string()).json()["id"].as_str().unwrap().to_string();
    stalled.wait_log(&logs.path().join("stalled.log"), "holding at batch.commit");
    let pid = stalled.child.id() as i32;
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    // Its lease runs out while it is stopped; another replica runs every topic, the held one included.
    let other = replica(dir.path(), &url, "other", None, &logs.path().join("other.log"));
    let job = wait_for_job(&other, &id, |v| v["status"] != "running" && v["status"] != "queued");
    assert_eq!(job["status"], "done", "{job}");
    assert_eq!(topics_counter(&other, "retried"), 1);
    std::fs::write(&go, "").unwrap();
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let deadline = Instant::now() + Duration::from_secs(30);
    while topics_counter(&stalled, "fenced") == 0 {
        assert!(Instant::now() < deadline, "the late commit was not refused");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (_, run) = get(&other.url(&format!("/batch/{id}/run")));
    assert_eq!(topics_in(&run).len(), 60, "no topic twice");
    let after = other.url(&format!("/batch/{id}"));
    assert_eq!(serde_json::from_str::<Value>(&get(&after).1).unwrap()["progress"]["done"], 60);
    assert!(run == single_process_run(&body).0, "the run differs from a single process's");
}

#[test]
fn searches_through_haproxy_lose_none_while_a_replica_is_killed() {
    let dir = crate::fixtures::cranfield_data_dir();
    let Some(cluster) = Cluster::up(dir.path()) else { return };
    // Balanced per request: consecutive requests on one client reach several replicas.
    let replicas: std::collections::BTreeSet<String> = (0..6)
        .map(|_| {
            serde_json::from_str::<Value>(&get(&format!("{}/health", cluster.front)).1).unwrap()["replica"].to_string()
        })
        .collect();
    assert!(replicas.len() >= 2, "one replica served every request: {replicas:?}");
    let failed = std::sync::atomic::AtomicUsize::new(0);
    let sent = std::sync::atomic::AtomicUsize::new(0);
    let queries = ["wing flutter", "heat transfer", "boundary layer", "supersonic flow", "shock waves"];
    std::thread::scope(|scope| {
        for client in 0..4 {
            let (failed, sent, front) = (&failed, &sent, &cluster.front);
            scope.spawn(move || {
                for i in 0..75 {
                    let url = format!(
                        "{front}/search?query={}&k=10",
                        queries[(client + i) % queries.len()].replace(' ', "+")
                    );
                    let ok = ureq::get(&url).timeout(Duration::from_secs(30)).call().is_ok_and(|r| r.status() == 200);
                    if !ok {
                        failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
        // A replica dies a third of the way through.
        while sent.load(std::sync::atomic::Ordering::Relaxed) < 100 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let pid: i32 = cluster.file("r2.pid").parse().unwrap();
        unsafe { libc::kill(pid, libc::SIGKILL) };
    });
    assert_eq!(sent.into_inner(), 300);
    assert_eq!(failed.into_inner(), 0, "requests failed while a replica died");
    let killed = format!("http://{}/health", cluster.file("r2.addr"));
    assert!(ureq::get(&killed).call().is_err(), "the killed replica still answers");
}

/// `cluster.sh restart N`, run from another directory, brings a killed replica back on its address, and HAProxy's
/// health checks take it back into rotation: requests through the front reach it again.
#[test]
fn cluster_restart_brings_a_killed_replica_back_into_rotation() {
    let dir = crate::fixtures::cranfield_data_dir();
    let Some(cluster) = Cluster::up(dir.path()) else { return };
    let pid: i32 = cluster.file("r2.pid").parse().unwrap();
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let replica = format!("http://{}/health", cluster.file("r2.addr"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while ureq::get(&replica).call().is_ok() {
        assert!(Instant::now() < deadline, "the killed replica still answers");
        std::thread::sleep(Duration::from_millis(50));
    }
    let elsewhere = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster.sh");
    let restarted = Command::new("bash")
        .arg(&script)
        .args(["restart", cluster.dir().to_str().unwrap(), "2"])
        .current_dir(elsewhere.path())
        .env("LONGRANK_BIN", BIN)
        .status()
        .unwrap();
    assert!(restarted.success());
    assert_eq!(get(&replica).0, 200, "back on its address");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let health: Value = serde_json::from_str(&get(&format!("{}/health", cluster.front)).1).unwrap();
        if health["replica"] == "r2" {
            break;
        }
        assert!(Instant::now() < deadline, "HAProxy never sent a request to the restarted replica");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The fingerprint of cranfield as a replica's `/health` and `/collections` show it (the two agree).
fn cranfield_fingerprint(server: &TestServer) -> String {
    let health: Value = serde_json::from_str(&get(&server.url("/health")).1).unwrap();
    let collections: Value = serde_json::from_str(&get(&server.url("/collections")).1).unwrap();
    assert_eq!(health["fingerprints"]["cranfield"], collections[0]["fingerprint"]);
    health["fingerprints"]["cranfield"].as_str().unwrap().to_string()
}

/// Cranfield's data directory, a copy of it (the same fingerprint), and another index of the collection (one
/// more document: another fingerprint).
fn three_data_dirs() -> [tempfile::TempDir; 3] {
    let original = crate::fixtures::cranfield_data_dir();
    let copy = tempfile::tempdir().unwrap();
    let status = Command::new("cp").arg("-r").arg(original.path().join("collections")).arg(copy.path()).status();
    assert!(status.unwrap().success());
    let other = crate::fixtures::cranfield_data_dir();
    let extra = other.path().join("extra.jsonl");
    let document = "{\"id\": \"extra-1\", \"title\": \"extra\", \"text\": \"wing flutter at supersonic speed\"}\n";
    std::fs::write(&extra, document).unwrap();
    crate::common::cli_ok(other.path(), &["index", "--collection", "cranfield", extra.to_str().unwrap()]);
    [original, copy, other]
}

#[test]
fn replicas_leave_jobs_on_other_index_files_to_the_replicas_that_serve_them() {
    let Some(url) = fresh_postgres() else { return };
    let [original, copy, other] = three_data_dirs();

    let logs = tempfile::tempdir().unwrap();
    let log = |name: &str| logs.path().join(format!("{name}.log"));
    // The submitting replica holds before its first commit, lease in hand, until it is killed.
    let mut a = replica(original.path(), &url, "a", Some("batch.commit:1"), &log("a"));
    let b = replica(other.path(), &url, "b", None, &log("b"));
    let fingerprint = cranfield_fingerprint(&a);
    assert_ne!(cranfield_fingerprint(&b), fingerprint, "one more document, another fingerprint");
    let job = post_json(&a.url("/batch"), &job_body().to_string()).json();
    let id = job["id"].as_str().unwrap().to_string();
    a.wait_log(&log("a"), "holding at batch.commit");
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(topics_counter(&b, "claimed"), 0, "a replica on other index files ran the job's topics");
    let (_, view) = get(&b.url(&format!("/batch/{id}")));
    assert_eq!(serde_json::from_str::<Value>(&view).unwrap()["progress"]["done"], 0);

    // A copy of the same files runs the rest, and the held topic once the holder dies.
    let c = replica(copy.path(), &url, "c", None, &log("c"));
    assert_eq!(cranfield_fingerprint(&c), fingerprint, "a copy has the same fingerprint");
    // (All 60 when a starved machine let the holder's lease lapse first: c then retried the held topic.)
    wait_for_job(&c, &id, |v| v["progress"]["done"].as_i64().unwrap() >= 59);
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let job = wait_for_job(&c, &id, |v| v["status"] != "running" && v["status"] != "queued");
    assert_eq!((&job["status"], &job["progress"]["done"]), (&json!("done"), &json!(60)), "{job}");
    assert_eq!(topics_counter(&b, "claimed"), 0);
    assert!(topics_counter(&c, "retried") >= 1);
    // Replicas do not write their collections.
    crate::common::request("PUT", &c.url("/collections/new"), &[], None).assert_error(409, "read_only_replica");
}

#[test]
fn a_job_cancelled_on_one_replica_stops_on_every_replica() {
    let Some(url) = fresh_postgres() else { return };
    let dir = crate::fixtures::cranfield_data_dir();
    let logs = tempfile::tempdir().unwrap();
    let a = replica(dir.path(), &url, "a", None, &logs.path().join("a.log"));
    let b = replica(dir.path(), &url, "b", None, &logs.path().join("b.log"));
    let topics: String = std::fs::read_to_string(data("cranfield/topics.tsv"))
        .unwrap()
        .lines()
        .cycle()
        .take(3000)
        .enumerate()
        .map(|(i, l)| format!("x{i}\t{}\n", l.split_once('\t').unwrap().1))
        .collect();
    let body = json!({"collection": "cranfield", "topics": topics, "k": 100, "pipeline": "bm25+rm3"});
    let id = post_json(&a.url("/batch"), &body.to_string()).json()["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    while topics_counter(&a, "claimed") == 0 || topics_counter(&b, "claimed") == 0 {
        assert!(Instant::now() < deadline, "both replicas never worked on the job");
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = crate::common::request("DELETE", &b.url(&format!("/batch/{id}")), &[], None);
    assert_eq!((r.status, &r.json()["status"]), (200, &json!("cancelled")), "{}", r.body);
    // Within a lease renewal (a third of the lease) every replica has stopped.
    std::thread::sleep(Duration::from_millis(1000));
    let done =
        |server: &TestServer| -> Value { serde_json::from_str(&get(&server.url(&format!("/batch/{id}"))).1).unwrap() };
    let before = done(&a)["progress"]["done"].as_i64().unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let after = done(&a);
    assert_eq!((after["status"].as_str(), after["progress"]["done"].as_i64()), (Some("cancelled"), Some(before)));
    assert!(before < 3000, "the job finished before it was cancelled");
}

/// A job no live replica can run says so (its view, `/metrics`) and resumes when one can; set through the
/// cluster settings (in force on every replica within a heartbeat), a stranded job fails past
/// `batch.stranded_fail_after_ms` with the reason.
#[test]
fn a_stranded_job_reports_itself_then_resumes_or_fails_by_the_cluster_settings() {
    let Some(url) = fresh_postgres() else { return };
    let [original, copy, other] = three_data_dirs();
    let logs = tempfile::tempdir().unwrap();
    let log = |name: &str| logs.path().join(format!("{name}.log"));
    let job = |server: &TestServer, id: &str| -> Value {
        serde_json::from_str(&get(&server.url(&format!("/batch/{id}"))).1).unwrap()
    };
    let stranded_gauge = |server: &TestServer| -> String {
        let text = get(&server.url("/metrics")).1;
        text.lines().find(|l| l.starts_with("longrank_batch_jobs_stranded ")).unwrap_or_default().to_string()
    };

    // Each holds before its first commit, lease in hand, until killed.
    let mut a = replica(original.path(), &url, "a", Some("batch.commit:1"), &log("a"));
    let mut b = replica(other.path(), &url, "b", Some("batch.commit:1"), &log("b"));
    let fingerprint = cranfield_fingerprint(&a);
    let first = post_json(&a.url("/batch"), &job_body().to_string()).json()["id"].as_str().unwrap().to_string();
    a.wait_log(&log("a"), "holding at batch.commit");
    assert!(job(&b, &first).get("stranded").is_none(), "a serves it");
    assert_eq!(stranded_gauge(&b), "longrank_batch_jobs_stranded 0");
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let view = wait_for_job(&b, &first, |v| v.get("stranded").is_some());
    assert_eq!(view["status"], "running", "{view}");
    let message = view["stranded"]["message"].as_str().unwrap();
    assert!(message.contains("no live replica serves the index files") && message.contains(&fingerprint), "{message}");
    assert!(view["stranded"]["fails_at"].is_string(), "{view}");
    assert_eq!(stranded_gauge(&b), "longrank_batch_jobs_stranded 1");
    let cluster: Value = serde_json::from_str(&get(&b.url("/cluster")).1).unwrap();
    assert_eq!(cluster["stranded_jobs"], 1, "{cluster}");
    let live: Vec<(&str, bool)> = cluster["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["id"].as_str().unwrap(), r["live"] == true))
        .collect();
    assert_eq!(live, [("a", false), ("b", true)], "{cluster}");

    // A replica with a copy of the files it was submitted against: it resumes there, and is no longer stranded.
    let c = replica(copy.path(), &url, "c", None, &log("c"));
    let done = wait_for_job(&c, &first, |v| v["status"] != "running" && v["status"] != "queued");
    assert_eq!((&done["status"], &done["progress"]["done"]), (&json!("done"), &json!(60)), "{done}");
    assert!(done.get("stranded").is_none(), "{done}");

    // Settings put on one replica are in force on every other within a heartbeat.
    let settings = json!({"batch.lease_ms": 4000, "batch.stranded_fail_after_ms": 2000}).to_string();
    let put = crate::common::request(
        "PUT",
        &c.url("/cluster/settings"),
        &[("content-type", "application/json")],
        Some(&settings),
    );
    assert_eq!(put.status, 200, "{}", put.body);
    assert_eq!(put.json()["effective"], json!({"batch.lease_ms": 4000, "batch.stranded_fail_after_ms": 2000}));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let cluster: Value = serde_json::from_str(&get(&b.url("/cluster")).1).unwrap();
        if cluster["effective"]["batch.lease_ms"] == 4000 {
            assert_eq!(cluster["settings"], json!({"batch.lease_ms": 4000, "batch.stranded_fail_after_ms": 2000}));
            break;
        }
        assert!(Instant::now() < deadline, "the settings never reached b: {cluster}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let bad = json!({"batch.lease_ms": 10}).to_string();
    crate::common::request("PUT", &c.url("/cluster/settings"), &[("content-type", "application/json")], Some(&bad))
        .assert_error(400, "out_of_range");

    // A job on b's index files, stranded when b dies, fails once stranded for two seconds.
    let second = post_json(&b.url("/batch"), &job_body().to_string()).json()["id"].as_str().unwrap().to_string();
    b.wait_log(&log("b"), "holding at batch.commit");
    b.child.kill().unwrap();
    b.child.wait().unwrap();
    let failed = wait_for_job(&c, &second, |v| v["status"] != "running" && v["status"] != "queued");
    assert_eq!(failed["status"], "failed", "{failed}");
    let error = failed["error"].as_str().unwrap();
    assert!(
        error.starts_with("stranded: no live replica served the index files")
            && error.contains("batch.stranded_fail_after_ms"),
        "{error}"
    );
    assert_eq!(topics_counter(&c, "claimed"), 60, "c ran the first job's topics, none of the second's");
}

/// `cluster.sh add` starts a fourth replica and reloads HAProxy with it: requests through the front reach it,
/// and searches sent meanwhile are all answered (the reload hands the listening socket on).
#[test]
fn cluster_add_puts_a_new_replica_into_rotation_losing_no_request() {
    let dir = crate::fixtures::cranfield_data_dir();
    let Some(cluster) = Cluster::up(dir.path()) else { return };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster.sh");
    let done = std::sync::atomic::AtomicBool::new(false);
    let (sent, failed) = (std::sync::atomic::AtomicUsize::new(0), std::sync::atomic::AtomicUsize::new(0));
    let seen = std::thread::scope(|scope| {
        for _ in 0..2 {
            let (done, sent, failed, front) = (&done, &sent, &failed, &cluster.front);
            scope.spawn(move || {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let url = format!("{front}/search?query=wing+flutter&k=10");
                    if !ureq::get(&url).timeout(Duration::from_secs(30)).call().is_ok_and(|r| r.status() == 200) {
                        failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
        let elsewhere = tempfile::tempdir().unwrap();
        let added = Command::new("bash")
            .arg(&script)
            .args(["add", cluster.dir().to_str().unwrap()])
            .current_dir(elsewhere.path())
            .env("LONGRANK_BIN", BIN)
            .stderr(std::process::Stdio::inherit())
            .output()
            .unwrap();
        assert!(added.status.success());
        assert_eq!(String::from_utf8_lossy(&added.stdout).trim(), "4");
        let deadline = Instant::now() + Duration::from_secs(30);
        let seen = loop {
            let health: Value = serde_json::from_str(&get(&format!("{}/health", cluster.front)).1).unwrap();
            if health["replica"] == "r4" || Instant::now() > deadline {
                break health["replica"].clone();
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        seen
    });
    assert_eq!(seen, "r4", "HAProxy never sent a request to the added replica");
    assert!(sent.into_inner() > 0);
    assert_eq!(failed.into_inner(), 0, "searches failed while HAProxy reloaded");
    let view: Value = serde_json::from_str(&get(&format!("{}/cluster", cluster.front)).1).unwrap();
    let live: Vec<&str> = view["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["live"] == true)
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(live, ["r1", "r2", "r3", "r4"], "{view}");
}

/// A frozen replica (SIGSTOP: its connections open, nothing answered) is taken out of rotation within seconds:
/// searches through HAProxy meanwhile are answered, each within a client's timeout far below HAProxy's server
/// timeout, never held for it.
#[test]
fn a_frozen_replica_holds_no_client_for_long() {
    let dir = crate::fixtures::cranfield_data_dir();
    let Some(cluster) = Cluster::up(dir.path()) else { return };
    let pid: i32 = cluster.file("r2.pid").parse().unwrap();
    let (sent, failed) = (std::sync::atomic::AtomicUsize::new(0), std::sync::Mutex::new(Vec::new()));
    std::thread::scope(|scope| {
        for client in 0..4 {
            let (sent, failed, front) = (&sent, &failed, &cluster.front);
            scope.spawn(move || {
                for i in 0..100 {
                    let url = format!("{front}/search?query=boundary+layer+{client}+{i}&k=10");
                    let started = Instant::now();
                    match ureq::get(&url).timeout(Duration::from_secs(8)).call() {
                        Ok(r) if r.status() == 200 => {}
                        other => failed.lock().unwrap().push(format!(
                            "{:?} after {:?}",
                            other.map(|r| r.status()),
                            started.elapsed()
                        )),
                    }
                    sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
        while sent.load(std::sync::atomic::Ordering::Relaxed) < 50 {
            std::thread::sleep(Duration::from_millis(5));
        }
        unsafe { libc::kill(pid, libc::SIGSTOP) };
    });
    unsafe { libc::kill(pid, libc::SIGCONT) };
    assert_eq!(sent.into_inner(), 400);
    let failed = failed.into_inner().unwrap();
    assert!(failed.is_empty(), "{} of 400 searches failed while a replica was frozen: {failed:?}", failed.len());
}

/// docs/operations.md's cluster commands as written (in a temporary directory instead of /tmp, and with this build for
/// `cargo build` and `cargo run`), from the repository: the cluster serves the collection they index, lists its
/// replicas, takes a fourth, restarts one, and goes down.
#[test]
fn readme_cluster_section_works_as_written() {
    let installed = Command::new("sh").args(["-c", "command -v haproxy"]).output().unwrap().status.success();
    if !installed || !Path::new("/usr/lib/postgresql").exists() {
        assert!(std::env::var_os("LONGRANK_EXPECT_POSTGRES").is_none(), "CI installs HAProxy and PostgreSQL");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let script =
        crate::common::doc_block("docs/operations.md", "Replicas behind HAProxy", "scripts/cluster.sh up", tmp.path());
    assert!(script.contains("cluster.sh down"), "the block takes its cluster down");
    let _down = crate::common::Teardown::new("cluster.sh", "down", tmp.path().join("longrank-cluster"));
    let out = crate::common::run_doc_block(&script, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "docs/operations.md's cluster commands failed: {stdout}");
    assert!(stdout.contains("\"docid\":\"d1\""), "the search found the indexed document: {stdout}");
    // curl's answers end without a newline: the cluster's JSON is read from where it starts.
    let at = stdout.find("{\"replica\":").expect("GET /cluster answered");
    let view: Value = serde_json::Deserializer::from_str(&stdout[at..]).into_iter().next().unwrap().unwrap();
    assert_eq!(view["replicas"].as_array().unwrap().iter().filter(|r| r["live"] == true).count(), 3, "{view}");
}

/// A TCP proxy in front of PostgreSQL that the test takes down (open connections cut, its port closed: new ones
/// refused) and brings back on the same port, as a database server that stops and starts again.
struct Proxy {
    port: u16,
    up: std::sync::Arc<std::sync::atomic::AtomicBool>,
    open: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Proxy {
    fn to(upstream: String) -> Proxy {
        use std::sync::atomic::Ordering;
        let first = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = first.local_addr().unwrap().port();
        let proxy = Proxy { port, up: Default::default(), open: Default::default() };
        proxy.up.store(true, Ordering::SeqCst);
        let (up, open) = (proxy.up.clone(), proxy.open.clone());
        std::thread::spawn(move || {
            let mut listener = Some(first);
            loop {
                if !up.load(Ordering::SeqCst) {
                    listener = None;
                } else if listener.is_none() {
                    listener = std::net::TcpListener::bind(("127.0.0.1", port)).ok();
                }
                let Some(Ok((client, _))) = listener.as_ref().map(|l| {
                    l.set_nonblocking(true).unwrap();
                    l.accept()
                }) else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                client.set_nonblocking(false).unwrap();
                let Ok(server) = std::net::TcpStream::connect(&upstream) else { continue };
                open.lock().unwrap().extend([client.try_clone().unwrap(), server.try_clone().unwrap()]);
                for (mut from, mut to) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)]
                {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        proxy
    }

    fn down(&self) {
        self.up.store(false, std::sync::atomic::Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(50)); // the port closed
        for stream in self.open.lock().unwrap().drain(..) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }

    fn back(&self) {
        self.up.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Issue 59 item 5: while PostgreSQL does not answer, reads of the store answer 503 `store_unavailable` (after
/// the pool's two-second wait for a connection, not sqlx's thirty, which ran into the request's timeout), and
/// answer again once it is back.
#[test]
fn reads_of_the_store_answer_503_while_postgres_is_down() {
    let Some(url) = fresh_postgres() else { return };
    let (authority, path) = url.strip_prefix("postgres://").unwrap().split_once('/').unwrap();
    let (credentials, upstream) = authority.rsplit_once('@').unwrap();
    let proxy = Proxy::to(upstream.to_string());
    let proxied = format!("postgres://{credentials}@127.0.0.1:{}/{path}", proxy.port);
    let dir = crate::fixtures::cranfield_data_dir();
    // A request still waiting after 10 s is answered 503 `timeout`: as sqlx's default wait for a connection
    // (30 s) would have it.
    let env = [("LONGRANK_STORE_URL", proxied.as_str()), ("LONGRANK_SERVER_REQUEST_TIMEOUT_MS", "10000")];
    let server = TestServer::start(dir.path(), &env).wait_ready();
    let body = json!({"topics": "1\twing flutter\n", "collection": "cranfield"});
    let job = post_json(&server.url("/batch?wait=true"), &body.to_string()).json();
    assert_eq!(job["status"], "done", "{job}");
    let job_url = server.url(&format!("/batch/{}", job["id"].as_str().unwrap()));
    proxy.down();
    for url in [job_url.clone(), server.url("/batch"), server.url("/tasks")] {
        let reply = crate::common::request("GET", &url, &[], None);
        reply.assert_error(503, "store_unavailable");
        assert!(reply.header("retry-after").is_some(), "{url}");
    }
    proxy.back();
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(&job_url).0 != 200 {
        assert!(Instant::now() < deadline, "the store never answered again");
        std::thread::sleep(Duration::from_millis(100));
    }
}
