//! Writes to collections over HTTP, as tasks (Meilisearch's model): a request stores what its task needs
//! durably (an upload goes to the data directory's `uploads/`, fsynced, before its row is written), answers 202
//! with the task, and one worker applies the tasks in id order, so the tasks of a collection apply in the order
//! they were accepted. A task is `succeeded` once its commit is made and the collection's reader reloaded: its
//! documents are searchable. On a cluster with an object store it is committed into a staged copy, published, and
//! only then put in place: no replica, the writer included, serves a change no version lists. A stop (kill -9 included) loses no accepted task: at the next start, a task that
//! was running is queued again and reapplied (adding a document again replaces it by docid), and the collection
//! serves its last commit meanwhile.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use utoipa::ToSchema;

use super::jobs::JobError;
use crate::cancel::Cancel;
use crate::config::{Config, IndexConfig};
use crate::corpus::{Corpus, Format};
use crate::hash::Fnv;
use crate::index::{self, Catalog, IndexError, OnError};
use crate::progress::{Progress, Unit};
use crate::rank::{Engine, RankError};
use crate::replication::writer::{Route, Writer};
use crate::replication::{Replication, ReplicationError};
use crate::service::{Bell, Next, Services};
use crate::store::{KeyedRequest, Store, StoreError, TaskFilter, TaskKind, TaskOutcome, TaskRow, TaskStatus};

