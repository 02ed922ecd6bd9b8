//! Collection versions in the object store, as the database records them: a version row per published
//! commit (its collection, index fingerprint and manifest), the objects each lists, and every object uploaded
//! with the last time a publish relied on it. The protocol that keeps garbage collection from deleting an
//! object a publish is about to list: a publish marks each object used (`use_object`) before it decides not to
//! upload it, and the collector deletes an object only while holding its row, unused for the retention time and
//! listed by no version (`collect_objects`), so the two are ordered by the row's lock.

use sqlx::{AnyConnection, Connection, Row};

use super::{Store, StoreError};

/// A published version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionRow {
    pub id: i64,
    pub collection: String,
    /// Empty when the version is the collection's deletion.
    pub fingerprint: String,
    pub manifest: String,
}

/// The object store as the database records it (`GET /cluster`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectsState {
    pub url: String,
    pub versions: i64,
    pub objects: i64,
    pub bytes: i64,
    /// Every version, in order: (fingerprint, collection, version id); a deletion's fingerprint is empty.
    pub published: Vec<(String, String, i64)>,
}

/// The key of the advisory lock the cluster's writer holds (an arbitrary constant: "longrank" in ASCII).
const WRITER_LOCK: i64 = 0x6c6f_6e67_7261_6e6b;

/// The cluster's writer lock, held by a connection of its own: PostgreSQL releases it when the connection
/// closes, so a writer that dies (or loses the database) frees it for another replica at once.
pub struct WriterLease(AnyConnection);

impl WriterLease {
    /// Whether the lock is still held: its connection answers.
    pub async fn check(&mut self) -> Result<(), StoreError> {
        self.0.ping().await?;
        Ok(())
    }
}

impl Store {
    /// Takes the cluster's writer lock if no replica holds it, and records `replica` at `url` as the writer.
    pub async fn try_writer_lease(&self, replica: &str, url: &str) -> Result<Option<WriterLease>, StoreError> {
        let mut conn = self.pool.acquire().await?.detach();
        let held: bool =
            sqlx::query("SELECT pg_try_advisory_lock($1)").bind(WRITER_LOCK).fetch_one(&mut conn).await?.try_get(0)?;
        if !held {
            conn.close().await?;
            return Ok(None);
        }
        let now = self.now_ms();
        let sql = format!(
            "INSERT INTO cluster_writer (id, replica, url, since_ms) VALUES (1, $1, $2, {now}) \
             ON CONFLICT (id) DO UPDATE SET replica = $1, url = $2, since_ms = {now}"
        );
        sqlx::query(&sql).bind(replica).bind(url).execute(&mut conn).await?;
        Ok(Some(WriterLease(conn)))
    }

