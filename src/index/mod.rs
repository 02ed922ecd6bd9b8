//! The first stage: tantivy indexes (one per collection under `DATA_DIR/collections/NAME`), analyzed as
//! Anserini does, scored with our own BM25 over tantivy's postings and exact document lengths.

pub mod analyzer;
pub mod bm25;
mod build;
mod fingerprint;
mod porter;
mod rm3;
mod search;

use crate::cancel::Cancel;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use tantivy::collector::TopDocs;
pub use tantivy::index::SegmentId;
use tantivy::query::TermQuery;
use tantivy::schema::{
    Field, IndexRecordOption, NumericOptions, Schema, TextFieldIndexing, TextOptions, Value, FAST, STORED, STRING,
};
use tantivy::{DocAddress, Index, IndexReader, ReloadPolicy, Searcher, TantivyDocument, Term};

pub use bm25::{Bm25Params, CollectionStats};
pub use build::{
    build, delete_documents, install, link_caches, searchable_text, BuildOptions, BuildReport, OnError, Problem, Staged,
};
pub use fingerprint::{fingerprint, published_files};
pub use rm3::{Expanded, Rm3Params};

#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("unknown collection {0:?}")]
    UnknownCollection(String),
    #[error("invalid collection name {0:?}: use letters, digits, '-', '_' and '.' (not leading)")]
    InvalidName(String),
    #[error("collection {name:?} was built by an incompatible version (analyzer {found:?}, expected {expected:?}); rebuild it with --replace")]
    Incompatible { name: String, found: String, expected: String },
    #[error("index error in {path}: {source}", path = path.display())]
    Tantivy { path: PathBuf, source: tantivy::TantivyError },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Corpus(#[from] crate::corpus::CorpusError),
    #[error("indexing aborted: {0}")]
    Aborted(String),
    #[error("cancelled: the request is gone or past its deadline")]
    Cancelled,
    #[error("collection {0:?} is being written by another process (it holds .{0}.lock); try again when it is done")]
    Busy(String),
}

/// The one writer of a collection across processes (the CLI's builds and deletions, the server's): an
/// exclusive lock on `collections/.NAME.lock`, held until dropped (the kernel releases it if the process dies).
pub struct WriterLock(#[allow(dead_code, reason = "held for its lock")] std::fs::File);

impl WriterLock {
    /// Takes the lock, or `Busy` when another writer holds it.
    pub fn take(root: &Path, name: &str) -> Result<WriterLock, IndexError> {
        let path = root.join(format!(".{name}.lock"));
        let io = |source| IndexError::Io { path: path.clone(), source };
        let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path).map_err(io)?;
        match file.try_lock() {
            Ok(()) => Ok(WriterLock(file)),
            Err(std::fs::TryLockError::WouldBlock) => Err(IndexError::Busy(name.to_string())),
            Err(std::fs::TryLockError::Error(e)) => Err(io(e)),
        }
    }
}

/// Names the analysis so that an index built with another one is refused instead of silently mis-scored.
const ANALYZER_VERSION: &str = "lucene-english-porter-v2";
const META_FILE: &str = "longrank.json";

#[derive(Debug, Clone, Serialize, Deserialize)]
struct CollectionMeta {
    name: String,
    analyzer: String,
}

/// The fields of a collection's schema.
#[derive(Clone, Copy)]
struct Fields {
    docid: Field,
    title: Field,
    text: Field,
    contents: Field,
    len: Field,
}

const LEN_FIELD: &str = "len";
const DOCID_FIELD: &str = "docid";

fn schema() -> (Schema, Fields) {
    let mut b = Schema::builder();
    let docid = b.add_text_field(DOCID_FIELD, STRING | STORED | FAST);
    let title = b.add_text_field("title", STORED);
    let text = b.add_text_field("text", STORED);
    // Analyzed by our analyzer (see analyzer.rs); lengths live in `len`, so tantivy's lossy norms are off.
    let indexing = TextFieldIndexing::default()
        .set_tokenizer(analyzer::TANTIVY_TOKENIZER)
        .set_index_option(IndexRecordOption::WithFreqs)
        .set_fieldnorms(false);
    let contents = b.add_text_field("contents", TextOptions::default().set_indexing_options(indexing));
    let len = b.add_u64_field(LEN_FIELD, NumericOptions::default().set_fast());
    (b.build(), Fields { docid, title, text, contents, len })
}

