//! The replicas that share a store, as each sees the others. Every replica writes a heartbeat each second (what
//! it serves: its collections' fingerprints and its models' weights hashes); a job whose index files and model
//! weights no live replica serves is marked stranded (its view and `/metrics` say so) and resumes as soon as
//! one does, or fails with the reason once stranded for `batch.stranded_fail_after_ms`. Cluster-wide settings
//! (`PUT /cluster/settings`, kept in the store) override the configuration's batch settings on every replica
//! within a heartbeat, without a restart, as Elasticsearch's persistent cluster settings do.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::config::BatchConfig;
use crate::rank::Engine;
use crate::service::Services;
use crate::store::{ObjectsState, ReplicaRow, Serves, Store, StoreError};

/// How often a replica writes its heartbeat (and reads the settings, and looks for stranded jobs).
const HEARTBEAT: Duration = Duration::from_secs(1);
/// A replica whose last heartbeat is older is not live.
pub const LIVE_MS: i64 = 5_000;
/// A replica not seen for a day is forgotten.
const FORGET_MS: i64 = 86_400_000;

/// The batch settings that apply to every replica, replacing their configuration's (absent: the
/// configuration's). `PUT /cluster/settings` replaces the whole document.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterSettings {
    /// `batch.lease_ms`: how long a worker holds a topic without renewing its lease, 1,000 to 86,400,000.
    #[serde(rename = "batch.lease_ms", default, skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
    /// `batch.stranded_fail_after_ms`: how long a job no live replica can run waits before it fails (0: it
    /// waits until one can), at most 604,800,000 (a week).
    #[serde(rename = "batch.stranded_fail_after_ms", default, skip_serializing_if = "Option::is_none")]
    pub stranded_fail_after_ms: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("{name} must be between {min} and {max}, not {value}")]
    OutOfRange { name: &'static str, value: u64, min: u64, max: u64 },
}

impl ClusterSettings {
    pub fn validate(&self) -> Result<(), SettingsError> {
        let check = |name, value: Option<u64>, min, max| match value {
            Some(value) if !(min..=max).contains(&value) => Err(SettingsError::OutOfRange { name, value, min, max }),
            _ => Ok(()),
        };
        check("batch.lease_ms", self.lease_ms, 1_000, 86_400_000)?;
        check("batch.stranded_fail_after_ms", self.stranded_fail_after_ms, 0, 604_800_000)
    }
}

/// A replica as its last heartbeat showed it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ReplicaView {
    pub id: String,
    /// Whether its last heartbeat is recent (within 5 s).
    pub live: bool,
    /// Milliseconds since its last heartbeat.
    pub seen_ms_ago: i64,
    pub started_at: String,
    /// The fingerprints of the collections it serves.
    pub fingerprints: Vec<String>,
    /// The weights hashes of its loaded models.
    pub weights: Vec<String>,
    /// The published version of each collection it serves (an object-store cluster's), by collection.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<CollectionVersion>,
}

/// A collection's published version (`store.objects`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct CollectionVersion {
    pub collection: String,
    pub version: i64,
}

impl ReplicaView {
    /// A replica's row, with the versions its fingerprints are among `published` (fingerprint, collection, id).
    fn of(row: ReplicaRow, published: &[(String, String, i64)]) -> ReplicaView {
        let mut versions: Vec<CollectionVersion> = published
            .iter()
            .filter(|(fingerprint, _, _)| row.fingerprints.contains(fingerprint))
            .map(|(_, collection, id)| CollectionVersion { collection: collection.clone(), version: *id })
            .collect();
        // A fingerprint published twice (a collection back as it was) is served as its newest version.
        versions.sort_by(|a, b| a.collection.cmp(&b.collection).then(b.version.cmp(&a.version)));
        versions.dedup_by(|a, b| a.collection == b.collection);
        ReplicaView {
            live: row.age_ms < LIVE_MS,
            seen_ms_ago: row.age_ms,
            id: row.id,
            started_at: row.started_at,
            fingerprints: row.fingerprints,
            weights: row.weights,
            versions,
        }
    }
}

/// The replica that writes an object-store cluster's collections.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WriterView {
    pub replica: String,
    /// Where the other replicas forward uploads.
    pub url: String,
}

/// The object store the collections travel through, as the store records it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ObjectsView {
    pub url: String,
    /// Versions recorded (each collection's newest, and older ones within `store.retention_ms` or still served).
    pub versions: i64,
    /// Objects stored, and their bytes.
    pub objects: i64,
    pub bytes: i64,
    /// Each collection's newest version, by collection.
    pub newest: Vec<CollectionVersion>,
}

