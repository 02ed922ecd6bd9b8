//! The replicas sharing a store as each sees the others: a heartbeat row per replica (what it serves, when it
//! was last seen, by the database's clock), the jobs no live replica can run (stranded), and the cluster-wide
//! settings, one JSON document.

use sqlx::Row;

use super::{now_rfc3339, JobStatus, Serves, Store, StoreError};

/// A replica as its last heartbeat left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaRow {
    pub id: String,
    pub fingerprints: Vec<String>,
    pub weights: Vec<String>,
    pub started_at: String,
    /// Milliseconds since its last heartbeat.
    pub age_ms: i64,
}

/// A job stranded longer than the time allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrandedJob {
    pub id: String,
    pub fingerprint: String,
    pub weights: Option<String>,
    /// Milliseconds since it was found stranded.
    pub for_ms: i64,
}

/// `,a,b,` back to its values.
fn unlist(text: &str) -> Vec<String> {
    text.split(',').filter(|v| !v.is_empty()).map(str::to_string).collect()
}

impl Store {
    /// Records that `replica` is alive and what it serves.
    pub async fn heartbeat(&self, replica: &str, serves: &Serves, started_at: &str) -> Result<(), StoreError> {
        let now = self.now_ms();
        sqlx::query(&format!(
            "INSERT INTO replicas (id, fingerprints, weights, started_at, seen_ms) VALUES ($1, $2, $3, $4, {now}) \
             ON CONFLICT (id) DO UPDATE SET fingerprints = $2, weights = $3, started_at = $4, seen_ms = {now}"
        ))
        .bind(replica)
        .bind(Serves::list(&serves.fingerprints))
        .bind(Serves::list(&serves.weights))
        .bind(started_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Every replica that sent a heartbeat in the last `within_ms`, by name.
    pub async fn replicas(&self, within_ms: i64) -> Result<Vec<ReplicaRow>, StoreError> {
        let now = self.now_ms();
        let rows = sqlx::query(&format!(
            "SELECT id, fingerprints, weights, started_at, {now} - seen_ms AS age_ms FROM replicas \
             WHERE seen_ms > {now} - $1 ORDER BY id"
        ))
        .bind(within_ms)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(ReplicaRow {
                    id: r.try_get(0)?,
                    fingerprints: unlist(&r.try_get::<String, _>(1)?),
                    weights: unlist(&r.try_get::<String, _>(2)?),
                    started_at: r.try_get(3)?,
                    age_ms: r.try_get(4)?,
                })
            })
            .collect()
    }

    /// Forgets replicas not seen for `ms` (gone for good, or renamed).
    pub async fn forget_replicas(&self, ms: i64) -> Result<u64, StoreError> {
        let now = self.now_ms();
        let sql = format!("DELETE FROM replicas WHERE seen_ms < {now} - $1");
        Ok(sqlx::query(&sql).bind(ms).execute(&self.pool).await?.rows_affected())
    }

