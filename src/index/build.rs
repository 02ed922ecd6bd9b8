//! Building a collection's index from a corpus, streaming: one document in memory at a time (plus
//! tantivy's bounded indexing buffer).
//!
//! Crash safety: every build commits every `commit_every` documents, and each commit records (in tantivy's
//! commit payload) which input files are completely indexed, so a re-run after a crash skips them and re-reads
//! the rest (same docids replace, so nothing is doubled). A collection's first build and `--replace` build
//! into a hidden staging directory moved into place at the end: the old index serves until then, and a first
//! build that fails leaves no (empty or partial) collection behind. Adding to a collection commits in place.

use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Instant, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tantivy::{Index, IndexWriter, TantivyDocument, Term};

use super::{analyzer, schema, validate_name, CollectionMeta, Fields, IndexError, ANALYZER_VERSION, META_FILE};
use crate::corpus::{Corpus, CorpusError, Document};
use crate::progress::{Progress, Unit};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    /// Report the malformed document (file and byte offset) and go on.
    #[default]
    Skip,
    /// Stop at the first malformed document; nothing after the last commit is kept.
    Abort,
}

#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub on_error: OnError,
    /// Rebuild from scratch instead of adding to the existing collection.
    pub replace: bool,
    /// tantivy's indexing buffer, all threads together; bounds the indexer's memory.
    pub memory_budget_mb: usize,
    /// Indexing threads (0: up to the number of cores, at most 4).
    pub threads: usize,
    /// Commit after this many documents, so that an interrupted build keeps its progress.
    pub commit_every: u64,
    /// Stops the build (`IndexError::Cancelled`) at its next document: what it committed before stays.
    pub cancel: crate::cancel::Cancel,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            on_error: OnError::Skip,
            replace: false,
            memory_budget_mb: 256,
            threads: 0,
            commit_every: 100_000,
            cancel: crate::cancel::Cancel::default(),
        }
    }
}

/// What a build did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BuildReport {
    pub collection: String,
    pub indexed: u64,
    /// Documents skipped as malformed.
    pub skipped: u64,
    /// Documents left out as empty (title and text whitespace alone): nothing to match or score, as Anserini
    /// leaves them out (its `empty` counter).
    pub empty: u64,
    /// Documents indexed whose bytes were not UTF-8 and named no encoding, read as windows-1252 (a guess).
    pub guessed_encoding: u64,
    /// Input files skipped because they hold no documents (topics, qrels or runs beside the documents, or a
    /// format not recognized).
    pub skipped_files: u64,
    pub duplicates: u64,
    /// Input files left alone because an earlier (interrupted) run had indexed them completely.
    pub files_already_indexed: usize,
    pub documents_in_collection: u64,
    pub elapsed_s: f64,
    /// The first problems met, each with its file and position.
    pub problems: Vec<Problem>,
}

const MAX_PROBLEMS_KEPT: usize = 100;

/// A problem a build met: a malformed document, a duplicate docid, a file that holds no documents.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Problem {
    pub file: String,
    /// The line, in line-based formats (JSON lines, TSV).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    /// The byte offset of the document in the (decompressed) file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub docid: Option<String>,
    pub message: String,
}

impl Problem {
    fn in_file(file: &Path, message: String) -> Problem {
        Problem { file: file.display().to_string(), line: None, offset: None, docid: None, message }
    }