/// `GET /cluster`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ClusterView {
    /// The replica that answered.
    pub replica: String,
    /// The replicas seen in the last day, by name.
    pub replicas: Vec<ReplicaView>,
    /// Unfinished jobs no live replica can run.
    pub stranded_jobs: i64,
    /// As set with `PUT /cluster/settings`.
    pub settings: ClusterSettings,
    /// In force on the replica that answered: every setting, the store's where set, else the configuration's.
    pub effective: ClusterSettings,
    /// The replica that writes the collections (an object-store cluster's), while one holds the writer's lock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub writer: Option<WriterView>,
    /// The object store (`store.objects`), once a replica has used it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub objects: Option<ObjectsView>,
}

impl ObjectsView {
    fn of(state: &ObjectsState) -> ObjectsView {
        // In version order, the last of each collection is its newest; a deleted collection's is its deletion.
        let mut last: Vec<(&str, &str, i64)> = Vec::new();
        for (fingerprint, collection, id) in &state.published {
            match last.iter_mut().find(|(c, _, _)| c == collection) {
                Some(entry) => *entry = (collection, fingerprint, *id),
                None => last.push((collection, fingerprint, *id)),
            }
        }
        let mut newest: Vec<CollectionVersion> = last
            .into_iter()
            .filter(|(_, fingerprint, _)| !fingerprint.is_empty())
            .map(|(collection, _, version)| CollectionVersion { collection: collection.to_string(), version })
            .collect();
        newest.sort_by(|a, b| a.collection.cmp(&b.collection));
        ObjectsView {
            url: state.url.clone(),
            versions: state.versions,
            objects: state.objects,
            bytes: state.bytes,
            newest,
        }
    }
}

/// This replica's view of the cluster and the settings in force.
pub struct Cluster {
    engine: Arc<Engine>,
    store: Store,
    config: BatchConfig,
    replica: OnceLock<String>,
    started_at: String,
    lease_ms: AtomicU64,
    stranded_fail_after_ms: AtomicU64,
}

impl Cluster {
    pub fn new(engine: Arc<Engine>, store: Store, config: BatchConfig) -> Cluster {
        Cluster {
            lease_ms: AtomicU64::new(config.lease_ms),
            stranded_fail_after_ms: AtomicU64::new(config.stranded_fail_after_ms),
            engine,
            store,
            config,
            replica: OnceLock::new(),
            started_at: crate::store::now_rfc3339(),
        }
    }

    pub fn lease_ms(&self) -> u64 {
        self.lease_ms.load(Ordering::Relaxed)
    }

    pub fn stranded_fail_after_ms(&self) -> u64 {
        self.stranded_fail_after_ms.load(Ordering::Relaxed)
    }

    fn effective(&self) -> ClusterSettings {
        ClusterSettings { lease_ms: Some(self.lease_ms()), stranded_fail_after_ms: Some(self.stranded_fail_after_ms()) }
    }

    /// The settings as stored (none: `{}`).
    async fn stored(&self) -> Result<ClusterSettings, StoreError> {
        Ok(serde_json::from_str(&self.store.cluster_settings().await?).unwrap_or_default())
    }

    /// What this replica can run exactly: its collections' fingerprints and its loaded models' weights. Hashing
    /// new index files reads them: not on a runtime worker.
    pub fn serves_now(&self) -> Serves {
        Serves {
            fingerprints: self.engine.fingerprints().into_values().collect(),
            weights: self.engine.models().weights_hashes(),
        }
    }

    /// `serves_now` on a blocking thread.
    pub async fn serves(self: &Arc<Self>) -> Serves {
        let cluster = self.clone();
        tokio::task::spawn_blocking(move || cluster.serves_now()).await.unwrap_or_default()
    }

    /// Writes the first heartbeat, then one each second, as `replica`, as a background service (a blocking task
    /// each second would keep the runtime's idle blocking threads alive, as `server::follow_data_dir` says).
    pub async fn start(self: &Arc<Self>, replica: String, services: &Services) {
        let _ = self.replica.set(replica);
        // A store that fails now is tried again at the next beat: the workers start regardless.
        if let Err(e) = self.beat(self.serves().await).await {
            tracing::warn!("cluster heartbeat: {e}");
        }
        let (cluster, runtime) = (self.clone(), tokio::runtime::Handle::current());
        services.spawn("cluster-heartbeat", HEARTBEAT, move |beats| {
            if let Err(e) = runtime.block_on(cluster.beat(cluster.serves_now())) {
                tracing::warn!("cluster heartbeat: {e}");
            }
            if beats % 3600 == 0 {
                let _ = runtime.block_on(cluster.store.forget_replicas(FORGET_MS));
            }
        });
    }