    /// The writer's replica name and URL, if one holds the lock now.
    pub async fn writer(&self) -> Result<Option<(String, String)>, StoreError> {
        // The lock's holder, as PostgreSQL sees it: the row alone may name a writer that died.
        let held: bool = sqlx::query(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND ((classid::bigint << 32) | objid::bigint) = $1)",
        )
        .bind(WRITER_LOCK)
        .fetch_one(&self.pool)
        .await?
        .try_get(0)?;
        if !held {
            return Ok(None);
        }
        let row =
            sqlx::query("SELECT replica, url FROM cluster_writer WHERE id = 1").fetch_optional(&self.pool).await?;
        row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).transpose()
    }

    /// Binds the database to the object store at `url` on first use; the URL it is bound to.
    pub async fn bind_objects(&self, url: &str) -> Result<String, StoreError> {
        sqlx::query("INSERT INTO object_store (id, url) VALUES (1, $1) ON CONFLICT DO NOTHING")
            .bind(url)
            .execute(&self.pool)
            .await?;
        Ok(sqlx::query("SELECT url FROM object_store WHERE id = 1").fetch_one(&self.pool).await?.try_get(0)?)
    }

    /// The object store the versions are in, with what it holds; none before any replica bound one.
    pub async fn objects_state(&self) -> Result<Option<ObjectsState>, StoreError> {
        let url = sqlx::query("SELECT url FROM object_store WHERE id = 1").fetch_optional(&self.pool).await?;
        let Some(url) = url.map(|r| r.try_get::<String, _>(0)).transpose()? else { return Ok(None) };
        let counts = sqlx::query(
            "SELECT (SELECT COUNT(*) FROM versions), (SELECT COUNT(*) FROM objects), \
             (SELECT CAST(COALESCE(SUM(bytes), 0) AS BIGINT) FROM objects)",
        )
        .fetch_one(&self.pool)
        .await?;
        let rows =
            sqlx::query("SELECT fingerprint, collection, id FROM versions ORDER BY id").fetch_all(&self.pool).await?;
        let published = rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)));
        Ok(Some(ObjectsState {
            url,
            versions: counts.try_get(0)?,
            objects: counts.try_get(1)?,
            bytes: counts.try_get(2)?,
            published: published.collect::<Result<_, StoreError>>()?,
        }))
    }

    /// The newest version of each collection: (collection, version id), by name.
    pub async fn latest_versions(&self) -> Result<Vec<(String, i64)>, StoreError> {
        let rows = sqlx::query("SELECT collection, MAX(id) FROM versions GROUP BY collection ORDER BY collection")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect()
    }

    pub async fn version(&self, id: i64) -> Result<Option<VersionRow>, StoreError> {
        let row = sqlx::query("SELECT id, collection, fingerprint, manifest FROM versions WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| {
            Ok(VersionRow {
                id: r.try_get(0)?,
                collection: r.try_get(1)?,
                fingerprint: r.try_get(2)?,
                manifest: r.try_get(3)?,
            })
        })
        .transpose()
    }

    /// Marks the object `sha256` as needed now; false when the store does not know it (then upload it and
    /// `record_object`). Waits while a collector holds its row, and then finds it gone.
    pub async fn use_object(&self, sha256: &str) -> Result<bool, StoreError> {
        let sql = format!("UPDATE objects SET used_ms = {} WHERE sha256 = $1", self.now_ms());
        Ok(sqlx::query(&sql).bind(sha256).execute(&self.pool).await?.rows_affected() > 0)
    }

    /// Records an object once it is uploaded.
    pub async fn record_object(&self, sha256: &str, bytes: u64) -> Result<(), StoreError> {
        let now = self.now_ms();
        let sql = format!(
            "INSERT INTO objects (sha256, bytes, used_ms) VALUES ($1, $2, {now}) \
             ON CONFLICT (sha256) DO UPDATE SET used_ms = {now}"
        );
        sqlx::query(&sql).bind(sha256).bind(bytes as i64).execute(&self.pool).await?;
        Ok(())
    }

    /// Records a version whose objects are all uploaded, in one transaction: replicas see all of it or none.
    pub async fn record_version(
        &self,
        collection: &str,
        fingerprint: &str,
        manifest: &str,
        objects: &[&str],
    ) -> Result<i64, StoreError> {
        let mut tx = self.pool.begin().await?;
        let sql = format!(
            "INSERT INTO versions (collection, fingerprint, manifest, created_ms) VALUES ($1, $2, $3, {}) RETURNING id",
            self.now_ms()
        );
        let id: i64 = sqlx::query(&sql)
            .bind(collection)
            .bind(fingerprint)
            .bind(manifest)
            .fetch_one(&mut *tx)
            .await?
            .try_get(0)?;
        for sha256 in objects {
            sqlx::query("INSERT INTO version_objects (version_id, sha256) VALUES ($1, $2) ON CONFLICT DO NOTHING")
                .bind(id)
                .bind(*sha256)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(id)
    }

    /// Deletes the versions older than `retention_ms` that are not their collection's newest and whose
    /// fingerprint no replica seen in the last `live_ms` serves; how many.
    pub async fn delete_old_versions(&self, retention_ms: i64, live_ms: i64) -> Result<u64, StoreError> {
        let now = self.now_ms();
        let sql = format!(
            "DELETE FROM versions WHERE created_ms < {now} - $1 \
             AND id < (SELECT MAX(id) FROM versions n WHERE n.collection = versions.collection) \
             AND NOT EXISTS (SELECT 1 FROM replicas r WHERE r.seen_ms > {now} - $2 \
                             AND r.fingerprints LIKE '%,' || versions.fingerprint || ',%')"
        );
        // SQLite enforces the cascade to version_objects only with foreign keys on (they are: `connect`).
        Ok(sqlx::query(&sql).bind(retention_ms).bind(live_ms).execute(&self.pool).await?.rows_affected())
    }

    /// Deletes up to `limit` objects that no version lists and no publish used in the last `retention_ms`:
    /// each one's row, and the object itself through `delete` (the object store's); how many. Each is deleted
    /// while its row is held, so a publish marking it used meanwhile waits, finds it gone, and uploads it again;
    /// an object `delete` fails keeps its row.
    pub async fn collect_objects<E: From<StoreError>, F: std::future::Future<Output = Result<(), E>>>(
        &self,
        retention_ms: i64,
        limit: i64,
        mut delete: impl FnMut(String) -> F,
    ) -> Result<u64, E> {
        let now = self.now_ms();
        let unused = format!(
            "used_ms < {now} - $1 AND NOT EXISTS (SELECT 1 FROM version_objects v WHERE v.sha256 = objects.sha256)"
        );
        let candidates: Vec<String> = sqlx::query(&format!("SELECT sha256 FROM objects WHERE {unused} LIMIT $2"))
            .bind(retention_ms)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(StoreError::from)?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()
            .map_err(StoreError::from)?;
        let mut deleted = 0;
        for sha256 in candidates {
            let mut tx = self.pool.begin().await.map_err(StoreError::from)?;
            let sql = format!("DELETE FROM objects WHERE sha256 = $2 AND {unused} RETURNING sha256");
            let held = sqlx::query(&sql)
                .bind(retention_ms)
                .bind(&sha256)
                .fetch_optional(&mut *tx)
                .await
                .map_err(StoreError::from)?;
            if held.is_some() {
                delete(sha256).await?;
                tx.commit().await.map_err(StoreError::from)?;
                deleted += 1;
            }
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use crate::store::testing::stores;
    use crate::store::Serves;

    #[tokio::test]
    async fn versions_in_order_and_old_ones_go_unless_served() {
        let (stores, _dir) = stores().await;
        for store in stores {
            let a1 = store.record_version("a", "f1", "{}", &["x", "y", "y"]).await.unwrap();
            let b1 = store.record_version("b", "g1", "{}", &["z"]).await.unwrap();
            let a2 = store.record_version("a", "f2", "{}", &["x"]).await.unwrap();
            assert_eq!(store.latest_versions().await.unwrap(), [("a".into(), a2), ("b".into(), b1)]);
            assert_eq!(store.version(a1).await.unwrap().unwrap().fingerprint, "f1");
            // A replica serving f1 keeps it; retention 0 and nobody serving it deletes it, never the newest.
            let serves = Serves { fingerprints: vec!["f1".into()], weights: vec![] };
            store.heartbeat("r1", &serves, "now").await.unwrap();
            assert_eq!(store.delete_old_versions(-1, 60_000).await.unwrap(), 0);
            store.heartbeat("r1", &Serves::default(), "now").await.unwrap();
            assert_eq!(store.delete_old_versions(-1, 60_000).await.unwrap(), 1);
            assert!(store.version(a1).await.unwrap().is_none());
            assert!(store.version(a2).await.unwrap().is_some() && store.version(b1).await.unwrap().is_some());
            assert_eq!(store.bind_objects("file:///a").await.unwrap(), "file:///a");
            assert_eq!(store.bind_objects("file:///b").await.unwrap(), "file:///a");
            // Objects: unknown until recorded, then used.
            assert!(!store.use_object("y").await.unwrap());
            store.record_object("y", 3).await.unwrap();
            assert!(store.use_object("y").await.unwrap());
        }
    }

    #[tokio::test]
    async fn only_objects_no_version_lists_and_unused_are_collected() {
        let (stores, _dir) = stores().await;
        for store in stores {
            for (sha, _) in [("listed", 1), ("unlisted", 2)] {
                store.record_object(sha, 1).await.unwrap();
            }
            store.record_version("c", "f", "{}", &["listed"]).await.unwrap();
            // Used just now: spared for an hour's retention, collected at none.
            let deleted = std::sync::Mutex::new(vec![]);
            let delete = |sha: String| {
                deleted.lock().unwrap().push(sha);
                std::future::ready(Ok::<_, crate::store::StoreError>(()))
            };
            assert_eq!(store.collect_objects(3_600_000, 100, delete).await.unwrap(), 0);
            assert_eq!(store.collect_objects(-1, 100, delete).await.unwrap(), 1);
            assert_eq!(*deleted.lock().unwrap(), ["unlisted"], "the object deleted with its row");
            assert!(store.use_object("listed").await.unwrap());
            assert!(!store.use_object("unlisted").await.unwrap());
        }
    }
}