    fn of(e: &CorpusError) -> Problem {
        match e {
            CorpusError::Malformed { at, message } => Problem {
                file: at.path.display().to_string(),
                line: at.line,
                offset: Some(at.offset),
                docid: None,
                message: message.clone(),
            },
            CorpusError::Io { path, source } => Problem::in_file(path, source.to_string()),
            CorpusError::UnknownFormat { path } | CorpusError::NotDocuments { path, .. } => {
                let text = e.to_string();
                let prefix = format!("{}: ", path.display());
                Problem::in_file(path, text.strip_prefix(&prefix).unwrap_or(&text).to_string())
            }
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.line, self.offset) {
            (Some(line), Some(offset)) => write!(f, "{}:{line} (byte {offset}): {}", self.file, self.message),
            (None, Some(offset)) => write!(f, "{} at byte {offset}: {}", self.file, self.message),
            _ => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

/// An input file as recorded in the commit payload: same path, size and modification time means done.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct FileStamp {
    path: PathBuf,
    size: u64,
    mtime: u64,
}

impl FileStamp {
    fn of(path: &Path) -> Option<FileStamp> {
        let meta = path.metadata().ok()?;
        let mtime = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?.as_secs();
        let path = path.canonicalize().ok()?;
        Some(FileStamp { path, size: meta.len(), mtime })
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Payload {
    files: Vec<FileStamp>,
}

/// Builds (or adds to) collection `name` under `data_dir` from `corpus`.
pub fn build(
    data_dir: &Path,
    name: &str,
    corpus: &Corpus,
    opts: &BuildOptions,
    progress: &dyn Progress,
) -> Result<BuildReport, IndexError> {
    validate_name(name)?;
    let started = Instant::now();
    let root = data_dir.join("collections");
    let final_dir = root.join(name);
    // A rebuild, and a collection's first build, happen in `.NAME.building`, moved into place when done: the
    // old index serves until then, and a first build that fails leaves no collection behind (run again, it
    // resumes from its last commit there). Adding to a collection commits in place.
    std::fs::create_dir_all(&root).map_err(|source| IndexError::Io { path: root.clone(), source })?;
    // One writer at a time: a second `--replace` would remove the first's staging directory.
    let _writer = super::WriterLock::take(&root, name)?;
    let exists = final_dir.exists();
    let staging = opts.replace || !exists;
    let work_dir = if staging { root.join(format!(".{name}.building")) } else { final_dir.clone() };
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| IndexError::Io { path, source }
    };
    if opts.replace && work_dir.exists() {
        std::fs::remove_dir_all(&work_dir).map_err(io_err(&work_dir))?;
    }
    std::fs::create_dir_all(&work_dir).map_err(io_err(&work_dir))?;
    let tantivy_err = |source| IndexError::Tantivy { path: work_dir.clone(), source };

    let (schema, fields) = schema();
    let fresh = !work_dir.join("meta.json").exists();
    let index = if fresh {
        let meta = CollectionMeta { name: name.to_string(), analyzer: ANALYZER_VERSION.to_string() };
        let meta_path = work_dir.join(META_FILE);
        std::fs::write(&meta_path, serde_json::to_vec_pretty(&meta).unwrap_or_default()).map_err(io_err(&meta_path))?;
        Index::create_in_dir(&work_dir, schema).map_err(tantivy_err)?
    } else {
        super::Collection::open(&work_dir)?; // refuses an incompatible analyzer
        Index::open_in_dir(&work_dir).map_err(tantivy_err)?
    };
    index.tokenizers().register(analyzer::TANTIVY_TOKENIZER, analyzer::TantivyAnalyzer);
    let mut payload: Payload = if opts.replace {
        Payload::default()
    } else {
        index.load_metas().map_err(tantivy_err)?.payload.and_then(|p| serde_json::from_str(&p).ok()).unwrap_or_default()
    };
    let had_documents = !fresh && !opts.replace && index.reader().map_err(tantivy_err)?.searcher().num_docs() > 0;

    let threads = match opts.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()).min(4),
        n => n,
    };
    // tantivy wants at least 15 MB per thread.
    let budget = (opts.memory_budget_mb << 20).max(threads * (16 << 20));
    let mut writer: IndexWriter = index.writer_with_num_threads(threads, budget).map_err(tantivy_err)?;

    progress.phase(&format!("indexing {name}"), corpus.total_bytes(), Unit::Bytes);
    let bytes_read = corpus.bytes_read();
    let mut report = BuildReport { collection: name.to_string(), ..Default::default() };
    let mut seen: HashSet<u64> = HashSet::new();
    let mut committed_at = 0u64;
    // Documents of an earlier run may share docids with new ones: then every add first deletes its docid.
    // Within this run, `seen` finds duplicates (a delete per document would cost memory until each commit).
    let replace_existing = had_documents;
    // A run that adds nothing (every file already indexed) commits nothing: a commit rewrites meta.json, where
    // tantivy orders segments of equal size as its hash map does, so the unchanged collection would read as
    // changed (a new fingerprint, a new version published).
    let mut changed = staging;

    for file in corpus.files() {
        let stamp = FileStamp::of(file);
        if stamp.as_ref().is_some_and(|s| payload.files.contains(s)) {
            report.files_already_indexed += 1;
            continue;
        }
        let docs = match corpus.read_file(file) {
            Ok(docs) => docs,
            Err(e) if e.is_not_documents() => {
                report.skipped_files += 1;
                report.note("skipped file ", Problem::of(&e));
                continue;
            }
            Err(e) => {
                report.problem(&e, opts.on_error)?;
                continue;
            }
        };
        for doc in docs {
            if opts.cancel.is_cancelled() {
                return Err(IndexError::Cancelled);
            }
            match doc {
                Ok(doc) if doc.title.trim().is_empty() && doc.text.trim().is_empty() => {
                    report.empty += 1;
                    let message = "empty document (no text): left out, nothing to match or score".to_string();
                    report.note("", Problem { docid: Some(doc.id.clone()), ..Problem::in_file(file, message) });
                }
                Ok(doc) => {
                    if let Some(encoding) = doc.guessed_encoding {
                        report.guessed_encoding += 1;
                        // Counted always, named (and logged) the first times: a web crawl can hold millions.
                        if report.guessed_encoding <= MAX_PROBLEMS_KEPT as u64 {
                            let message = format!("not UTF-8 and no encoding named: read as {encoding}");
                            let docid = Some(doc.id.clone());
                            report.note("", Problem { docid, ..Problem::in_file(file, message) });
                        }
                    }
                    let first_time = seen.insert(hash_id(&doc.id));
                    if !first_time {
                        report.duplicates += 1;
                        let message = format!("duplicate docid {:?}; the later document replaces it", doc.id);
                        let docid = Some(doc.id.clone());
                        report.note("", Problem { docid, ..Problem::in_file(file, message) });
                    }
                    add_document(&writer, fields, &doc, replace_existing || !first_time).map_err(tantivy_err)?;
                    report.indexed += 1;
                    changed = true;
                }
                Err(e) => report.problem(&e, opts.on_error)?,
            }
            if report.indexed.is_multiple_of(256) {
                let rate = report.indexed as f64 / started.elapsed().as_secs_f64().max(1e-3);
                let note = format!("{} docs, {rate:.0} docs/s", report.indexed);
                progress.set(bytes_read.load(Ordering::Relaxed), &note);
            }
            if report.indexed - committed_at >= opts.commit_every {
                commit(&mut writer, &payload).map_err(tantivy_err)?;
                committed_at = report.indexed;
            }
        }
        if let Some(stamp) = stamp {
            payload.files.push(stamp);
            changed = true;
        }
    }
    if changed {
        commit(&mut writer, &payload).map_err(tantivy_err)?;
    }
    writer.wait_merging_threads().map_err(tantivy_err)?;

    if staging {
        install(&root, name, &work_dir)?;
    }
    let reader = Index::open_in_dir(&final_dir).and_then(|i| i.reader()).map_err(tantivy_err)?;
    report.documents_in_collection = reader.searcher().num_docs();
    report.elapsed_s = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Deletes documents of collection `name` by docid, in one commit; how many of the ids it held.
pub fn delete_documents(data_dir: &Path, name: &str, ids: &[String]) -> Result<u64, IndexError> {
    validate_name(name)?;
    let root = data_dir.join("collections");
    let dir = root.join(name);
    if !dir.is_dir() {
        return Err(IndexError::UnknownCollection(name.to_string()));
    }
    let _writer = super::WriterLock::take(&root, name)?;
    super::Collection::open(&dir)?; // refuses an incompatible analyzer
    let tantivy_err = |source| IndexError::Tantivy { path: dir.clone(), source };
    let index = Index::open_in_dir(&dir).map_err(tantivy_err)?;
    let (_, fields) = schema();
    let searcher = index.reader().map_err(tantivy_err)?.searcher();
    let mut held = 0;
    let mut seen = HashSet::new();
    for id in ids.iter().filter(|id| seen.insert(id.as_str())) {
        let term = Term::from_field_text(fields.docid, id);
        held += u64::from(searcher.doc_freq(&term).map_err(tantivy_err)? > 0);
    }
    let payload: Payload = index
        .load_metas()
        .map_err(tantivy_err)?
        .payload
        .and_then(|p| serde_json::from_str(&p).ok())
        .unwrap_or_default();
    if held == 0 {
        return Ok(0); // nothing to delete: no commit, meta.json as it was (see `build`)
    }
    let mut writer: IndexWriter = index.writer_with_num_threads(1, 16 << 20).map_err(tantivy_err)?;
    for id in ids {
        writer.delete_term(Term::from_field_text(fields.docid, id));
    }
    commit(&mut writer, &payload).map_err(tantivy_err)?;
    Ok(held)
}

impl BuildReport {
    /// Logs a problem after `what` and keeps the first ones.
    fn note(&mut self, what: &str, problem: Problem) {
        tracing::warn!("{what}{problem}");
        if self.problems.len() < MAX_PROBLEMS_KEPT {
            self.problems.push(problem);
        }
    }

    /// Records a bad document or file; under `abort` it ends the build.
    fn problem(&mut self, e: &CorpusError, on_error: OnError) -> Result<(), IndexError> {
        if on_error == OnError::Abort {
            return Err(IndexError::Aborted(e.to_string()));
        }
        self.skipped += 1;
        self.note("skipped: ", Problem::of(e));
        Ok(())
    }
}

/// Adds a document; `delete_first` removes any document with the same docid first. The text is analyzed
/// in tantivy's indexing threads; only its length is counted here.
fn add_document(writer: &IndexWriter, fields: Fields, doc: &Document, delete_first: bool) -> tantivy::Result<()> {
    if delete_first {
        writer.delete_term(Term::from_field_text(fields.docid, &doc.id));
    }
    let contents = searchable_text(doc);
    let mut d = TantivyDocument::default();
    d.add_text(fields.docid, &doc.id);
    d.add_text(fields.title, &doc.title);
    d.add_text(fields.text, &doc.text);
    d.add_u64(fields.len, analyzer::count_terms(&contents) as u64);
    d.add_text(fields.contents, &contents);
    writer.add_document(d)?;
    Ok(())
}

/// What BM25 sees: the text, with the title in front unless the text already starts with it (TREC and
/// the shared JSONL collections repeat the headline in the text; web pages do not).
pub fn searchable_text(doc: &Document) -> std::borrow::Cow<'_, str> {
    let title = doc.title.trim();
    if title.is_empty() || doc.text.trim_start().starts_with(title) {
        std::borrow::Cow::Borrowed(&doc.text)
    } else {
        std::borrow::Cow::Owned(format!("{title}\n\n{}", doc.text))
    }
}

fn commit(writer: &mut IndexWriter, payload: &Payload) -> tantivy::Result<()> {
    let mut prepared = writer.prepare_commit()?;
    prepared.set_payload(&serde_json::to_string(payload).unwrap_or_default());
    prepared.commit()?;
    crate::hooks::point("index.commit");
    Ok(())
}

fn hash_id(id: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    id.hash(&mut h);
    h.finish()
}

/// Puts the finished staging directory in place as `root/name`, replacing the collection there if any. The old
/// index is renamed aside first, so a crash between the two renames is repaired at the next start by
/// `recover_interrupted_swaps`. The caller holds the collection's `WriterLock`.
pub fn install(root: &Path, name: &str, staging: &Path) -> Result<(), IndexError> {
    let final_dir = root.join(name);
    let old = root.join(format!(".{name}.old"));
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| IndexError::Io { path, source }
    };
    if !final_dir.exists() {
        return std::fs::rename(staging, &final_dir).map_err(io_err(staging));
    }
    if old.exists() {
        std::fs::remove_dir_all(&old).map_err(io_err(&old))?;
    }
    std::fs::rename(&final_dir, &old).map_err(io_err(&final_dir))?;
    std::fs::rename(staging, &final_dir).map_err(io_err(staging))?;
    std::fs::remove_dir_all(&old).map_err(io_err(&old))?;
    Ok(())
}

