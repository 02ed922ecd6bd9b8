//! The topics of batch jobs as a work queue that replicas share: a worker claims one topic with a lease,
//! renews it while it works, and commits the topic's run lines in one transaction that succeeds only while it
//! still holds the lease under the same attempt, so a replica that stalled and came back cannot commit a
//! stale result. Times are the database's clock, the one clock every replica sees. On PostgreSQL claims skip
//! rows another transaction has locked (`FOR UPDATE SKIP LOCKED`); SQLite has one writer at a time, so its
//! claims are serialized anyway.

use sqlx::Row;

use super::{now_rfc3339, Backend, JobStatus, Store, StoreError};

/// One topic a worker holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub job_id: String,
    pub seq: i64,
    /// How many times the topic was claimed, this claim included (above 1: a retry).
    pub attempt: i64,
    pub owner: String,
}

/// What a replica can run exactly: the fingerprints of the collections it serves and the weights hashes of
/// its models. A job submitted against other index files or weights is left to replicas that have them.
#[derive(Debug, Clone, Default)]
pub struct Serves {
    pub fingerprints: Vec<String>,
    pub weights: Vec<String>,
}

impl Serves {
    /// `,a,b,`: a list SQL matches a value in with LIKE on either backend.
    pub(super) fn list(values: &[String]) -> String {
        format!(",{},", values.join(","))
    }
}

/// Which jobs a worker takes topics of: workers of their own keep jobs that need no model from waiting
/// behind model work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Jobs whose pipeline re-ranks with a model.
    Model,
    /// Jobs whose pipeline needs no model (bm25, bm25+rm3).
    FirstStage,
}

/// What a topic's commit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Committed {
    /// Stored; topics of the job remain.
    Topic,
    /// Stored, the job's last topic: the job is done, with its metrics.
    Job,
    /// Refused: the lease was lost (it ran out, or the topic was claimed again, or the job finished meanwhile).
    Fenced,
    /// Refused: the job, with the lease still held, is no longer queued or running (cancelled, failed,
    /// deleted).
    Stopped,
}

/// A finished job's metrics (JSON, when there are qrels) and warnings (JSON); `complete`'s error fails the job
/// instead.
pub struct Completion {
    pub metrics: Option<String>,
    pub warnings: String,
}

