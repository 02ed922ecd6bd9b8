//! Collections that travel through an object store (`store.objects`, beside a PostgreSQL store), as Quickwit
//! keeps tantivy's files: the whole route of a version, in one module. The writer (`writer`: the replica holding
//! the cluster's writer lock) publishes each committed version as content-addressed objects (`objects`) plus a
//! manifest row (`manifest`; `publish_dir`), and each replica pulls the newest version of every collection,
//! fetching only the files it lacks (a version shares most segment files with the one before), checking each
//! against its hash, and swapping the new directory in as a `--replace` does (`pull`, each poll of the
//! catalog's service: `follow`). A replica so starts from an empty data directory. Versions no replica serves
//! and objects no version lists go after `store.retention_ms` (`collect_garbage`).
//!
//! A publish cut short (the writer killed mid-upload) leaves objects and no version row: replicas never see
//! it, the next publish of the collection reuses what was uploaded, and the collector deletes the rest.
//!
//! One calling convention: `Replication`'s methods block (file I/O, hashing, transfers), so they are called
//! from blocking threads (a task's worker, a background service, the CLI), never awaited on the runtime; they
//! reach the database and the object store through the runtime they were opened on.

mod manifest;
pub mod objects;
mod vectors;
pub mod writer;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::runtime::Handle;

use crate::cancel::Cancel;
use crate::config::StoreConfig;
use crate::index::{self, IndexError, WriterLock};
use crate::store::{Store, StoreError};
use manifest::{held, write_held, Held, SHAS};
pub use manifest::{Manifest, ManifestFile, ManifestVectors};
use objects::{Objects, ObjectsError};

#[derive(Debug, thiserror::Error)]
pub enum ReplicationError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Objects(#[from] ObjectsError),
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error(
        "store.objects needs a PostgreSQL store (store.url): the versions' manifests are kept there, where every \
         replica reads them"
    )]
    NeedsPostgres,
    #[error("store.objects is {configured}, but this store's versions are in {bound}")]
    OtherObjectStore { configured: String, bound: String },
    #[error("version {id} of collection {collection}: {reason}")]
    Version { id: i64, collection: String, reason: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// A version's vectors could not be read or written.
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error("a version's vectors: {0}")]
    Vectors(String),
}

impl ReplicationError {
    /// An object store or database that did not answer (refused, timed out, failed): worth trying again.
    fn is_transient(&self) -> bool {
        match self {
            ReplicationError::Store(e) => matches!(e, StoreError::Sqlx(_)),
            ReplicationError::Objects(e) => e.is_transient(),
            _ => false,
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ReplicationError + '_ {
    move |source| ReplicationError::Io { path: path.to_path_buf(), source }
}

/// What a publish did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Published {
    pub version: i64,
    pub files: usize,
    /// Files sent, and their bytes: those no earlier version had uploaded.
    pub uploaded_files: usize,
    pub uploaded_bytes: u64,
    /// The collection's newest version already was this one: nothing recorded.
    pub unchanged: bool,
}

/// Where a publish reads one of a version's objects: a file, or a chunk of a vector file's records.
enum Part<'a> {
    File(PathBuf),
    Chunk(&'a vectors::Sealed, usize),
}

/// What a pull changed in one collection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pulled {
    pub collection: String,
    pub version: i64,
    pub fingerprint: String,
    /// Files downloaded, and their bytes (the others were linked from the version held before).
    pub fetched_files: usize,
    pub fetched_bytes: u64,
}

/// The object store and the store that records its versions.
#[derive(Clone)]
pub struct Replication {
    store: Store,
    objects: Objects,
    retention_ms: i64,
    /// How long a publish is tried again while the object store or the database does not answer.
    publish_budget: Duration,
    runtime: Handle,
}