/// A change to a collection made out of sight (a cluster's writer applying a task): the collection's committed
/// files (and its model caches) linked into a data directory of its own (`DATA_DIR/.applying`), where `build` and
/// `delete_documents` commit as they would in place, while the collection serves what it holds. `install` puts
/// the result in place; dropped before that, it leaves no trace. Holds the collection's `WriterLock` throughout,
/// so that no pull installs a version meanwhile. A copy a crash left is removed by the next one.
pub struct Staged {
    root: PathBuf,
    name: String,
    data_dir: PathBuf,
    _writer: super::WriterLock,
}

impl Staged {
    /// Stages collection `name` of `data_dir` (an empty stage for a collection that does not exist yet).
    pub fn new(data_dir: &Path, name: &str) -> Result<Staged, IndexError> {
        validate_name(name)?;
        let root = data_dir.join("collections");
        std::fs::create_dir_all(&root).map_err(|source| IndexError::Io { path: root.clone(), source })?;
        let writer = super::WriterLock::take(&root, name)?;
        let staged = Staged { root, name: name.to_string(), data_dir: Staged::area(data_dir), _writer: writer };
        let dir = staged.dir();
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| IndexError::Io { path, source }
        };
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
        }
        let from = staged.root.join(name);
        if from.is_dir() {
            std::fs::create_dir_all(&dir).map_err(io(&dir))?;
            // Committed files never change in place (tantivy writes new ones and replaces meta.json by a rename):
            // links cost nothing and the collection's own files stay as they are.
            for file in super::published_files(&from)? {
                std::fs::hard_link(from.join(&file), dir.join(&file)).map_err(io(&dir.join(&file)))?;
            }
            link_caches(&from, &dir)?;
        }
        Ok(staged)
    }

    /// Where `data_dir`'s changes are staged.
    fn area(data_dir: &Path) -> PathBuf {
        data_dir.join(".applying")
    }

    /// Removes what a process stopped mid-change had staged in `data_dir` (at a start: it serves no one).
    pub fn clear(data_dir: &Path) -> Result<(), IndexError> {
        let area = Staged::area(data_dir);
        match std::fs::remove_dir_all(&area) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(IndexError::Io { path: area, source: e }),
            _ => Ok(()),
        }
    }

    /// The data directory to write the change in, as `build(data_dir, name, …)` takes it.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The staged collection's directory.
    pub fn dir(&self) -> PathBuf {
        self.data_dir.join("collections").join(&self.name)
    }

    /// Puts the staged collection in place of the collection (`install`).
    pub fn install(self) -> Result<(), IndexError> {
        install(&self.root, &self.name, &self.dir())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        let dir = self.dir();
        if dir.exists() {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!("removing {}: {e}", dir.display());
            }
        }
    }
}

