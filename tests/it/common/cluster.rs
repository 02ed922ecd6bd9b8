//! The cluster the tests stand up: a fresh PostgreSQL database per test, and `scripts/cluster.sh`'s replicas
//! behind HAProxy on a data directory.

use std::path::Path;
use std::process::Command;

use super::BIN;

/// A fresh database on the PostgreSQL server the tests were given (`LONGRANK_TEST_POSTGRES`); None without one.
pub fn fresh_postgres() -> Option<String> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(longrank::store::testing::fresh_postgres())
}

/// `scripts/cluster.sh up` on a data directory, taken down when dropped.
pub struct Cluster {
    run: tempfile::TempDir,
    pub front: String,
}

impl Cluster {
    pub fn up(data: &Path) -> Option<Cluster> {
        Cluster::up_with(data, &[])
    }

    /// `up` with more settings for the replicas (`LONGRANK_*`), None without HAProxy or PostgreSQL.
    pub fn up_with(data: &Path, env: &[(&str, &str)]) -> Option<Cluster> {
        let installed = |tool: &str| {
            Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().unwrap().status.success()
        };
        if !installed("haproxy") || !Path::new("/usr/lib/postgresql").exists() {
            assert!(std::env::var_os("LONGRANK_EXPECT_POSTGRES").is_none(), "CI installs HAProxy and PostgreSQL");
            return None;
        }
        let run = tempfile::tempdir().unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster.sh");
        let out = Command::new("bash")
            .arg(&script)
            .args(["up", run.path().join("cluster").to_str().unwrap(), data.to_str().unwrap()])
            .env("LONGRANK_BIN", BIN)
            .envs(env.iter().copied())
            .stderr(std::process::Stdio::inherit())
            .output()
            .unwrap();
        let front = String::from_utf8(out.stdout).unwrap().trim().lines().last().unwrap_or_default().to_string();
        let cluster = Cluster { run, front };
        assert!(
            out.status.success() && cluster.front.starts_with("http://"),
            "cluster.sh up failed: {:?}",
            cluster.front
        );
        Some(cluster)
    }

    /// The directory `cluster.sh` keeps the cluster's state in (its replicas' addresses, pids, logs).
    pub fn dir(&self) -> std::path::PathBuf {
        self.run.path().join("cluster")
    }

    pub fn file(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir().join(name)).unwrap().trim().to_string()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        drop(Teardown::new("cluster.sh", "down", self.dir()));
    }
}

/// Runs `bash scripts/SCRIPT VERB DIR` when dropped: stops what a test started (a PostgreSQL server, a cluster)
/// even when the test fails.
pub struct Teardown {
    script: &'static str,
    verb: &'static str,
    dir: std::path::PathBuf,
}

impl Teardown {
    pub fn new(script: &'static str, verb: &'static str, dir: std::path::PathBuf) -> Teardown {
        Teardown { script, verb, dir }
    }
}

impl Drop for Teardown {
    fn drop(&mut self) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts").join(self.script);
        let _ = Command::new("bash").arg(script).arg(self.verb).arg(&self.dir).output();
    }
}