impl Replication {
    /// The replication `config` asks for: none without `objects`; refused without a PostgreSQL store, and
    /// with an object store other than the one the store's versions are in. Opened on the runtime whose
    /// connections it uses from then on.
    pub async fn open(config: &StoreConfig, store: &Store) -> Result<Option<Replication>, ReplicationError> {
        if config.objects.is_empty() {
            return Ok(None);
        }
        if !store.shared() {
            return Err(ReplicationError::NeedsPostgres);
        }
        let objects = Objects::open(&config.objects)?;
        objects.check().await?;
        let bound = store.bind_objects(&config.objects).await?;
        if bound != config.objects {
            return Err(ReplicationError::OtherObjectStore { configured: config.objects.clone(), bound });
        }
        Ok(Some(Replication {
            store: store.clone(),
            objects,
            retention_ms: config.retention_ms as i64,
            publish_budget: Duration::from_millis(config.publish_timeout_ms),
            runtime: Handle::current(),
        }))
    }

    pub fn objects_url(&self) -> &str {
        self.objects.url()
    }

    /// Publishes the committed state of collection `name` under `root` (`DATA_DIR/collections`), holding the
    /// collection's writer lock, so that no commit lands between hashing a file and uploading it.
    pub fn publish(&self, root: &Path, name: &str) -> Result<Published, ReplicationError> {
        let _writer = WriterLock::take(root, name)?;
        self.publish_dir(&root.join(name), name, &Cancel::default())
    }

    /// Publishes the collection `name` committed in `dir` (the caller holds its writer lock; `dir` may be a
    /// staged copy, `index::Staged`), recording there the version it became: the files no earlier version
    /// uploaded, then the manifest, in one transaction. Tried again while the object store or the database
    /// does not answer (`retried`).
    pub fn publish_dir(&self, dir: &Path, name: &str, cancel: &Cancel) -> Result<Published, ReplicationError> {
        self.retried(cancel, || self.publish_once(dir, name))
    }

    fn publish_once(&self, dir: &Path, name: &str) -> Result<Published, ReplicationError> {
        let mut manifest = Manifest::of_dir(dir, name)?;
        let sealed = vectors::seal(dir, vectors::CHUNK_BYTES)?;
        manifest.vectors = sealed.iter().map(|s| s.manifest.clone()).collect();
        let files = manifest.files.len() + manifest.vectors.iter().map(|v| v.chunks.len() + 2).sum::<usize>();
        let newest = self.newest_versions()?.into_iter().find_map(|(c, id)| (c == name).then_some(id));
        if let (Some(version), Some(held)) = (newest, held(dir)) {
            if held.id == version && held.manifest == manifest {
                return Ok(Published { version, files, uploaded_files: 0, uploaded_bytes: 0, unchanged: true });
            }
        }
        // Each part: its description, and how to send it.
        let mut parts: Vec<(&ManifestFile, Part)> =
            manifest.files.iter().map(|f| (f, Part::File(dir.join(&f.name)))).collect();
        for (s, v) in sealed.iter().zip(&manifest.vectors) {
            parts.extend(v.chunks.iter().enumerate().map(|(i, c)| (c, Part::Chunk(s, i))));
            parts.push((&v.index, Part::File(s.index().to_path_buf())));
            parts.push((&v.header, Part::File(s.header().to_path_buf())));
        }
        let (mut uploaded_files, mut uploaded_bytes) = (0, 0);
        for (file, part) in &parts {
            if self.runtime.block_on(self.store.use_object(&file.sha256))? {
                continue;
            }
            match part {
                Part::File(path) => self.runtime.block_on(self.objects.put_file(&file.sha256, path))?,
                Part::Chunk(sealed, i) => {
                    let bytes = sealed.chunk(*i)?;
                    self.runtime.block_on(self.objects.put_bytes(&file.sha256, bytes))?
                }
            }
            self.runtime.block_on(self.store.record_object(&file.sha256, file.bytes))?;
            crate::hooks::point("publish.object");
            uploaded_files += 1;
            uploaded_bytes += file.bytes;
        }
        let text = serde_json::to_string(&manifest).unwrap_or_default();
        let shas: Vec<&str> = parts.iter().map(|(f, _)| f.sha256.as_str()).collect();
        let version = self.runtime.block_on(self.store.record_version(name, &manifest.fingerprint, &text, &shas))?;
        write_held(dir, &Held { id: version, manifest })?;
        Ok(Published { version, files, uploaded_files, uploaded_bytes, unchanged: false })
    }