    /// One heartbeat: what this replica serves, the settings in force, and the stranded jobs (on a shared store:
    /// one process on an unshared one runs every job).
    async fn beat(&self, serves: Serves) -> Result<(), StoreError> {
        let replica = self.replica.get().cloned().unwrap_or_default();
        self.store.heartbeat(&replica, &serves, &self.started_at).await?;
        self.apply(&self.stored().await?);
        if !self.store.shared() {
            return Ok(());
        }
        self.store.mark_stranded(LIVE_MS).await?;
        let fail_after = self.stranded_fail_after_ms();
        if fail_after == 0 {
            return Ok(());
        }
        for job in self.store.stranded_longer_than(fail_after as i64).await? {
            let error = format!(
                "stranded: no live replica served {} the job was submitted against for {} s \
                 (batch.stranded_fail_after_ms); submit it again to run it on the collection as served now",
                unserved(&job.fingerprint, job.weights.as_deref()),
                job.for_ms / 1000
            );
            if self.store.fail_stranded(&job.id, &error).await? {
                tracing::warn!(job = %job.id, "{error}");
            }
        }
        Ok(())
    }

    fn apply(&self, settings: &ClusterSettings) {
        let lease_ms = settings.lease_ms.unwrap_or(self.config.lease_ms);
        let fail_after = settings.stranded_fail_after_ms.unwrap_or(self.config.stranded_fail_after_ms);
        self.lease_ms.store(lease_ms, Ordering::Relaxed);
        self.stranded_fail_after_ms.store(fail_after, Ordering::Relaxed);
    }

    /// Replaces the cluster-wide settings; in force here at once, on the other replicas within a heartbeat.
    pub async fn set(&self, settings: ClusterSettings) -> Result<ClusterView, ClusterError> {
        settings.validate()?;
        self.store.set_cluster_settings(&serde_json::to_string(&settings).expect("settings serialize")).await?;
        self.apply(&settings);
        self.view().await
    }

    pub async fn view(&self) -> Result<ClusterView, ClusterError> {
        let settings = self.stored().await?;
        // The writer's lock and the object store are PostgreSQL's (a SQLite store has neither).
        let (writer, objects) = match self.store.shared() {
            true => (self.store.writer().await?, self.store.objects_state().await?),
            false => (None, None),
        };
        let published = objects.as_ref().map(|o| o.published.as_slice()).unwrap_or_default();
        let replicas = self.store.replicas(FORGET_MS).await?;
        Ok(ClusterView {
            replica: self.replica.get().cloned().unwrap_or_default(),
            replicas: replicas.into_iter().map(|row| ReplicaView::of(row, published)).collect(),
            stranded_jobs: self.store.stranded_jobs().await?,
            settings,
            effective: self.effective(),
            writer: writer.map(|(replica, url)| WriterView { replica, url }),
            objects: objects.map(|o| ObjectsView::of(&o)),
        })
    }
}

/// What a stranded job needs that no live replica serves, for its view and its error.
pub fn unserved(fingerprint: &str, weights: Option<&str>) -> String {
    let weights = weights.map(|w| format!(" and model weights {w}")).unwrap_or_default();
    format!("the index files (fingerprint {fingerprint}){weights}")
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Settings(#[from] SettingsError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_dotted_names_checked_for_range() {
        let settings: ClusterSettings = serde_json::from_str(r#"{"batch.lease_ms": 60000}"#).unwrap();
        assert_eq!(settings, ClusterSettings { lease_ms: Some(60_000), stranded_fail_after_ms: None });
        assert_eq!(serde_json::to_string(&settings).unwrap(), r#"{"batch.lease_ms":60000}"#);
        assert!(serde_json::from_str::<ClusterSettings>(r#"{"batch.workers": 2}"#).is_err(), "not a cluster setting");
        let error = ClusterSettings { lease_ms: Some(10), ..Default::default() }.validate().unwrap_err();
        assert_eq!(error.to_string(), "batch.lease_ms must be between 1000 and 86400000, not 10");
        assert!(ClusterSettings { stranded_fail_after_ms: Some(0), ..Default::default() }.validate().is_ok());
    }
}