/// A stored document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoredDoc {
    pub docid: String,
    pub title: String,
    pub text: String,
}

/// One first-stage hit.
#[derive(Debug, Clone)]
pub struct Hit {
    pub address: DocAddress,
    pub docid: String,
    pub score: f32,
}

/// An open collection: its index, a reader that follows commits, and what is cached per commit. Reads go
/// through a `Snapshot`.
pub struct Collection {
    name: String,
    path: PathBuf,
    /// The directory's identity when opened: a `--replace` swaps in another directory under the same name.
    dir_id: Option<DirId>,
    /// Unique to this opening in the process: what is kept per collection (stores of model outputs) is kept
    /// per opening, so a collection opened again after a `--replace` starts afresh.
    opening: u64,
    reader: IndexReader,
    fields: Fields,
    /// Statistics of the last few commits (requests may hold snapshots of different ones).
    stats: Mutex<Vec<(u64, CollectionStats)>>,
    norms: Mutex<HashMap<search::NormKey, Arc<Vec<f32>>>>,
    docids: Mutex<HashMap<SegmentId, Arc<search::DocidTable>>>,
}

impl Collection {
    pub fn open(path: &Path) -> Result<Collection, IndexError> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        let meta_path = path.join(META_FILE);
        let meta: CollectionMeta = std::fs::read(&meta_path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(CollectionMeta { name: name.clone(), analyzer: "unknown".into() });
        if meta.analyzer != ANALYZER_VERSION {
            return Err(IndexError::Incompatible { name, found: meta.analyzer, expected: ANALYZER_VERSION.into() });
        }
        let tantivy_err = |source| IndexError::Tantivy { path: path.to_path_buf(), source };
        let index = Index::open_in_dir(path).map_err(tantivy_err)?;
        let (_, fields) = schema();
        let reader =
            index.reader_builder().reload_policy(ReloadPolicy::OnCommitWithDelay).try_into().map_err(tantivy_err)?;
        Ok(Collection {
            name,
            path: path.to_path_buf(),
            dir_id: DirId::of(path),
            opening: {
                static OPENINGS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                OPENINGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            },
            reader,
            fields,
            stats: Mutex::default(),
            norms: Mutex::default(),
            docids: Mutex::default(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// This opening of the collection (see the field).
    pub fn opening(&self) -> u64 {
        self.opening
    }

    /// The collection's directory (the index, and files kept beside it such as embeddings).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A consistent view of the collection as of its last commit, for every read of one request.
    pub fn snapshot(&self) -> Snapshot<'_> {
        Snapshot { collection: self, searcher: self.reader.searcher(), cancel: Cancel::default() }
    }

    /// The view a snapshot had, taken again (a batch job keeps its `Point` across topics).
    pub fn at(&self, point: &Point) -> Snapshot<'_> {
        Snapshot { collection: self, searcher: point.0.clone(), cancel: Cancel::default() }
    }

    fn tantivy_err(&self, source: tantivy::TantivyError) -> IndexError {
        IndexError::Tantivy { path: self.path.clone(), source }
    }

    /// Live documents now.
    pub fn num_docs(&self) -> u64 {
        self.snapshot().num_docs()
    }

    /// When the index was last committed.
    pub fn built_at(&self) -> Option<std::time::SystemTime> {
        self.path.join("meta.json").metadata().ok()?.modified().ok()
    }

    /// The fingerprint of the index files as last committed (`index::fingerprint`): equal on every copy.
    pub fn fingerprint(&self) -> Result<String, IndexError> {
        fingerprint(&self.path)
    }

    /// Bytes the index takes on disk.
    pub fn size_bytes(&self) -> u64 {
        std::fs::read_dir(&self.path)
            .map(|entries| entries.filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum())
            .unwrap_or(0)
    }
}

/// One consistent view of a collection: every read of a request (or a batch job) goes through one snapshot, so
/// that document addresses a search finds name the same documents when fetched, and statistics, texts and
/// postings agree, whatever commits land meanwhile (tantivy keeps a snapshot's segments alive).
pub struct Snapshot<'c> {
    collection: &'c Collection,
    searcher: Searcher,
    /// The request's: its reads stop when it is cancelled or past its deadline.
    cancel: Cancel,
}

/// A snapshot's point in the collection's history, kept beyond a borrow (`Collection::at`).
#[derive(Clone)]
pub struct Point(Searcher);

impl<'c> Snapshot<'c> {
    /// The snapshot for work that stops when `cancel` says so (`IndexError::Cancelled`).
    pub fn cancellable(self, cancel: &Cancel) -> Snapshot<'c> {
        Snapshot { cancel: cancel.clone(), ..self }
    }