    /// Marks the unfinished jobs that no replica seen in the last `live_ms` can run (none serves their index
    /// files, or none their model's weights) stranded from now, and clears the mark of those one can run again.
    pub async fn mark_stranded(&self, live_ms: i64) -> Result<(), StoreError> {
        let now = self.now_ms();
        let served = format!(
            "EXISTS (SELECT 1 FROM replicas r WHERE r.seen_ms > {now} - $1 \
             AND r.fingerprints LIKE ('%,' || jobs.fingerprint || ',%') \
             AND (jobs.weights IS NULL OR r.weights LIKE ('%,' || jobs.weights || ',%')))"
        );
        let unfinished = "status IN ('queued', 'running') AND fingerprint IS NOT NULL";
        sqlx::query(&format!(
            "UPDATE jobs SET stranded_ms = {now} WHERE {unfinished} AND stranded_ms IS NULL AND NOT {served}"
        ))
        .bind(live_ms)
        .execute(&self.pool)
        .await?;
        sqlx::query(&format!("UPDATE jobs SET stranded_ms = NULL WHERE stranded_ms IS NOT NULL AND {served}"))
            .bind(live_ms)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The unfinished jobs stranded for longer than `ms`.
    pub async fn stranded_longer_than(&self, ms: i64) -> Result<Vec<StrandedJob>, StoreError> {
        let now = self.now_ms();
        let rows = sqlx::query(&format!(
            "SELECT id, fingerprint, weights, {now} - stranded_ms FROM jobs \
             WHERE status IN ('queued', 'running') AND stranded_ms < {now} - $1 ORDER BY id"
        ))
        .bind(ms)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(StrandedJob {
                    id: r.try_get(0)?,
                    fingerprint: r.try_get(1)?,
                    weights: r.try_get(2)?,
                    for_ms: r.try_get(3)?,
                })
            })
            .collect()
    }

    /// Fails a job still stranded (a replica that serves it may have come back meanwhile: then not).
    pub async fn fail_stranded(&self, id: &str, error: &str) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE jobs SET status = $1, error = $2, updated_at = $3 \
             WHERE id = $4 AND status IN ('queued', 'running') AND stranded_ms IS NOT NULL",
        )
        .bind(JobStatus::Failed.as_str())
        .bind(error)
        .bind(now_rfc3339())
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// How many unfinished jobs are stranded now.
    pub async fn stranded_jobs(&self) -> Result<i64, StoreError> {
        let row =
            sqlx::query("SELECT COUNT(*) FROM jobs WHERE status IN ('queued', 'running') AND stranded_ms IS NOT NULL")
                .fetch_one(&self.pool)
                .await?;
        Ok(row.try_get(0)?)
    }

    /// The cluster-wide settings (JSON; none set: `{}`).
    pub async fn cluster_settings(&self) -> Result<String, StoreError> {
        let row = sqlx::query("SELECT value FROM cluster_settings WHERE id = 1").fetch_optional(&self.pool).await?;
        Ok(row.map(|r| r.try_get(0)).transpose()?.unwrap_or_else(|| "{}".to_string()))
    }

    /// Replaces the cluster-wide settings.
    pub async fn set_cluster_settings(&self, json: &str) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO cluster_settings (id, value, updated_at) VALUES (1, $1, $2) \
             ON CONFLICT (id) DO UPDATE SET value = $1, updated_at = $2",
        )
        .bind(json)
        .bind(now_rfc3339())
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing::stores;
    use crate::store::NewJob;

    fn serving(fingerprints: &[&str], weights: &[&str]) -> Serves {
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        Serves { fingerprints: strings(fingerprints), weights: strings(weights) }
    }

    async fn stranded(store: &Store) -> Vec<(String, bool)> {
        let (rows, _) = store.jobs(0, 10).await.unwrap();
        let mut ids: Vec<(String, bool)> = rows.into_iter().map(|r| (r.id, r.stranded_ms.is_some())).collect();
        ids.sort();
        ids
    }

    /// A job is stranded while no live replica serves both its index files and its weights, and no longer
    /// once one does; past the time allowed it fails, unless served again.
    #[tokio::test]
    async fn jobs_no_live_replica_serves_are_stranded_until_one_does() {
        let (stores, _dir) = stores().await;
        for store in stores {
            let job = |id: &'static str, fingerprint: &'static str, weights: Option<&'static str>| NewJob {
                id,
                topics: "1\tx\n",
                total: 1,
                fingerprint: Some(fingerprint),
                weights,
                ..NewJob::default()
            };
            store.create_job(job("bm25", "f1", None)).await.unwrap();
            store.create_job(job("maxp", "f1", Some("w1"))).await.unwrap();
            store.create_job(job("other", "f2", None)).await.unwrap();
            store.heartbeat("a", &serving(&["f1"], &["w2"]), "t0").await.unwrap();
            store.mark_stranded(5_000).await.unwrap();
            let expected = [("bm25", false), ("maxp", true), ("other", true)];
            assert_eq!(stranded(&store).await, expected.map(|(i, s)| (i.to_string(), s)));
            store.heartbeat("b", &serving(&["f0", "f2"], &["w1"]), "t0").await.unwrap();
            store.mark_stranded(5_000).await.unwrap();
            let expected = [("bm25", false), ("maxp", true), ("other", false)];
            assert_eq!(stranded(&store).await, expected.map(|(i, s)| (i.to_string(), s)));
            let replicas = store.replicas(5_000).await.unwrap();
            assert_eq!(replicas.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["a", "b"]);
            assert_eq!(replicas[1].fingerprints, ["f0", "f2"]);
            // Not seen within the window: not live, and the job it served is stranded again.
            assert!(store.replicas(-1).await.unwrap().is_empty());
            store.mark_stranded(-1).await.unwrap();
            assert_eq!(store.stranded_jobs().await.unwrap(), 3);
            let old = store.stranded_longer_than(-1).await.unwrap();
            assert_eq!(old.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(), ["bm25", "maxp", "other"]);
            assert_eq!(old[1].weights.as_deref(), Some("w1"));
            assert!(store.stranded_longer_than(60_000).await.unwrap().is_empty());
            assert!(store.fail_stranded("maxp", "stranded").await.unwrap());
            assert_eq!(store.job_status("maxp").await.unwrap(), Some(JobStatus::Failed));
            // Served again: not failed.
            store.mark_stranded(5_000).await.unwrap();
            assert!(!store.fail_stranded("other", "stranded").await.unwrap());
            assert_eq!(store.stranded_jobs().await.unwrap(), 0, "a failed job is no longer counted");
            assert_eq!(store.forget_replicas(-1).await.unwrap(), 2);
        }
    }

    #[tokio::test]
    async fn cluster_settings_are_one_document() {
        let (stores, _dir) = stores().await;
        for store in stores {
            assert_eq!(store.cluster_settings().await.unwrap(), "{}");
            store.set_cluster_settings(r#"{"a":1}"#).await.unwrap();
            store.set_cluster_settings(r#"{"b":2}"#).await.unwrap();
            assert_eq!(store.cluster_settings().await.unwrap(), r#"{"b":2}"#);
        }
    }
}
