//! Collections that travel through an object store (`store.objects`) beside a PostgreSQL store: `longrank index`
//! publishes each version, a replica started with an empty data directory serves what was published and
//! follows new versions and deletions, and a version whose objects are corrupt is never served. Without a
//! PostgreSQL server (CI has one and sets LONGRANK_EXPECT_POSTGRES) the tests that need one return at once.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{
    cli_env, data, get, isolated, post_json, readme_block, run_readme_block, spawn_cli, TestServer, BIN,
};

fn fresh_postgres() -> Option<String> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(longrank::store::testing::fresh_postgres())
}

/// `longrank ARGS` on `dir` against the cluster's store and object store; stdout, insisting it succeeds.
fn cluster_cli(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> String {
    let out = cli_env(dir, args, env);
    assert!(out.status.success(), "longrank {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A served collection's fingerprint (`/health`), None while it is not served.
fn fingerprint(server: &TestServer, collection: &str) -> Option<String> {
    let health: Value = serde_json::from_str(&get(&server.url("/health")).1).unwrap();
    health["fingerprints"][collection].as_str().map(str::to_string)
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A batch job's run on `server`: cranfield's first 40 topics, bm25 then RM3.
fn run_of(server: &TestServer) -> String {
    let topics: String = std::fs::read_to_string(data("cranfield/topics.tsv"))
        .unwrap()
        .lines()
        .take(40)
        .map(|l| format!("{l}\n"))
        .collect();
    let body = json!({"collection": "cranfield", "topics": topics, "k": 100, "pipeline": "bm25+rm3"});
    let job = post_json(&server.url("/batch?wait=true"), &body.to_string()).json();
    assert_eq!(job["status"], "done", "{job}");
    get(&server.url(&format!("/batch/{}/run", job["id"].as_str().unwrap()))).1
}

/// Files in the version `longrank index` published, and how many it uploaded (its report's last line).
fn uploads(report: &str) -> (u64, u64) {
    let line = report.lines().find(|l| l.starts_with("published version")).unwrap_or_else(|| panic!("{report}"));
    let counts = line.rsplit(": ").next().unwrap();
    let numbers: Vec<u64> = counts.split(' ').filter_map(|w| w.parse().ok()).collect();
    (numbers[0], numbers[1])
}

/// The object stores to test: a directory, and the S3-compatible server CI starts (LONGRANK_TEST_S3, its
/// endpoint; moto's server mode), each a new bucket; with the AWS settings its processes need.
fn object_stores(dir: &Path) -> Vec<(String, Vec<(&'static str, String)>)> {
    let mut stores = vec![(format!("file://{}", dir.display()), vec![])];
    let Ok(endpoint) = std::env::var("LONGRANK_TEST_S3") else {
        assert!(
            std::env::var_os("LONGRANK_EXPECT_S3").is_none(),
            "LONGRANK_EXPECT_S3 is set but LONGRANK_TEST_S3 is not"
        );
        return stores;
    };
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let bucket = format!("longrank-{}-{}", std::process::id(), NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let created = crate::common::request("PUT", &format!("{endpoint}/{bucket}"), &[], None);
    assert_eq!(created.status, 200, "creating bucket {bucket}: {}", created.body);
    let aws = [
        ("AWS_ENDPOINT_URL", endpoint),
        ("AWS_ACCESS_KEY_ID", "test".into()),
        ("AWS_SECRET_ACCESS_KEY", "test".into()),
        ("AWS_REGION", "us-east-1".into()),
        ("AWS_ALLOW_HTTP", "true".into()),
    ];
    stores.push((format!("s3://{bucket}/a/prefix"), aws.to_vec()));
    stores
}

#[test]
fn an_empty_replica_serves_what_was_published_and_follows_new_versions_and_deletions() {
    let dir = tempfile::tempdir().unwrap();
    for (objects, aws) in object_stores(dir.path()) {
        let Some(url) = fresh_postgres() else { return };
        let mut env = vec![("LONGRANK_STORE_URL", url.as_str()), ("LONGRANK_STORE_OBJECTS", objects.as_str())];
        env.extend(aws.iter().map(|(k, v)| (*k, v.as_str())));
        travels(&env);
    }
}

/// A collection indexed, published and followed through the cluster `env` names.
fn travels(env: &[(&str, &str)]) {
    let (writer, replica_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let docs = data("cranfield/docs.jsonl");
    let first = cluster_cli(writer.path(), env, &["index", "--collection", "cranfield", docs.to_str().unwrap()]);
    let (files, uploaded) = uploads(&first);
    // Every file's content once (two files of one content are one object).
    assert!(uploaded > files / 2, "a first version uploads its files: {first}");

    let replica = TestServer::start(replica_dir.path(), env).wait_ready();
    // The writer's own copy, served alone on SQLite: the replica's runs must be byte-identical to its.
    let single = TestServer::start(writer.path(), &[]).wait_ready();
    let published = fingerprint(&single, "cranfield").unwrap();
    assert_eq!(fingerprint(&replica, "cranfield").as_deref(), Some(published.as_str()), "served before readiness");
    assert_eq!(run_of(&replica), run_of(&single));

    // One more document: a version that shares every segment but the new one with the first.
    let extra = writer.path().join("extra.jsonl");
    std::fs::write(
        &extra,
        "{\"id\": \"extra-1\", \"title\": \"extra\", \"text\": \"wing flutter at supersonic speed\"}\n",
    )
    .unwrap();
    let second = cluster_cli(writer.path(), env, &["index", "--collection", "cranfield", extra.to_str().unwrap()]);
    let (files, uploaded) = uploads(&second);
    assert!(uploaded > 0 && uploaded < files, "only the new commit's files are sent: {second}");
    wait_until("the replica serves the new version", || {
        fingerprint(&replica, "cranfield").is_some_and(|f| f != published)
    });
    assert_eq!(fingerprint(&replica, "cranfield"), fingerprint(&single, "cranfield"));
    let hit = get(&replica.url("/search?q=wing+flutter+supersonic+extra&collection=cranfield&k=1")).1;
    assert!(hit.contains("extra-1"), "{hit}");
    assert_eq!(run_of(&replica), run_of(&single));
    drop(single);

    // Publishing again with nothing committed records nothing.
    let again = cluster_cli(writer.path(), env, &["index", "--collection", "cranfield", extra.to_str().unwrap()]);
    assert!(again.contains("unchanged"), "{again}");

    cluster_cli(writer.path(), env, &["collections", "delete", "cranfield"]);
    wait_until("the replica drops the deleted collection", || fingerprint(&replica, "cranfield").is_none());
    assert!(!replica_dir.path().join("collections/cranfield").exists());
}

/// Cranfield indexed and published to a directory's object store, and an empty replica's data directory.
struct Published {
    url: String,
    writer: tempfile::TempDir,
    replica_dir: tempfile::TempDir,
    store: tempfile::TempDir,
    objects: String,
}

fn published() -> Option<Published> {
    let url = fresh_postgres()?;
    let (writer, replica_dir, store) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let objects = format!("file://{}", store.path().display());
    let env = [("LONGRANK_STORE_URL", url.as_str()), ("LONGRANK_STORE_OBJECTS", objects.as_str())];
    let docs = data("cranfield/docs.jsonl");
    cluster_cli(writer.path(), &env, &["index", "--collection", "cranfield", docs.to_str().unwrap()]);
    Some(Published { url, writer, replica_dir, store, objects })
}

#[test]
fn a_publish_killed_midway_is_never_served_and_the_next_completes_it() {
    let Some(Published { url, writer, replica_dir, store, objects }) = published() else { return };
    let env = [("LONGRANK_STORE_URL", url.as_str()), ("LONGRANK_STORE_OBJECTS", objects.as_str())];
    let replica = TestServer::start(replica_dir.path(), &env).wait_ready();
    let first = fingerprint(&replica, "cranfield").unwrap();
    let stored = || std::fs::read_dir(store.path().join("objects")).unwrap().count();
    let before = stored();

    // The next version's first object uploaded, then the writer killed before its manifest is recorded.
    let extra = writer.path().join("extra.jsonl");
    std::fs::write(&extra, "{\"id\": \"extra-1\", \"title\": \"extra\", \"text\": \"wing flutter\"}\n").unwrap();
    let mut env_held = env.to_vec();
    env_held.push(("LONGRANK_TEST_HOLD", "publish.object:1"));
    let mut cli = spawn_cli(writer.path(), &["index", "--collection", "cranfield", extra.to_str().unwrap()], &env_held);
    wait_until("the killed publish uploaded an object", || stored() > before);
    cli.kill().unwrap();
    cli.wait().unwrap();
    // Two of the replica's pulls later it still serves the first version, whole.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(fingerprint(&replica, "cranfield"), Some(first.clone()));
    assert!(!replica_dir.path().join("collections/.cranfield.fetching").exists());

    // The next run finds the documents committed and publishes them, reusing the object already sent.
    let next = cluster_cli(writer.path(), &env, &["index", "--collection", "cranfield", extra.to_str().unwrap()]);
    assert!(next.contains("1 files already indexed"), "{next}");
    let (_, uploaded) = uploads(&next);
    assert_eq!(stored(), before + uploaded as usize + 1, "{next}");
    wait_until("the replica serves the completed version", || {
        fingerprint(&replica, "cranfield").is_some_and(|f| f != first)
    });
    let hit = get(&replica.url("/search?q=wing+flutter+extra&collection=cranfield&k=1")).1;
    assert!(hit.contains("extra-1"), "{hit}");
}

#[test]
fn a_version_with_a_corrupt_object_is_not_served() {
    let Some(Published { url, writer: _writer, replica_dir, store, objects }) = published() else { return };
    let env = [("LONGRANK_STORE_URL", url.as_str()), ("LONGRANK_STORE_OBJECTS", objects.as_str())];
    // Every object altered: the replica fetches, finds a hash that is not the object's name, and serves nothing.
    for entry in std::fs::read_dir(store.path().join("objects")).unwrap() {
        std::fs::write(entry.unwrap().path(), "altered").unwrap();
    }
    let log = replica_dir.path().join("serve.log");
    let replica = TestServer::start_logging(replica_dir.path(), &env, &log).wait_ready();
    assert_eq!(fingerprint(&replica, "cranfield"), None);
    replica.wait_log(&log, "is corrupt");
    assert!(!replica_dir.path().join("collections/cranfield").exists());
}

#[test]
fn an_object_store_without_postgres_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let objects = format!("file://{}", dir.path().join("objects").display());
    let expected = "store.objects needs a PostgreSQL store";
    let mut serve = Command::new(BIN);
    isolated(&mut serve).arg("--data-dir").arg(dir.path()).args(["serve", "--addr", "127.0.0.1:0"]);
    let out = serve.env("LONGRANK_STORE_OBJECTS", &objects).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains(expected), "{}", String::from_utf8_lossy(&out.stderr));
    let docs = data("cranfield/docs.jsonl");
    let out = cli_env(
        dir.path(),
        &["index", "--collection", "c", docs.to_str().unwrap()],
        &[("LONGRANK_STORE_OBJECTS", &objects)],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains(expected));
    assert!(!dir.path().join("collections/c").exists(), "refused before building");
}

#[test]
fn readme_object_store_section_works_as_written() {
    if !Path::new("/usr/lib/postgresql").exists() {
        assert!(std::env::var_os("LONGRANK_EXPECT_POSTGRES").is_none(), "CI installs PostgreSQL");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let block = readme_block("Collections through an object store", "LONGRANK_STORE_OBJECTS", tmp.path());
    // A block that fails midway leaves no server holding the test's pipe.
    let script =
        format!("trap 'kill $(jobs -p) 2> /dev/null || true' EXIT\n{}", block.replace("8081", &port.to_string()));
    struct Stop(std::path::PathBuf);
    impl Drop for Stop {
        fn drop(&mut self) {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/postgres.sh");
            let _ = Command::new("bash").arg(script).arg("stop").arg(&self.0).output();
        }
    }
    let _stop = Stop(tmp.path().join("objects-pg"));
    let out = run_readme_block(&script);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "README's object store commands failed: {stdout}");
    assert!(stdout.contains("published version 1"), "{stdout}");
    assert!(stdout.contains("\"docid\":\"d1\""), "the empty replica served the published document: {stdout}");
}