    /// `Err(Cancelled)` once the work's requester is gone or its deadline passed.
    fn go_on(&self) -> Result<(), IndexError> {
        if self.cancel.is_cancelled() {
            return Err(IndexError::Cancelled);
        }
        Ok(())
    }

    pub fn collection(&self) -> &'c Collection {
        self.collection
    }

    pub fn point(&self) -> Point {
        Point(self.searcher.clone())
    }

    /// Live documents.
    pub fn num_docs(&self) -> u64 {
        self.searcher.num_docs()
    }

    /// The statistics BM25 needs, computed once per commit from the exact lengths of live documents.
    pub fn stats(&self) -> Result<CollectionStats, IndexError> {
        let searcher = &self.searcher;
        let generation = searcher.generation().generation_id();
        if let Some((_, stats)) = self.collection.stats.lock().iter().find(|(g, _)| *g == generation) {
            return Ok(*stats);
        }
        let (mut docs, mut total) = (0u64, 0u64);
        for segment in searcher.segment_readers() {
            let lens = segment.fast_fields().u64(LEN_FIELD).map_err(|e| self.collection.tantivy_err(e))?;
            for doc in segment.doc_ids_alive() {
                let len = lens.values.get_val(doc);
                if len > 0 {
                    docs += 1;
                    total += len;
                }
            }
        }
        let avg_len = if docs > 0 { total as f64 / docs as f64 } else { 0.0 };
        let stats = CollectionStats { num_docs: docs, avg_len };
        let mut cached = self.collection.stats.lock();
        if cached.len() >= 4 {
            cached.remove(0);
        }
        cached.push((generation, stats));
        Ok(stats)
    }

    /// The number of documents holding an analyzed term (replaced ones included until merged).
    pub fn doc_freq(&self, term: &str) -> Result<u64, IndexError> {
        let term = Term::from_field_text(self.collection.fields.contents, term);
        self.searcher.doc_freq(&term).map_err(|e| self.collection.tantivy_err(e))
    }

    /// The stored document at an address.
    pub fn document(&self, address: DocAddress) -> Result<StoredDoc, IndexError> {
        let doc: TantivyDocument = self.searcher.doc(address).map_err(|e| self.collection.tantivy_err(e))?;
        let get = |field| doc.get_first(field).and_then(|v| v.as_str()).unwrap_or_default().to_string();
        Ok(StoredDoc {
            docid: get(self.collection.fields.docid),
            title: get(self.collection.fields.title),
            text: get(self.collection.fields.text),
        })
    }

    /// The commit this snapshot reads (equal generations hold the same documents at the same addresses).
    pub fn generation(&self) -> u64 {
        self.searcher.generation().generation_id()
    }

    /// Every live document with its address, one at a time (the collection is never held in memory).
    pub fn for_each_document<E: From<IndexError>>(
        &self,
        mut f: impl FnMut(DocAddress, StoredDoc) -> Result<(), E>,
    ) -> Result<(), E> {
        let searcher = &self.searcher;
        for (ordinal, segment) in searcher.segment_readers().iter().enumerate() {
            let alive = segment.alive_bitset();
            for doc in 0..segment.max_doc() {
                if alive.is_some_and(|a| !a.is_alive(doc)) {
                    continue;
                }
                let address = DocAddress::new(ordinal as u32, doc);
                f(address, self.document(address)?)?;
            }
        }
        Ok(())
    }

    /// Every live document's address, with the id of the index segment holding it: a segment's documents never
    /// change (a commit adds segments, deletes from them, or merges them into new ones), so what was computed
    /// from a segment's documents holds while it lives, whatever the commit.
    pub fn for_each_address<E>(&self, mut f: impl FnMut(SegmentId, DocAddress) -> Result<(), E>) -> Result<(), E> {
        for (ordinal, segment) in self.searcher.segment_readers().iter().enumerate() {
            for doc in segment.doc_ids_alive() {
                f(segment.segment_id(), DocAddress::new(ordinal as u32, doc))?;
            }
        }
        Ok(())
    }

    /// The live document with this docid, if any.
    pub fn get(&self, docid: &str) -> Result<Option<StoredDoc>, IndexError> {
        let query =
            TermQuery::new(Term::from_field_text(self.collection.fields.docid, docid), IndexRecordOption::Basic);
        let found =
            self.searcher.search(&query, &TopDocs::with_limit(1)).map_err(|e| self.collection.tantivy_err(e))?;
        found.first().map(|(_, address)| self.document(*address)).transpose()
    }
}