impl Store {
    /// The database's time in milliseconds since the epoch, as SQL.
    pub(super) fn now_ms(&self) -> &'static str {
        match self.backend {
            Backend::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)",
            Backend::Postgres => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
        }
    }

    /// Claims a topic free to run for `lease_ms`, among the jobs of `lane` this replica `serves` (any, when none
    /// is given), and marks its job running. Jobs share the workers round-robin: the topic is of the job whose
    /// topics were claimed longest ago (one never claimed first, then the oldest), the first in file order.
    pub async fn claim_topic(
        &self,
        owner: &str,
        lease_ms: i64,
        serves: Option<&Serves>,
        lane: Lane,
    ) -> Result<Option<Claim>, StoreError> {
        let now = self.now_ms();
        let skip_locked = match self.backend {
            Backend::Sqlite => "",
            Backend::Postgres => "FOR UPDATE OF t SKIP LOCKED",
        };
        let lane = match lane {
            Lane::Model => "AND j.weights IS NOT NULL",
            Lane::FirstStage => "AND j.weights IS NULL",
        };
        // The free condition is repeated outside the subquery: PostgreSQL re-checks it on a row another
        // transaction changed meanwhile.
        let row = sqlx::query(&format!(
            "UPDATE job_tasks SET owner = $1, attempt = attempt + 1, lease_until = {now} + $2 \
             WHERE (job_id, seq) = (SELECT t.job_id, t.seq FROM job_tasks t JOIN jobs j ON j.id = t.job_id \
             WHERE j.status IN ('queued', 'running') AND (t.lease_until IS NULL OR t.lease_until < {now}) \
             AND ($3 IS NULL OR j.fingerprint IS NULL OR $3 LIKE ('%,' || j.fingerprint || ',%')) \
             AND ($4 IS NULL OR j.weights IS NULL OR $4 LIKE ('%,' || j.weights || ',%')) {lane} \
             ORDER BY COALESCE(j.claimed_ms, 0), j.created_at, j.id, t.seq LIMIT 1 {skip_locked}) \
             AND (lease_until IS NULL OR lease_until < {now}) RETURNING job_id, seq, attempt"
        ))
        .bind(owner)
        .bind(lease_ms)
        .bind(serves.map(|s| Serves::list(&s.fingerprints)))
        .bind(serves.map(|s| Serves::list(&s.weights)))
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let claim =
            Claim { job_id: row.try_get(0)?, seq: row.try_get(1)?, attempt: row.try_get(2)?, owner: owner.into() };
        sqlx::query(&format!(
            "UPDATE jobs SET claimed_ms = {now}, started_ms = COALESCE(started_ms, {now}), status = CASE WHEN status = 'queued' THEN 'running' ELSE status END, \
             updated_at = CASE WHEN status = 'queued' THEN $1 ELSE updated_at END WHERE id = $2"
        ))
        .bind(now_rfc3339())
        .bind(&claim.job_id)
        .execute(&self.pool)
        .await?;
        Ok(Some(claim))
    }

    /// Extends a lease still held, of a job still running, by `lease_ms` from now; false when it is lost.
    pub async fn renew(&self, claim: &Claim, lease_ms: i64) -> Result<bool, StoreError> {
        let now = self.now_ms();
        let done = sqlx::query(&format!(
            "UPDATE job_tasks SET lease_until = {now} + $1 WHERE job_id = $2 AND seq = $3 AND attempt = $4 \
             AND owner = $5 AND lease_until >= {now} \
             AND EXISTS (SELECT 1 FROM jobs WHERE id = $2 AND status IN ('queued', 'running'))"
        ))
        .bind(lease_ms)
        .bind(&claim.job_id)
        .bind(claim.seq)
        .bind(claim.attempt)
        .bind(&claim.owner)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Stores a claimed topic's run lines, if the lease is still held. The commit of the job's last topic
    /// also finishes the job: `complete` gets the whole run (topics in file order) and gives the metrics, so
    /// they are computed exactly once, under the job row's lock.
    pub async fn commit_topic(
        &self,
        claim: &Claim,
        qid: &str,
        run: &str,
        flops: Option<f64>,
        complete: impl FnOnce(&str) -> Result<Completion, String>,
    ) -> Result<Committed, StoreError> {
        let mut tx = self.pool.begin().await?;
        // A write first: it locks the job row (PostgreSQL), or takes SQLite's write lock, before anything
        // is read. Nothing is kept unless the transaction commits.
        let status = sqlx::query("UPDATE jobs SET updated_at = $1 WHERE id = $2 RETURNING status")
            .bind(now_rfc3339())
            .bind(&claim.job_id)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(status) = status else { return Ok(Committed::Stopped) };
        let held = sqlx::query(&format!(
            "DELETE FROM job_tasks WHERE job_id = $1 AND seq = $2 AND attempt = $3 AND owner = $4 \
             AND lease_until >= {}",
            self.now_ms()
        ))
        .bind(&claim.job_id)
        .bind(claim.seq)
        .bind(claim.attempt)
        .bind(&claim.owner)
        .execute(&mut *tx)
        .await?;
        if held.rows_affected() == 0 {
            return Ok(Committed::Fenced);
        }
        if !matches!(status.try_get::<&str, _>(0)?, "queued" | "running") {
            return Ok(Committed::Stopped);
        }
        // A missing count is written as SQL NULL, never bound: sqlx 0.8's Any driver sends a None f64 as a
        // PostgreSQL float4, and the statement cached with that type then refuses 8-byte values.
        let insert = match flops {
            Some(_) => "INSERT INTO job_topics (job_id, seq, qid, run, flops) VALUES ($1, $2, $3, $4, $5)",
            None => "INSERT INTO job_topics (job_id, seq, qid, run, flops) VALUES ($1, $2, $3, $4, NULL)",
        };
        let mut insert = sqlx::query(insert).bind(&claim.job_id).bind(claim.seq).bind(qid).bind(run);
        if let Some(flops) = flops {
            insert = insert.bind(flops);
        }
        insert.execute(&mut *tx).await?;
        let left: i64 = sqlx::query("SELECT COUNT(*) FROM job_tasks WHERE job_id = $1")
            .bind(&claim.job_id)
            .fetch_one(&mut *tx)
            .await?
            .try_get(0)?;
        if left > 0 {
            tx.commit().await?;
            return Ok(Committed::Topic);
        }
        let rows = sqlx::query("SELECT run FROM job_topics WHERE job_id = $1 ORDER BY seq")
            .bind(&claim.job_id)
            .fetch_all(&mut *tx)
            .await?;
        let mut whole = String::new();
        for row in rows {
            whole.push_str(row.try_get::<&str, _>(0)?);
        }
        let (status, completion, error) = match complete(&whole) {
            Ok(completion) => (JobStatus::Done, completion, None),
            Err(e) => (JobStatus::Failed, Completion { metrics: None, warnings: "[]".into() }, Some(e)),
        };
        sqlx::query(
            "UPDATE jobs SET status = $1, metrics = $2, metrics_all = $3, warnings = $4, updated_at = $5, \
             error = COALESCE($6, error) WHERE id = $7",
        )
        .bind(status.as_str())
        .bind(&completion.metrics)
        .bind(super::jobs::means_of(completion.metrics.as_deref()))
        .bind(&completion.warnings)
        .bind(now_rfc3339())
        .bind(error)
        .bind(&claim.job_id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Committed::Job)
    }

    /// Frees the leases `owner` holds (every lease when none is named: a SQLite store has one process), so
    /// a restarted replica takes its topics again at once rather than after they expire; the jobs they were
    /// of. The attempt stays, so the freed claims can no longer commit.
    pub async fn release_leases(&self, owner: Option<&str>) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query(
            "UPDATE job_tasks SET owner = NULL, lease_until = NULL \
             WHERE lease_until IS NOT NULL AND ($1 IS NULL OR owner = $1) RETURNING job_id",
        )
        .bind(owner)
        .fetch_all(&self.pool)
        .await?;
        let mut jobs: Vec<String> = rows.iter().map(|r| r.try_get(0)).collect::<Result<_, _>>()?;
        jobs.sort();
        jobs.dedup();
        Ok(jobs)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::store::{testing, NewJob};

    async fn job(store: &Store, id: &str, total: i64) {
        let job = NewJob { id, total, ..NewJob::default() };
        store.create_job(job).await.unwrap();
    }

    fn done(metrics: &'static str) -> impl FnOnce(&str) -> Result<Completion, String> {
        move |_| Ok(Completion { metrics: Some(metrics.into()), warnings: "[]".into() })
    }

    #[tokio::test]
    async fn topics_are_claimed_once_in_order_and_stale_commits_are_fenced() {
        for store in testing::stores().await.0 {
            claims_in_order(&store).await;
        }
    }

    async fn claims_in_order(store: &Store) {
        job(store, "a", 2).await;
        job(store, "b", 1).await;
        let first = store.claim_topic("r1", 60_000, None, Lane::FirstStage).await.unwrap().unwrap();
        assert_eq!((first.job_id.as_str(), first.seq, first.attempt), ("a", 0, 1));
        assert_eq!(store.job("a").await.unwrap().unwrap().status, JobStatus::Running);
        assert_eq!(store.job("b").await.unwrap().unwrap().status, JobStatus::Queued);
        // Round-robin: b, never claimed, before a's next topic; then a, claimed longer ago than b.
        let third = store.claim_topic("r3", 1, None, Lane::FirstStage).await.unwrap().unwrap();
        assert_eq!((third.job_id.as_str(), third.seq), ("b", 0));
        let second = store.claim_topic("r2", 60_000, None, Lane::FirstStage).await.unwrap().unwrap();
        assert_eq!((second.job_id.as_str(), second.seq), ("a", 1));
        assert!(store.renew(&first, 60_000).await.unwrap());

        // A lease that runs out is taken by another replica under a new attempt; the first holder's renewal
        // and commit are refused, the new holder's commit stands.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let retry = store.claim_topic("r1", 60_000, None, Lane::FirstStage).await.unwrap().unwrap();
        assert_eq!((retry.job_id.as_str(), retry.seq, retry.attempt), ("b", 0, 2));
        assert!(!store.renew(&third, 60_000).await.unwrap());
        assert_eq!(store.commit_topic(&third, "q", "stale\n", None, done("{}")).await.unwrap(), Committed::Fenced);
        assert_eq!(store.commit_topic(&retry, "q", "b0\n", None, done("{}")).await.unwrap(), Committed::Job);
        assert_eq!(store.run_text("b").await.unwrap(), "b0\n");
        assert!(
            store.claim_topic("r4", 60_000, None, Lane::FirstStage).await.unwrap().is_none(),
            "every topic is held or done"
        );

        // The last commit finishes the job once, with the whole run in file order.
        assert_eq!(store.commit_topic(&second, "2", "a1\n", Some(1.0), done("{}")).await.unwrap(), Committed::Topic);
        let mut seen = None;
        let complete = |run: &str| {
            seen = Some(run.to_string());
            Ok(Completion { metrics: Some(r#"{"all": {"map": 1.0}, "per_topic": {}}"#.into()), warnings: "[]".into() })
        };
        assert_eq!(store.commit_topic(&first, "1", "a0\n", Some(2.0), complete).await.unwrap(), Committed::Job);
        assert_eq!(seen.as_deref(), Some("a0\na1\n"));
        let a = store.job("a").await.unwrap().unwrap();
        assert_eq!((a.status, a.done, a.flops), (JobStatus::Done, 2, Some(3.0)));
        assert_eq!(store.jobs(0, 10).await.unwrap().0[1].metrics.as_deref(), Some(r#"{"all":{"map":1.0}}"#));
        assert!(
            store.claim_topic("r9", 60_000, None, Lane::FirstStage).await.unwrap().is_none(),
            "no topic left to run"
        );
    }

    #[tokio::test]
    async fn cancelled_jobs_stop_and_released_leases_are_retaken() {
        for store in testing::stores().await.0 {
            cancel_and_release(&store).await;
        }
    }

    async fn cancel_and_release(store: &Store) {
        job(store, "c", 2).await;
        let held = store.claim_topic("r1", 60_000, None, Lane::FirstStage).await.unwrap().unwrap();
        let other = store.claim_topic("r2", 60_000, None, Lane::FirstStage).await.unwrap().unwrap();
        // A restarted r1 frees what it held: the topic is claimed again at once, and the old claim is fenced.
        assert_eq!(store.release_leases(Some("r1")).await.unwrap(), ["c"]);
        let again = store.claim_topic("r1", 60_000, None, Lane::FirstStage).await.unwrap().unwrap();
        assert_eq!((again.seq, again.attempt), (held.seq, 2));
        assert_eq!(store.commit_topic(&held, "1", "x\n", None, done("{}")).await.unwrap(), Committed::Fenced);
        store.set_status("c", JobStatus::Cancelled, None).await.unwrap();
        assert!(!store.renew(&other, 60_000).await.unwrap(), "a cancelled job's leases are not renewed");
        assert_eq!(store.commit_topic(&again, "1", "x\n", None, done("{}")).await.unwrap(), Committed::Stopped);
        assert!(store.claim_topic("r3", 60_000, None, Lane::FirstStage).await.unwrap().is_none());
        assert_eq!(store.run_text("c").await.unwrap(), "");

        // A job whose completion fails ends failed, with the reason, in the last commit's transaction.
        job(store, "h", 1).await;
        let last = store.claim_topic("r1", 60_000, None, Lane::FirstStage).await.unwrap().unwrap();
        let failing = |_: &str| Err("the run does not read".to_string());
        assert_eq!(store.commit_topic(&last, "1", "x\n", None, failing).await.unwrap(), Committed::Job);
        let h = store.job("h").await.unwrap().unwrap();
        assert_eq!((h.status, h.error.as_deref(), h.metrics), (JobStatus::Failed, Some("the run does not read"), None));
    }

    #[tokio::test]
    async fn replicas_run_only_jobs_on_the_index_files_and_weights_they_serve() {
        for store in testing::stores().await.0 {
            for (id, fingerprint, weights) in
                [("e", Some("f1"), None), ("f", Some("f2"), Some("w2")), ("g", None, None)]
            {
                let job = NewJob { id, total: 1, fingerprint, weights, ..NewJob::default() };
                store.create_job(job).await.unwrap();
            }
            let serves = |f: &[&str], w: &[&str]| Serves {
                fingerprints: f.iter().map(|s| s.to_string()).collect(),
                weights: w.iter().map(|s| s.to_string()).collect(),
            };
            let claim = |lane, serves: Serves| {
                let store = store.clone();
                async move { store.claim_topic("r", 60_000, Some(&serves), lane).await.unwrap().map(|c| c.job_id) }
            };
            let first_stage = Lane::FirstStage;
            assert_eq!(claim(first_stage, serves(&["f2", "f3"], &["w1"])).await.as_deref(), Some("g"), "other files");
            assert_eq!(claim(Lane::Model, serves(&["f3", "f2"], &["w1"])).await, None, "other weights");
            assert_eq!(claim(Lane::Model, serves(&["f3", "f2"], &["w1", "w2"])).await.as_deref(), Some("f"));
            assert_eq!(claim(first_stage, serves(&["f11"], &[])).await, None, "f11 is not f1");
            assert_eq!(store.claim_topic("r", 60_000, None, Lane::FirstStage).await.unwrap().unwrap().job_id, "e");
        }
    }

    #[tokio::test]
    async fn lanes_take_jobs_by_whether_they_need_a_model() {
        for store in testing::stores().await.0 {
            for (id, weights) in [("m", Some("w")), ("n", None)] {
                store.create_job(NewJob { id, total: 2, weights, ..NewJob::default() }).await.unwrap();
            }
            let claim = |lane| {
                let store = store.clone();
                async move { store.claim_topic("r", 60_000, None, lane).await.unwrap().map(|c| (c.job_id, c.seq)) }
            };
            assert_eq!(claim(Lane::FirstStage).await, Some(("n".into(), 0)));
            assert_eq!(claim(Lane::Model).await, Some(("m".into(), 0)));
            assert_eq!(claim(Lane::FirstStage).await, Some(("n".into(), 1)));
            assert_eq!(claim(Lane::FirstStage).await, None, "m needs a model");
            assert_eq!(claim(Lane::Model).await, Some(("m".into(), 1)));
            assert_eq!(claim(Lane::Model).await, None, "n needs none");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_claims_never_share_a_topic() {
        for store in testing::stores().await.0 {
            job(&store, "d", 40).await;
            let claimers = (0..8).map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    let mut mine = Vec::new();
                    while let Some(claim) =
                        store.claim_topic(&format!("r{i}"), 60_000, None, Lane::FirstStage).await.unwrap()
                    {
                        mine.push(claim.seq);
                    }
                    mine
                })
            });
            let mut all = Vec::new();
            for claimer in claimers {
                all.extend(claimer.await.unwrap());
            }
            assert_eq!(all.len(), 40);
            assert_eq!(all.into_iter().collect::<HashSet<_>>().len(), 40);
        }
    }
}