    /// Records that collection `name` was deleted (replicas delete their copies), tried again as a publish is.
    pub fn publish_deletion(&self, name: &str, cancel: &Cancel) -> Result<i64, ReplicationError> {
        let manifest =
            Manifest { collection: name.to_string(), fingerprint: String::new(), files: vec![], vectors: vec![] };
        let text = serde_json::to_string(&manifest).unwrap_or_default();
        self.retried(cancel, || Ok(self.runtime.block_on(self.store.record_version(name, "", &text, &[]))?))
    }

    /// `attempt` made again while the object store or the database does not answer, for up to
    /// `store.publish_timeout_ms` or until `cancel`: then its last error. Each attempt starts over; what an
    /// earlier one uploaded is not sent again.
    fn retried<T>(
        &self,
        cancel: &Cancel,
        mut attempt: impl FnMut() -> Result<T, ReplicationError>,
    ) -> Result<T, ReplicationError> {
        let started = Instant::now();
        let mut wait = Duration::from_millis(200);
        loop {
            match attempt() {
                Err(e)
                    if e.is_transient() && started.elapsed() + wait < self.publish_budget && !cancel.is_cancelled() =>
                {
                    tracing::warn!("publishing (tried again in {} ms): {e}", wait.as_millis());
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
                result => return result,
            }
        }
    }

    fn newest_versions(&self) -> Result<Vec<(String, i64)>, ReplicationError> {
        Ok(self.runtime.block_on(self.store.latest_versions())?)
    }

    /// One poll of a replica's catalog service: the collections under `root` brought to their newest
    /// versions (what changed, logged), and at every `collect_every`th tick old versions and objects collected
    /// (`live_ms`: how recent a replica's heartbeat must be for what it serves to be kept).
    pub fn follow(&self, root: &Path, tick: u64, collect_every: u64, live_ms: i64) {
        if let Err(e) = self.pull_logged(root) {
            tracing::warn!("pulling from the object store: {e}");
        }
        if tick.is_multiple_of(collect_every) {
            match self.collect_garbage(live_ms) {
                Ok((0, 0)) => {}
                Ok((versions, objects)) => tracing::info!(versions, objects, "old versions deleted"),
                Err(e) => tracing::warn!("deleting old versions: {e}"),
            }
        }
    }

    /// `pull`, with what changed and what failed logged: a version that fails keeps the one held serving.
    pub fn pull_logged(&self, root: &Path) -> Result<(), ReplicationError> {
        let (pulled, failed) = self.pull(root)?;
        for p in pulled {
            let (collection, version, fingerprint) = (&p.collection, p.version, &p.fingerprint);
            let (files, bytes) = (p.fetched_files, p.fetched_bytes);
            tracing::info!(collection, version, fingerprint, files, bytes, "pulled the newest version");
        }
        for e in failed {
            tracing::warn!("not pulled (the version held serves; tried again at the next pull): {e}");
        }
        Ok(())
    }

    /// Brings every collection under `root` to its newest published version; what changed. A collection that
    /// fails (an object missing or corrupt, a full disk) keeps the version it holds and is reported in the
    /// second value; the next pull tries again.
    pub fn pull(&self, root: &Path) -> Result<(Vec<Pulled>, Vec<ReplicationError>), ReplicationError> {
        std::fs::create_dir_all(root).map_err(io(root))?;
        let (mut pulled, mut failed) = (vec![], vec![]);
        for (collection, id) in self.newest_versions()? {
            // Held, and as published: a commit no version lists (a writer that stopped before publishing it)
            // is discarded by pulling the version again.
            let dir = root.join(&collection);
            if held(&dir)
                .is_some_and(|h| h.id == id && index::fingerprint(&dir).is_ok_and(|f| f == h.manifest.fingerprint))
            {
                continue;
            }
            match self.pull_version(root, &collection, id) {
                Ok(Some(p)) => pulled.push(p),
                Ok(None) => {}
                Err(e) => failed.push(e),
            }
        }
        Ok((pulled, failed))
    }

    fn pull_version(&self, root: &Path, collection: &str, id: i64) -> Result<Option<Pulled>, ReplicationError> {
        let invalid = |reason: String| ReplicationError::Version { id, collection: collection.to_string(), reason };
        index::validate_name(collection)?;
        // Deleted by the collector since it was listed: the next pull sees the newest.
        let Some(row) = self.runtime.block_on(self.store.version(id))? else { return Ok(None) };
        let manifest: Manifest = serde_json::from_str(&row.manifest).map_err(|e| invalid(format!("manifest: {e}")))?;
        let dir = root.join(collection);
        if manifest.fingerprint.is_empty() {
            if dir.exists() {
                let _writer = WriterLock::take(root, collection)?;
                index::remove_collection_dir(root, collection)?;
            }
            return Ok(Some(Pulled {
                collection: collection.to_string(),
                version: id,
                fingerprint: String::new(),
                fetched_files: 0,
                fetched_bytes: 0,
            }));
        }
        // The version held: its files (segments never change once written) are linked, not fetched again.
        let held_manifest = held(&dir).map(|h| h.manifest);
        let before: std::collections::HashMap<&str, &str> =
            held_manifest.iter().flat_map(|m| &m.files).map(|f| (f.name.as_str(), f.sha256.as_str())).collect();
        let staging = root.join(format!(".{collection}.fetching"));
        if staging.exists() {
            std::fs::remove_dir_all(&staging).map_err(io(&staging))?;
        }
        std::fs::create_dir_all(&staging).map_err(io(&staging))?;
        let (mut fetched_files, mut fetched_bytes) = (0, 0);
        for file in &manifest.files {
            if file.name.is_empty() || file.name.contains('/') || file.name.starts_with('.') {
                return Err(invalid(format!("a file named {:?}", file.name)));
            }
            let to = staging.join(&file.name);
            let from = dir.join(&file.name);
            // Linked only when the file still holds what the version held lists (an unpublished commit rewrote
            // meta.json in place).
            let same = before.get(file.name.as_str()) == Some(&file.sha256.as_str())
                && SHAS.get(&from).is_ok_and(|s| s == file.sha256);
            if same && std::fs::hard_link(&from, &to).is_ok() {
                continue;
            }
            fetched_bytes += self.runtime.block_on(self.objects.fetch(&file.sha256, &to))?;
            fetched_files += 1;
        }
        if !manifest.vectors.is_empty() {
            let held_vectors = held_manifest.as_ref().map_or(&[][..], |m| &m.vectors[..]);
            let (files, bytes) = vectors::assemble(self, held_vectors, &dir, &staging, &manifest.vectors)?;
            (fetched_files, fetched_bytes) = (fetched_files + files, fetched_bytes + bytes);
        }
        // The caches held (what `vectors` wrote aside).
        index::link_caches(&dir, &staging)?;
        let fingerprint = index::fingerprint(&staging)?;
        if fingerprint != manifest.fingerprint {
            return Err(invalid(format!("its files fingerprint {fingerprint}, its manifest {}", manifest.fingerprint)));
        }
        write_held(&staging, &Held { id, manifest })?;
        let _writer = WriterLock::take(root, collection)?;
        index::install(root, collection, &staging)?;
        Ok(Some(Pulled { collection: collection.to_string(), version: id, fingerprint, fetched_files, fetched_bytes }))
    }

    /// Deletes the versions no replica seen in the last `live_ms` serves and the objects no version lists,
    /// once older than the retention time; how many of each.
    pub fn collect_garbage(&self, live_ms: i64) -> Result<(u64, u64), ReplicationError> {
        self.runtime.block_on(async {
            let versions = self.store.delete_old_versions(self.retention_ms, live_ms).await?;
            let delete = |sha256: String| async move { Ok::<_, ReplicationError>(self.objects.delete(&sha256).await?) };
            let objects = self.store.collect_objects(self.retention_ms, 1000, delete).await?;
            Ok((versions, objects))
        })
    }
}

impl vectors::Source for Replication {
    fn bytes(&self, sha256: &str) -> Result<Vec<u8>, ReplicationError> {
        Ok(self.runtime.block_on(self.objects.fetch_bytes(sha256))?)
    }

    fn file(&self, sha256: &str, to: &Path) -> Result<u64, ReplicationError> {
        Ok(self.runtime.block_on(self.objects.fetch(sha256, to))?)
    }
}