/// A directory's device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DirId(u64, u64);

impl DirId {
    fn of(path: &Path) -> Option<DirId> {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).ok().map(|m| DirId(m.dev(), m.ino()))
    }
}

/// What `Catalog::sync` changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CatalogChanges {
    pub added: Vec<String>,
    pub replaced: Vec<String>,
    pub removed: Vec<String>,
    /// Collections whose directory could not be opened (kept as they were, if open before).
    pub failed: Vec<(String, String)>,
}

impl CatalogChanges {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.replaced.is_empty() && self.removed.is_empty() && self.failed.is_empty()
    }
}

/// Every collection under `DATA_DIR/collections`.
pub struct Catalog {
    root: PathBuf,
    collections: RwLock<BTreeMap<String, Arc<Collection>>>,
    /// Directories `sync` could not open, not tried again until they change.
    unopenable: Mutex<HashMap<String, Option<DirId>>>,
}

impl Catalog {
    /// Opens every collection in the data directory (creating the directory if needed). Collections that
    /// fail to open are reported in the second value and left out.
    pub fn open(data_dir: &Path) -> Result<(Catalog, Vec<IndexError>), IndexError> {
        Catalog::open_with(data_dir, true)
    }

    /// `open` for a replica, which never writes its copy: an interrupted swap or deletion is left alone (and
    /// its directory unserved) rather than repaired.
    pub fn open_read_only(data_dir: &Path) -> Result<(Catalog, Vec<IndexError>), IndexError> {
        Catalog::open_with(data_dir, false)
    }

    fn open_with(data_dir: &Path, repair: bool) -> Result<(Catalog, Vec<IndexError>), IndexError> {
        let root = data_dir.join("collections");
        std::fs::create_dir_all(&root).map_err(|source| IndexError::Io { path: root.clone(), source })?;
        if repair {
            build::recover_interrupted_swaps(&root)?;
        }
        let mut collections = BTreeMap::new();
        let mut failures = Vec::new();
        let entries = std::fs::read_dir(&root).map_err(|source| IndexError::Io { path: root.clone(), source })?;
        for entry in entries.filter_map(|e| e.ok()) {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().to_string();
            if repair && name.starts_with('.') && name.ends_with(".deleting") {
                // A deletion cut short: finish it.
                std::fs::remove_dir_all(&path).map_err(|source| IndexError::Io { path: path.clone(), source })?;
                continue;
            }
            if name.starts_with('.') || !path.is_dir() {
                continue;
            }
            match Collection::open(&path) {
                Ok(c) => {
                    collections.insert(name, Arc::new(c));
                }
                Err(e) => failures.push(e),
            }
        }
        Ok((Catalog { root, collections: RwLock::new(collections), unopenable: Mutex::default() }, failures))
    }