/// Model outputs kept beside the index (a bi-encoder's segment embeddings, stored cross-encoder scores) are
/// keyed by text, so they hold for every version of the collection: linked into another directory of it rather
/// than lost. A file `to` has already (a pulled version's vectors) stays.
pub fn link_caches(from: &Path, to: &Path) -> Result<(), IndexError> {
    for cache in ["embeddings", "scores"] {
        let Ok(entries) = std::fs::read_dir(from.join(cache)) else { continue };
        let target = to.join(cache);
        std::fs::create_dir_all(&target).map_err(|source| IndexError::Io { path: target.clone(), source })?;
        for entry in entries.filter_map(|e| e.ok()).filter(|e| e.file_type().is_ok_and(|t| t.is_file())) {
            let link = target.join(entry.file_name());
            if link.exists() {
                continue;
            }
            std::fs::hard_link(entry.path(), &link).map_err(|source| IndexError::Io { path: link, source })?;
        }
    }
    Ok(())
}

/// Finishes or undoes a swap cut short by a crash: `.NAME.old` without `NAME` goes back into place;
/// `.NAME.old` beside a `NAME` is a finished swap's leftover.
pub(super) fn recover_interrupted_swaps(root: &Path) -> Result<(), IndexError> {
    let Ok(entries) = std::fs::read_dir(root) else { return Ok(()) };
    for entry in entries.filter_map(|e| e.ok()) {
        let file_name = entry.file_name().to_string_lossy().to_string();
        let Some(name) = file_name.strip_prefix('.').and_then(|n| n.strip_suffix(".old")) else { continue };
        let target = root.join(name);
        let result = if target.exists() {
            std::fs::remove_dir_all(entry.path())
        } else {
            tracing::warn!("restoring collection {name} after an interrupted --replace");
            std::fs::rename(entry.path(), &target)
        };
        result.map_err(|source| IndexError::Io { path: entry.path(), source })?;
    }
    Ok(())
}