#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error("unknown task {0}")]
    UnknownTask(i64),
    #[error("task {id} is {status}: a finished task cannot be cancelled")]
    NotCancellable { id: i64, status: TaskStatus },
    #[error("the upload is larger than limits.max_upload_bytes ({limit} bytes)")]
    TooLarge { limit: u64 },
    #[error("reading the upload: {0}")]
    Upload(String),
    #[error("storing the upload: {0}")]
    Io(#[from] std::io::Error),
    /// An upload that gave nothing to index, and why when a file was set aside (`: …`).
    #[error("the upload holds no documents{0}")]
    NoDocuments(String),
    #[error("Idempotency-Key {key:?} was given to task {id}, a write with another route, parameters or upload: use a new key for another write")]
    KeyReused { key: String, id: i64 },
    #[error("this server is a replica (its store is PostgreSQL): collections are read-only here; build them with `longrank index` and copy the directory to each replica, or give the replicas an object store (store.objects)")]
    ReadOnly,
    #[error("no replica writes the collections now (the writer stopped a moment ago; another takes over within a second), or the writer could not be reached: {0}")]
    NoWriter(String),
    #[error(transparent)]
    Job(#[from] super::jobs::JobError),
    /// A change the writer could not publish: discarded, so that no replica serves it.
    #[error("not published, so not applied (send it again): {0}")]
    Unpublished(ReplicationError),
    #[error(transparent)]
    Rank(#[from] RankError),
}

/// What a task applies, as stored with it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Input {
    /// An upload's file name in `uploads/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(default)]
    pub format: Format,
    /// The upload is one JSON array of documents (converted to JSON lines when applied).
    #[serde(default)]
    pub json_array: bool,
    #[serde(default)]
    pub on_error: OnError,
    /// Docids to delete.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ids: Vec<String>,
    /// The bi-encoder to embed with, and the model whose segments it embeds (`longrank embed --name`, `--for`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_model: Option<String>,
}

/// A task as clients see it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskView {
    pub id: i64,
    pub collection: String,
    pub kind: TaskKind,
    pub status: TaskStatus,
    pub documents: TaskDocuments,
    /// The first problems met (each bad document with its line or byte offset in the upload, `file` being
    /// `upload`), skipped under `on_error=skip`.
    #[schema(value_type = Vec<crate::index::Problem>)]
    pub errors: Vec<serde_json::Value>,
    /// Why a failed task failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A running upload: bytes read of its size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<TaskProgress>,
    pub enqueued_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskDocuments {
    /// Documents read from the upload (indexed and skipped).
    pub read: i64,
    pub indexed: i64,
    /// Documents left out: malformed (under `on_error=skip`), or empty (title and text whitespace alone).
    pub skipped: i64,
    /// Documents deleted (of the docids given, those the collection held).
    pub deleted: i64,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct TaskProgress {
    pub bytes_read: u64,
    pub bytes_total: u64,
}

impl TaskView {
    fn of(row: TaskRow, progress: Option<TaskProgress>) -> TaskView {
        TaskView {
            id: row.id,
            collection: row.collection,
            kind: row.kind,
            status: row.status,
            documents: TaskDocuments {
                read: row.read,
                indexed: row.indexed,
                skipped: row.skipped,
                deleted: row.deleted,
            },
            errors: serde_json::from_str(&row.errors).unwrap_or_default(),
            error: row.error,
            progress: progress.filter(|_| row.status == TaskStatus::Running),
            enqueued_at: row.enqueued_at,
            started_at: row.started_at,
            finished_at: row.finished_at,
        }
    }
}

pub struct Tasks {
    store: Store,
    /// The object store each applied task is published to, on a cluster; and the election of the replica
    /// that applies them.
    replication: Option<Replication>,
    writer: Option<Arc<Writer>>,
    engine: Arc<Engine>,
    data_dir: PathBuf,
    index: IndexConfig,
    /// Told when a task is queued (the worker waits on it).
    wake: OnceLock<Bell>,
    /// Told when a task finishes (`?wait=true` waits on it).
    finished: Notify,
    running: Mutex<Option<Running>>,
    /// On a cluster: elected, and done taking over (requeued the last writer's tasks, removed the uploads no
    /// task needs). Until then uploads are refused as if no replica wrote: one stored meanwhile could be
    /// removed by that clean-up before its task is queued.
    taken_over: AtomicBool,
}

/// The task the worker applies: what stops it, and its upload's progress.
struct Running {
    id: i64,
    cancel: Cancel,
    progress: Option<TaskProgress>,
}

/// How long a task waits for another process (the CLI) that writes the same collection.
const BUSY_WAIT: Duration = Duration::from_secs(600);

impl Tasks {
    pub fn new(engine: Arc<Engine>, store: Store, config: &Config, replication: Option<Replication>) -> Arc<Tasks> {
        Arc::new(Tasks {
            writer: replication.as_ref().map(|_| Writer::new(store.clone())),
            replication,
            store,
            engine,
            data_dir: config.data_dir.clone(),
            index: config.index.clone(),
            wake: OnceLock::new(),
            finished: Notify::new(),
            running: Mutex::default(),
            taken_over: AtomicBool::new(false),
        })
    }

    fn uploads(&self) -> PathBuf {
        self.data_dir.join("uploads")
    }

    /// Starts the worker: at once on a single process, once elected on a cluster (this replica, named
    /// `replica`, is reached at `url` by the others' forwarded uploads).
    pub async fn start(self: &Arc<Self>, replica: String, url: String, services: &Services) -> Result<(), TaskError> {
        if self.read_only() {
            return Ok(());
        }
        index::Staged::clear(&self.data_dir)?;
        match &self.writer {
            Some(writer) => writer.start(replica, url, services).await,
            None => self.take_over().await?,
        }
        let (tasks, runtime) = (self.clone(), tokio::runtime::Handle::current());
        let _ = self.wake.set(services.spawn_worker("collection-tasks", Duration::ZERO, move || tasks.work(&runtime)));
        Ok(())
    }

    /// Where an upload goes: stored here, or forwarded to the writer (on a cluster).
    pub async fn route(&self) -> Result<Route, TaskError> {
        match &self.writer {
            None => Ok(Route::Here),
            Some(writer) => match writer.route().await? {
                Route::Here if !self.taken_over.load(Ordering::Acquire) => Ok(Route::NoWriter),
                route => Ok(route),
            },
        }
    }

    /// Queues the tasks a stop interrupted again (on a cluster: the last writer's), and removes uploads no
    /// task needs (a stop between storing one and writing its row: never acknowledged).
    async fn take_over(&self) -> Result<(), TaskError> {
        crate::hooks::reached("tasks.take_over").await;
        let requeued = self.store.requeue_running_tasks().await?;
        if requeued > 0 {
            tracing::warn!("{requeued} task(s) interrupted by a stop: applying them again");
        }
        let needed: Vec<String> = self
            .store
            .unfinished_task_inputs()
            .await?
            .iter()
            .filter_map(|input| serde_json::from_str::<Input>(input).ok()?.file)
            .collect();
        if let Ok(entries) = std::fs::read_dir(self.uploads()) {
            for entry in entries.filter_map(|e| e.ok()) {
                if !needed.iter().any(|f| entry.file_name().to_string_lossy() == *f) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        Ok(())
    }

    /// Replicas (servers sharing a store) write no collection without an object store: each serves a copy.
    fn read_only(&self) -> bool {
        self.store.shared() && self.replication.is_none()
    }

    /// Queues a task on a collection (its name checked first). With an Idempotency-Key, a repeat of the write
    /// (a client's or a proxy's retry) answers the first task instead of queueing another, and the key given
    /// to another write is refused.
    pub async fn enqueue(
        &self,
        collection: &str,
        kind: TaskKind,
        input: &Input,
        key: Option<&str>,
    ) -> Result<TaskView, TaskError> {
        let keyed = key.map(|key| keyed(key, collection, kind, input, None));
        Ok(self.queue(collection, kind, input, keyed).await?.0)
    }

    /// Queues a task, or finds the one its key names: the task, and whether it is new.
    async fn queue(
        &self,
        collection: &str,
        kind: TaskKind,
        input: &Input,
        keyed: Option<KeyedRequest>,
    ) -> Result<(TaskView, bool), TaskError> {
        if self.read_only() {
            return Err(TaskError::ReadOnly);
        }
        index::validate_name(collection)?;
        if let Some(first) = self.first_with_key(keyed.as_ref()).await? {
            return Ok((self.get(first).await?, false));
        }
        let text = serde_json::to_string(input).expect("inputs serialize");
        let id = match self.store.create_task(collection, kind, &text, keyed.as_ref()).await {
            // The same key sent at once by another request: the first one queued wins.
            Err(e) if e.is_duplicate() && keyed.is_some() => match self.first_with_key(keyed.as_ref()).await? {
                Some(first) => return Ok((self.get(first).await?, false)),
                None => return Err(e.into()),
            },
            created => created?,
        };
        if let Some(worker) = self.wake.get() {
            worker.ring();
        }
        Ok((self.get(id).await?, true))
    }

    /// The task queued with this key, when this request repeats it.
    async fn first_with_key(&self, keyed: Option<&KeyedRequest>) -> Result<Option<i64>, TaskError> {
        let Some(keyed) = keyed else { return Ok(None) };
        let first = self.store.task_by_idempotency_key(&keyed.key).await?;
        keyed.repeats(first).map_err(|id| TaskError::KeyReused { key: keyed.key.clone(), id })
    }

    /// Streams an upload to `uploads/` (at most `limit` bytes, fsynced), then queues its task.
    pub async fn upload(
        &self,
        collection: &str,
        body: impl futures_util::Stream<Item = Result<bytes::Bytes, impl std::fmt::Display>> + Unpin,
        limit: u64,
        mut input: Input,
        key: Option<&str>,
    ) -> Result<TaskView, TaskError> {
        use tokio::io::AsyncWriteExt;
        if self.read_only() {
            return Err(TaskError::ReadOnly);
        }
        index::validate_name(collection)?;
        let dir = self.uploads();
        tokio::fs::create_dir_all(&dir).await?;
        // Unique within the data directory: the process's request-id form, and its pid.
        let name = format!("{}-{}", crate::timestamp::unique_id(), std::process::id());
        let partial = dir.join(format!("{name}.part"));
        // Async file I/O: an upload of gigabytes must not hold a runtime worker.
        let stored = async {
            let mut file = tokio::io::BufWriter::new(tokio::fs::File::create(&partial).await?);
            let mut stream = body;
            let mut size = 0u64;
            // The bytes' hash identifies the upload for its key.
            let mut hash = key.map(|_| Fnv::default());
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| TaskError::Upload(e.to_string()))?;
                size += chunk.len() as u64;
                if size > limit {
                    return Err(TaskError::TooLarge { limit });
                }
                if let Some(hash) = &mut hash {
                    hash.write(&chunk);
                }
                file.write_all(&chunk).await?;
            }
            file.flush().await?;
            file.into_inner().sync_all().await?;
            tokio::fs::rename(&partial, dir.join(&name)).await?;
            tokio::fs::File::open(&dir).await?.sync_all().await?;
            Ok::<_, TaskError>(hash)
        };
        let hash = match stored.await {
            Ok(hash) => hash,
            Err(e) => {
                let _ = tokio::fs::remove_file(&partial).await;
                return Err(e);
            }
        };
        let kind = TaskKind::AddDocuments;
        let keyed = key.map(|key| keyed(key, collection, kind, &input, hash.as_ref()));
        input.file = Some(name);
        let queued = self.queue(collection, kind, &input, keyed).await;
        // A repeated upload (or a refused one) is not kept: the first task has its own.
        if !matches!(queued, Ok((_, true))) {
            self.remove_upload(&input).await;
        }
        Ok(queued?.0)
    }

    pub async fn get(&self, id: i64) -> Result<TaskView, TaskError> {
        let row = self.store.task(id).await?.ok_or(TaskError::UnknownTask(id))?;
        let progress = self.running.lock().as_ref().filter(|r| r.id == id).and_then(|r| r.progress);
        Ok(TaskView::of(row, progress))
    }

    pub async fn list(&self, filter: &TaskFilter) -> Result<Vec<TaskView>, TaskError> {
        let rows = self.store.tasks(filter).await?;
        Ok(rows.into_iter().map(|row| TaskView::of(row, None)).collect())
    }

    /// The task once finished, or as it is at `deadline`.
    pub async fn wait(&self, id: i64, deadline: Instant) -> Result<TaskView, TaskError> {
        loop {
            // Listening before reading, so that a finish in between is not missed.
            let finished = self.finished.notified();
            tokio::pin!(finished);
            finished.as_mut().enable();
            let view = self.get(id).await?;
            if view.status.is_finished() || Instant::now() >= deadline {
                return Ok(view);
            }
            // Each half second too: on a cluster another replica (the writer) finishes it.
            let until = deadline.min(Instant::now() + Duration::from_millis(500));
            let _ = tokio::time::timeout_at(until.into(), finished).await;
        }
    }

    /// Cancels a queued task, or asks a running one to stop (kept across a stop): an upload stops at its next
    /// document and ends `cancelled`, keeping what it had committed (every `index.commit_every` documents);
    /// a deletion finishes.
    pub async fn cancel(&self, id: i64) -> Result<TaskView, TaskError> {
        let stoppable = self.running.lock().as_ref().filter(|r| r.id == id).map(|r| r.cancel.clone());
        if let Some(cancel) = stoppable {
            if self.store.request_cancel(id).await? {
                cancel.cancel();
                return self.get(id).await;
            }
        }
        let Some(input) = self.store.cancel_queued_task(id).await? else {
            return Err(TaskError::NotCancellable { id, status: self.get(id).await?.status });
        };
        self.remove_upload(&serde_json::from_str(&input).unwrap_or_default()).await;
        self.get(id).await
    }

    /// Removes what a task's upload left in `uploads/` (the upload, and its JSON lines when it was an array).
    async fn remove_upload(&self, input: &Input) {
        if let Some(file) = &input.file {
            let _ = tokio::fs::remove_file(self.uploads().join(file)).await;
            let _ = tokio::fs::remove_file(self.uploads().join(format!("{file}.jsonl"))).await;
        }
    }

    /// The worker's tick: applies the oldest queued task (on a cluster, while this replica is the writer) and
    /// publishes its result; tasks apply one at a time.
    fn work(&self, runtime: &tokio::runtime::Handle) -> Next {
        if let Some(writer) = &self.writer {
            if !writer.is_writer() {
                self.taken_over.store(false, Ordering::Release);
                return Next::After(Duration::from_millis(200));
            }
            if !self.taken_over.load(Ordering::Acquire) {
                if let Err(e) = runtime.block_on(self.take_over()) {
                    tracing::error!("tasks: taking over as the writer: {e}");
                    return Next::After(Duration::from_secs(1));
                }
                self.taken_over.store(true, Ordering::Release);
            }
        }
        let task = match runtime.block_on(self.store.start_next_task()) {
            Ok(Some(task)) => task,
            // A ring or a second (a task queued by another process sharing the store).
            Ok(None) => return Next::After(Duration::from_secs(1)),
            Err(e) => {
                tracing::error!("tasks: {e}");
                return Next::After(Duration::from_secs(1));
            }
        };
        let cancel = Cancel::default();
        *self.running.lock() = Some(Running { id: task.id, cancel: cancel.clone(), progress: None });
        let input: Input = serde_json::from_str(&task.input).unwrap_or_default();
        let outcome = self.apply(&task, &input, &cancel, runtime);
        *self.running.lock() = None;
        // Asked to stop, a task that stopped ends cancelled; one that finished anyway, as it finished.
        let status = match (&outcome.error, cancel.is_cancelled()) {
            (Some(_), true) => TaskStatus::Cancelled,
            (Some(_), false) => TaskStatus::Failed,
            (None, _) => TaskStatus::Succeeded,
        };
        if let Err(e) = runtime.block_on(self.store.finish_task(task.id, status, &outcome)) {
            tracing::error!("task {}: {e}", task.id);
        }
        // The upload goes before the waiters hear of the finish, so that a client told it is done finds it gone
        // (after the finish is stored: a stop in between leaves a file that the next take-over removes).
        runtime.block_on(self.remove_upload(&input));
        self.finished.notify_waiters();
        Next::Now
    }

    fn apply(&self, task: &TaskRow, input: &Input, cancel: &Cancel, runtime: &tokio::runtime::Handle) -> TaskOutcome {
        let name = &task.collection;
        let apply = || match task.kind {
            TaskKind::DeleteCollection => {
                let (catalog, replication) = (self.engine.catalog(), self.replication.as_ref());
                delete_collection(catalog, &self.store, replication, name, cancel, runtime)
                    .map(|()| TaskOutcome::default())
            }
            kind => self.apply_blocking(task.id, kind, name, input, cancel),
        };
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(apply)) {
            Ok(applied) => applied.unwrap_or_else(|e| TaskOutcome { error: Some(e.to_string()), ..Default::default() }),
            Err(_) => {
                TaskOutcome { error: Some("the task's worker failed (it panicked)".into()), ..Default::default() }
            }
        }
    }

    /// Applies a task's change, waiting while another process writes the collection. Alone, it commits in place.
    /// On a cluster it commits into a staged copy (`index::Staged`), publishes that, and only then puts it in
    /// place: every replica, the writer included, serves published versions only, and a change that cannot be
    /// published (within `store.publish_timeout_ms`) leaves no trace.
    fn apply_blocking(
        &self,
        id: i64,
        kind: TaskKind,
        name: &str,
        input: &Input,
        cancel: &Cancel,
    ) -> Result<TaskOutcome, TaskError> {
        crate::hooks::point("task.start");
        let started = Instant::now();
        let outcome = loop {
            let attempt = match &self.replication {
                None => self.write(&self.data_dir, id, kind, name, input, cancel),
                Some(replication) => {
                    index::Staged::new(&self.data_dir, name).map_err(TaskError::from).and_then(|staged| {
                        let outcome = self.write(staged.data_dir(), id, kind, name, input, cancel)?;
                        let dir = staged.dir();
                        let published = replication.publish_dir(&dir, name, cancel).map_err(TaskError::Unpublished)?;
                        let (version, files, uploaded, bytes) =
                            (published.version, published.files, published.uploaded_files, published.uploaded_bytes);
                        tracing::info!(collection = name, version, files, uploaded, bytes, "published a version");
                        staged.install()?;
                        Ok(outcome)
                    })
                }
            };
            match attempt {
                Err(TaskError::Index(IndexError::Busy(_)))
                    if started.elapsed() < BUSY_WAIT && !cancel.is_cancelled() =>
                {
                    std::thread::sleep(Duration::from_millis(500));
                }
                other => break other?,
            }
        };
        // Searchable when the task says so: the collection opened again at its new commit.
        self.engine.catalog().refresh(name)?;
        Ok(outcome)
    }

    /// The docids of an upload's documents (read again after it was applied; a document it could not read
    /// was not added).
    fn uploaded_docids(&self, input: &Input) -> Vec<String> {
        let Some(file) = &input.file else { return vec![] };
        let (path, format) = match input.json_array {
            true => (self.uploads().join(format!("{file}.jsonl")), Format::Jsonl),
            false => (self.uploads().join(file), input.format),
        };
        let Ok(corpus) = Corpus::open(&[path], format) else { return vec![] };
        corpus.documents().filter_map(|doc| Some(doc.ok()?.id)).collect()
    }

    /// Writes a task's change to collection `name` of `data_dir`.
    fn write(
        &self,
        data_dir: &Path,
        id: i64,
        kind: TaskKind,
        name: &str,
        input: &Input,
        cancel: &Cancel,
    ) -> Result<TaskOutcome, TaskError> {
        match kind {
            TaskKind::DeleteDocuments => index::delete_documents(data_dir, name, &input.ids)
                .map(|deleted| TaskOutcome { deleted: deleted as i64, ..Default::default() })
                .map_err(TaskError::from),
            TaskKind::EmbedCollection => {
                let collection = index::Collection::open(&data_dir.join("collections").join(name))?;
                let (model, reader) = (input.model.as_deref(), input.for_model.as_deref());
                self.engine.embed_collection(&collection, model, reader, &crate::progress::Silent)?;
                Ok(TaskOutcome { read: collection.num_docs() as i64, ..Default::default() })
            }
            _ => {
                let outcome = self.add(data_dir, id, name, input, cancel)?;
                // The new documents' vectors, with the commit (on a cluster, published with it).
                if kind == TaskKind::AddDocuments {
                    let dir = data_dir.join("collections").join(name);
                    self.engine.keep_vectors_current(&dir, || self.uploaded_docids(input));
                }
                Ok(outcome)
            }
        }
    }

    /// Adds an upload's documents (none: creates the collection).
    fn add(
        &self,
        data_dir: &Path,
        id: i64,
        name: &str,
        input: &Input,
        cancel: &Cancel,
    ) -> Result<TaskOutcome, TaskError> {
        let mut files = Vec::new();
        let mut format = input.format;
        if let Some(file) = &input.file {
            let mut path = self.uploads().join(file);
            if !path.exists() {
                // Requeued after the writer that stored it stopped: its file is on that replica.
                return Err(TaskError::Upload(
                    "the upload was stored on the replica that wrote the collections then, which stopped before \
                     applying it: send it again"
                        .into(),
                ));
            }
            if input.json_array {
                let lines = self.uploads().join(format!("{file}.jsonl"));
                json_array_to_lines(&path, &lines)?;
                (path, format) = (lines, Format::Jsonl);
            }
            files.push(path);
        } else if data_dir.join("collections").join(name).is_dir() {
            return Ok(TaskOutcome::default()); // creating a collection that exists
        }
        let corpus = Corpus::open(&files, format).map_err(IndexError::from)?;
        let options =
            index::BuildOptions { on_error: input.on_error, cancel: cancel.clone(), ..self.index.build_options(false) };
        let progress = TaskBytes { id, tasks: self };
        let report = match index::build(data_dir, name, &corpus, &options, &progress) {
            Ok(report) => report,
            Err(e) => return Err(Tasks::upload_error(e, &files)),
        };
        let errors = report
            .problems
            .into_iter()
            .map(|mut problem| {
                if files.iter().any(|f| f.display().to_string() == problem.file) {
                    problem.file = "upload".into();
                }
                serde_json::to_value(problem).expect("problems serialize")
            })
            .collect::<Vec<serde_json::Value>>();
        // An upload that held nothing to index says so (an empty body, or a file of another kind: topics, a run).
        let skipped = report.skipped + report.empty;
        if input.file.is_some() && report.indexed + skipped == 0 {
            let why = errors.first().and_then(|e| e["message"].as_str()).map(|m| format!(": {m}"));
            return Err(TaskError::NoDocuments(why.unwrap_or_default()));
        }
        Ok(TaskOutcome {
            read: (report.indexed + skipped) as i64,
            indexed: report.indexed as i64,
            skipped: skipped as i64,
            errors,
            ..Default::default()
        })
    }

    /// A build's error about an upload, naming it `upload` rather than its file in the data directory
    /// (`…/uploads/NAME:3 (byte 77): …` becomes `upload line 3 (byte 77): …`).
    fn upload_error(e: IndexError, files: &[PathBuf]) -> TaskError {
        if !matches!(e, IndexError::Aborted(_) | IndexError::Corpus(_)) {
            return TaskError::Index(e);
        }
        let mut message = e.to_string();
        for file in files {
            let file = file.display().to_string();
            message = message.replace(&format!("{file}:"), "upload line ").replace(&file, "upload");
        }
        TaskError::Upload(message)
    }
}

/// Deletes a collection (a task's, and `longrank collections delete`'s), refused while a queued or running
/// batch job reads it; on a cluster the deletion is published first, so that one not published deletes
/// nothing. Blocking: the store is reached through `runtime`.
pub fn delete_collection(
    catalog: &Catalog,
    store: &Store,
    replication: Option<&Replication>,
    name: &str,
    cancel: &Cancel,
    runtime: &tokio::runtime::Handle,
) -> Result<(), TaskError> {
    let jobs = runtime.block_on(store.unfinished_jobs_on(name))?;
    if !jobs.is_empty() {
        return Err(JobError::CollectionInUse { collection: name.to_string(), jobs }.into());
    }
    if let Some(replication) = replication {
        if !catalog.collection_dir(name).is_dir() {
            return Err(IndexError::UnknownCollection(name.to_string()).into());
        }
        let version = replication.publish_deletion(name, cancel).map_err(TaskError::Unpublished)?;
        tracing::info!(collection = name, version, "published a deletion");
    }
    catalog.delete(name).map_err(|e| JobError::from(RankError::from(e)))?;
    Ok(())
}

/// `key` given to a write, identified by its kind and collection, its parameters, and an upload's bytes (their
/// hash).
fn keyed(key: &str, collection: &str, kind: TaskKind, input: &Input, upload: Option<&Fnv>) -> KeyedRequest {
    let parameters = serde_json::to_string(&Input { file: None, ..input.clone() }).expect("inputs serialize");
    let kind = serde_json::to_string(&kind).expect("kinds serialize");
    let upload = upload.map_or([0; 8], |upload| upload.0.to_le_bytes());
    KeyedRequest::new(key, &[collection.as_bytes(), kind.as_bytes(), parameters.as_bytes(), &upload])
}

/// Upload progress, as the build reports bytes read.
struct TaskBytes<'a> {
    id: i64,
    tasks: &'a Tasks,
}