    /// `DATA_DIR/collections`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn collection_dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    pub fn get(&self, name: &str) -> Result<Arc<Collection>, IndexError> {
        self.read().get(name).cloned().ok_or_else(|| IndexError::UnknownCollection(name.to_string()))
    }

    pub fn names(&self) -> Vec<String> {
        self.read().keys().cloned().collect()
    }

    pub fn all(&self) -> Vec<Arc<Collection>> {
        self.read().values().cloned().collect()
    }

    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }

    /// Opens (or re-opens) one collection after it was built.
    pub fn refresh(&self, name: &str) -> Result<Arc<Collection>, IndexError> {
        let collection = Arc::new(Collection::open(&self.collection_dir(name))?);
        self.collections.write().insert(name.to_string(), collection.clone());
        Ok(collection)
    }

    /// Deletes a collection (refused while another process writes it): out of the catalog, then its directory
    /// renamed aside (the collection disappears at once, for every process) and removed. A deletion cut short
    /// leaves `.NAME.deleting`, removed at the next open. Searches holding the collection finish on what they
    /// hold.
    pub fn delete(&self, name: &str) -> Result<(), IndexError> {
        validate_name(name)?;
        let dir = self.collection_dir(name);
        if !dir.is_dir() {
            return Err(IndexError::UnknownCollection(name.to_string()));
        }
        let _writer = WriterLock::take(&self.root, name)?;
        self.collections.write().remove(name);
        remove_collection_dir(&self.root, name)
    }

    /// Follows the data directory as another process (the CLI) changed it: a collection built since appears,
    /// one rebuilt with `--replace` (another directory under its name) is opened again, and a deleted one
    /// goes. Documents added to an open collection need none of this (its reader follows commits). Staging
    /// and deleting directories (`.NAME.*`) are not collections; a name missing beside `.NAME.old` is a swap
    /// between its two renames and stays as it is.
    pub fn sync(&self) -> CatalogChanges {
        let mut changes = CatalogChanges::default();
        let Ok(entries) = std::fs::read_dir(&self.root) else { return changes };
        let mut present = std::collections::BTreeSet::new();
        for entry in entries.filter_map(|e| e.ok()) {
            let name = entry.file_name().to_string_lossy().to_string();
            if name.starts_with('.') || !entry.path().is_dir() || validate_name(&name).is_err() {
                continue;
            }
            present.insert(name.clone());
            let current = DirId::of(&entry.path());
            let known = self.read().get(&name).map(|c| c.dir_id);
            if known.is_some_and(|id| id == current) || self.unopenable.lock().get(&name) == Some(&current) {
                continue;
            }
            match Collection::open(&entry.path()) {
                Ok(collection) => {
                    self.unopenable.lock().remove(&name);
                    self.collections.write().insert(name.clone(), Arc::new(collection));
                    if known.is_some() { &mut changes.replaced } else { &mut changes.added }.push(name);
                }
                Err(e) => {
                    self.unopenable.lock().insert(name.clone(), current);
                    changes.failed.push((name, e.to_string()));
                }
            }
        }
        let gone: Vec<String> = self
            .read()
            .keys()
            .filter(|name| !present.contains(*name) && !self.root.join(format!(".{name}.old")).exists())
            .cloned()
            .collect();
        for name in gone {
            self.collections.write().remove(&name);
            changes.removed.push(name);
        }
        changes
    }

    fn read(&self) -> parking_lot::RwLockReadGuard<'_, BTreeMap<String, Arc<Collection>>> {
        self.collections.read()
    }
}

/// Removes collection `name`'s directory under `root`: renamed aside first (it disappears at once, for every
/// process), then removed; `.NAME.deleting` left by a crash is removed at the next open. The caller holds the
/// collection's `WriterLock`.
pub fn remove_collection_dir(root: &Path, name: &str) -> Result<(), IndexError> {
    let (dir, aside) = (root.join(name), root.join(format!(".{name}.deleting")));
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| IndexError::Io { path, source }
    };
    std::fs::rename(&dir, &aside).map_err(io(&dir))?;
    std::fs::remove_dir_all(&aside).map_err(io(&aside))
}

/// Collection names become directory names: keep them to a safe alphabet.
/// `validate_name`'s rule as a regular expression (for the OpenAPI document).
pub const NAME_PATTERN: &str = "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$";

pub fn validate_name(name: &str) -> Result<(), IndexError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(IndexError::InvalidName(name.to_string()))
    }
}