impl Progress for TaskBytes<'_> {
    fn phase(&self, _: &str, total: u64, _: Unit) {
        if let Some(running) = self.tasks.running.lock().as_mut().filter(|r| r.id == self.id) {
            running.progress = Some(TaskProgress { bytes_read: 0, bytes_total: total });
        }
    }

    fn set(&self, done: u64, _: &str) {
        if let Some(progress) = self.tasks.running.lock().as_mut().and_then(|r| r.progress.as_mut()) {
            progress.bytes_read = done;
        }
    }
}

/// Rewrites a JSON array of documents as JSON lines, one element at a time (memory bounded by the largest
/// document, whatever the array's size).
fn json_array_to_lines(array: &Path, lines: &Path) -> Result<u64, TaskError> {
    use serde::de::{Deserializer, SeqAccess, Visitor};
    struct Lines<W: Write>(W);
    impl<'de, W: Write> Visitor<'de> for Lines<W> {
        type Value = u64;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON array of documents")
        }
        fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<u64, A::Error> {
            use serde::de::Error;
            let mut n = 0;
            // Each document's own text, as sent: the JSON-lines reader then judges it as it judges a line (a
            // repeated field is a malformed document, not the last one winning). Outside strings, where JSON
            // allows no raw line break, a line break is whitespace: a space keeps the document on its line.
            while let Some(document) = seq.next_element::<Box<serde_json::value::RawValue>>()? {
                self.0.write_all(document.get().replace(['\n', '\r'], " ").as_bytes()).map_err(A::Error::custom)?;
                self.0.write_all(b"\n").map_err(A::Error::custom)?;
                n += 1;
            }
            self.0.flush().map_err(A::Error::custom)?;
            Ok(n)
        }
    }
    let reader = std::io::BufReader::new(std::fs::File::open(array)?);
    let writer = std::io::BufWriter::new(std::fs::File::create(lines)?);
    let mut de = serde_json::Deserializer::from_reader(reader);
    let converted = de.deserialize_seq(Lines(writer)).and_then(|n| de.end().map(|()| n));
    converted.map_err(|e| TaskError::Upload(format!("the JSON array: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_arrays_become_lines_one_document_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let (array, lines) = (dir.path().join("a.json"), dir.path().join("a.jsonl"));
        std::fs::write(&array, r#" [ {"id": "a", "text": "x y"}, {"id": "b", "text": "z"} ] "#).unwrap();
        assert_eq!(json_array_to_lines(&array, &lines).unwrap(), 2);
        let written = std::fs::read_to_string(&lines).unwrap();
        assert_eq!(written, "{\"id\": \"a\", \"text\": \"x y\"}\n{\"id\": \"b\", \"text\": \"z\"}\n");
        // A repeated field stays for the reader to refuse; a document over several lines keeps to one.
        std::fs::write(&array, "[{\"id\": \"a\",\n \"id\": \"b\", \"text\": \"x\\ny\"}]").unwrap();
        assert_eq!(json_array_to_lines(&array, &lines).unwrap(), 1);
        let written = std::fs::read_to_string(&lines).unwrap();
        assert_eq!(written, "{\"id\": \"a\",  \"id\": \"b\", \"text\": \"x\\ny\"}\n");
        let corpus = Corpus::open(std::slice::from_ref(&lines), Format::Jsonl).unwrap();
        let read: Vec<_> = corpus.read_file(&lines).unwrap().collect();
        let error = read[0].as_ref().err().map(ToString::to_string).unwrap_or_default();
        assert!(error.contains("duplicate field `id`"), "{error}");
        std::fs::write(&array, r#"[{"id": "a"}, {"id": "#).unwrap();
        let error = json_array_to_lines(&array, &lines).unwrap_err().to_string();
        assert!(error.contains("the JSON array") && error.contains("line 1"), "{error}");
        std::fs::write(&array, r#"{"id": "a"}"#).unwrap();
        assert!(json_array_to_lines(&array, &lines).unwrap_err().to_string().contains("a JSON array of documents"));
    }
}
