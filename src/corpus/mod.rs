//! Collections: streaming readers that yield `{id, title, text}` one document at a time from TREC SGML,
//! GOV2 web bundles, JSONL and TSV files, gzipped or not, in files or directory trees.

mod markup;
mod trec;
mod web;

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use markup::normalize_whitespace;

/// One document as every layer above sees it. `text` keeps paragraph breaks as `\n\n`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Document {
    pub id: String,
    pub title: String,
    pub text: String,
    /// The encoding the document's bytes were read as where they were not UTF-8 and named none: a guess,
    /// which the build reports.
    #[serde(skip)]
    pub guessed_encoding: Option<&'static str>,
}

/// Where a document (or a problem) sits: the file, the line for line-based formats, and the byte offset
/// in the decompressed content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub path: PathBuf,
    pub line: Option<u64>,
    pub offset: u64,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line} (byte {})", self.path.display(), self.offset),
            None => write!(f, "{} at byte {}", self.path.display(), self.offset),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("{at}: {message}")]
    Malformed { at: Location, message: String },
    #[error("{}: cannot tell the format from the content (not TREC SGML, GOV2, JSONL or TSV); pass --format", path.display())]
    UnknownFormat { path: PathBuf },
    #[error("{}: {what}, not documents", path.display())]
    NotDocuments { path: PathBuf, what: &'static str },
}

impl CorpusError {
    /// A whole file that holds no documents (rather than a bad document): the build skips it as a file.
    pub fn is_not_documents(&self) -> bool {
        matches!(self, CorpusError::UnknownFormat { .. } | CorpusError::NotDocuments { .. })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Detect from each file's content.
    #[default]
    Auto,
    /// TREC SGML (`<DOC><DOCNO>..<TEXT>..`), as on TREC disks 4 and 5.
    Trec,
    /// GOV2 / web-track bundles with `<DOCHDR>` and raw pages.
    Web,
    /// One JSON object per line: `{"id","title","text"}` or Anserini's `{"id","contents"}`.
    Jsonl,
    /// `id<TAB>text`, `id<TAB>title<TAB>text` or MS MARCO's `docid<TAB>url<TAB>title<TAB>body`.
    Tsv,
}

/// The files of a collection, found by walking the given paths, read one at a time.
pub struct Corpus {
    files: Vec<PathBuf>,
    format: Format,
    bytes_read: Arc<AtomicU64>,
}

impl Corpus {
    /// Lists the files under `paths` (directories walked recursively in name order, hidden files skipped).
    pub fn open(paths: &[PathBuf], format: Format) -> Result<Corpus, CorpusError> {
        let mut files = Vec::new();
        for path in paths {
            walk(path, &mut files)?;
        }
        Ok(Corpus { files, format, bytes_read: Arc::default() })
    }

    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// Total size on disk of the files (compressed bytes for `.gz`), for progress.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().filter_map(|f| f.metadata().ok()).map(|m| m.len()).sum()
    }

    /// Bytes read from disk so far, shared with the readers (a progress counter).
    pub fn bytes_read(&self) -> Arc<AtomicU64> {
        self.bytes_read.clone()
    }

    /// The documents of one file. Errors about one document are items; an I/O error ends the file.
    pub fn read_file(&self, path: &Path) -> Result<Documents, CorpusError> {
        read_file(path, self.format, Some(self.bytes_read.clone()))
    }

    /// Every document of every file, in order.
    pub fn documents(&self) -> impl Iterator<Item = Result<Document, CorpusError>> + '_ {
        self.files.iter().flat_map(move |f| match self.read_file(f) {
            Ok(docs) => docs,
            Err(e) => Box::new(std::iter::once(Err(e))),
        })
    }
}

/// A stream of documents (or per-document errors).
pub type Documents = Box<dyn Iterator<Item = Result<Document, CorpusError>> + Send>;

fn walk(path: &Path, files: &mut Vec<PathBuf>) -> Result<(), CorpusError> {
    let io_err = |source| CorpusError::Io { path: path.to_path_buf(), source };
    let meta = std::fs::metadata(path).map_err(io_err)?;
    if meta.is_file() {
        files.push(path.to_path_buf());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(io_err)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| !p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.')))
        .collect();
    entries.sort();
    for entry in entries {
        walk(&entry, files)?;
    }
    Ok(())
}

/// Counts bytes as they come off the disk.
struct Counting<R> {
    inner: R,
    counter: Option<Arc<AtomicU64>>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(c) = &self.counter {
            c.fetch_add(n as u64, Ordering::Relaxed);
        }
        Ok(n)
    }
}

/// Opens a file for reading, decompressing gzip (detected by its magic bytes, not its name).
pub fn open_maybe_gz(path: &Path, counter: Option<Arc<AtomicU64>>) -> Result<Box<dyn BufRead + Send>, CorpusError> {
    let io_err = |source| CorpusError::Io { path: path.to_path_buf(), source };
    let file = File::open(path).map_err(io_err)?;
    let mut raw = BufReader::with_capacity(1 << 16, Counting { inner: file, counter });
    let gz = raw.fill_buf().map_err(io_err)?.starts_with(&[0x1f, 0x8b]);
    Ok(if gz {
        Box::new(BufReader::with_capacity(1 << 16, flate2::bufread::MultiGzDecoder::new(raw)))
    } else {
        Box::new(raw)
    })
}

/// Reads the documents of one file in the given format (detected from the content for `Auto`).
pub fn read_file(path: &Path, format: Format, counter: Option<Arc<AtomicU64>>) -> Result<Documents, CorpusError> {
    read(open_maybe_gz(path, counter)?, path, format)
}

/// Reads the documents of one (decompressed) stream; `path` names it in errors.
pub fn read(mut reader: Box<dyn BufRead + Send>, path: &Path, format: Format) -> Result<Documents, CorpusError> {
    // Peek at the start of the decompressed content, then read it again through a chain.
    let mut head = Vec::with_capacity(1 << 16);
    (&mut reader)
        .take(1 << 16)
        .read_to_end(&mut head)
        .map_err(|source| CorpusError::Io { path: path.to_path_buf(), source })?;
    let format = match format {
        Format::Auto => {
            if let Some(what) = not_documents(&head) {
                return Err(CorpusError::NotDocuments { path: path.to_path_buf(), what });
            }
            detect(&head).ok_or_else(|| CorpusError::UnknownFormat { path: path.to_path_buf() })?
        }
        f => f,
    };
    let reader: Box<dyn BufRead + Send> = Box::new(BufReader::new(io::Cursor::new(head).chain(reader)));
    let path = path.to_path_buf();
    Ok(match format {
        Format::Trec | Format::Web => {
            let parse = if format == Format::Web { web::parse } else { trec::parse };
            let file = path.clone();
            Box::new(trec::DocChunks::new(reader, path).map(move |chunk| {
                let (offset, raw) = chunk?;
                parse(&raw, &Location { path: file.clone(), line: None, offset })
            }))
        }
        Format::Jsonl => Lines::new(reader, path).parsed(parse_jsonl),
        Format::Tsv => Lines::new(reader, path).parsed(parse_tsv),
        Format::Auto => unreachable!("resolved above"),
    })
}

/// Guesses the format from the first bytes of a file.
pub fn detect(head: &[u8]) -> Option<Format> {
    let start = head.iter().position(|b| !b.is_ascii_whitespace())?;
    let head = &head[start..];
    let has = |needle: &[u8]| head.windows(needle.len()).any(|w| w.eq_ignore_ascii_case(needle));
    if head[0] == b'{' {
        Some(Format::Jsonl)
    } else if has(b"<DOCHDR>") {
        Some(Format::Web)
    } else if has(b"<DOC>") {
        Some(Format::Trec)
    } else if head.split(|b| *b == b'\n').next().is_some_and(|l| l.contains(&b'\t')) {
        Some(Format::Tsv)
    } else {
        None
    }
}

/// What an experiment's other files look like, found beside the documents in a walked directory: topics,
/// qrels, a run.
pub fn not_documents(head: &[u8]) -> Option<&'static str> {
    let text = String::from_utf8_lossy(head);
    let lower = text.to_ascii_lowercase();
    if !lower.contains("<doc>") && (lower.contains("<top>") || lower.contains("<topics") || lower.contains("<topic ")) {
        return Some("a topic file");
    }
    let lines: Vec<Vec<&str>> =
        text.lines().filter(|l| !l.trim().is_empty()).take(5).map(|l| l.split_whitespace().collect()).collect();
    let int = |t: &str| t.parse::<i64>().is_ok();
    let all = |f: &dyn Fn(&[&str]) -> bool| !lines.is_empty() && lines.iter().all(|l| f(l));
    if all(&|l| l.len() == 4 && (int(l[1]) || l[1] == "Q0") && int(l[3])) {
        return Some("qrels");
    }
    if all(&|l| l.len() == 6 && l[1] == "Q0" && int(l[3]) && l[4].parse::<f64>().is_ok()) {
        return Some("a TREC run");
    }
    None
}

/// Non-empty lines with their location.
struct Lines {
    reader: Box<dyn BufRead + Send>,
    path: PathBuf,
    line: u64,
    offset: u64,
}

impl Lines {
    fn new(reader: Box<dyn BufRead + Send>, path: PathBuf) -> Self {
        Lines { reader, path, line: 0, offset: 0 }
    }

    /// Each line's document through `parse`, with the encoding its bytes were guessed to be in.
    fn parsed(self, parse: fn(&str, Location) -> Result<Document, CorpusError>) -> Documents {
        Box::new(self.map(move |line| {
            let (at, line, guessed_encoding) = line?;
            parse(&line, at).map(|doc| Document { guessed_encoding, ..doc })
        }))
    }
}

impl Iterator for Lines {
    type Item = Result<(Location, String, Option<&'static str>), CorpusError>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let n = match self.reader.read_until(b'\n', &mut buf) {
                Ok(n) => n,
                Err(source) => return Some(Err(CorpusError::Io { path: self.path.clone(), source })),
            };
            if n == 0 {
                return None;
            }
            self.line += 1;
            let at = Location { path: self.path.clone(), line: Some(self.line), offset: self.offset };
            self.offset += n as u64;
            let (text, guessed) = markup::decode_bytes(&buf, None);
            let text = text.trim_end_matches(['\n', '\r']);
            if !text.trim().is_empty() {
                return Some(Ok((at, text.to_string(), guessed)));
            }
        }
    }
}

#[derive(Deserialize)]
struct JsonDoc {
    #[serde(alias = "_id", alias = "docid", alias = "doc_id")]
    id: serde_json::Value,
    #[serde(default)]
    title: Option<String>,
    #[serde(alias = "contents", alias = "body")]
    text: Option<String>,
}

fn parse_jsonl(line: &str, at: Location) -> Result<Document, CorpusError> {
    let malformed = |message: String| CorpusError::Malformed { at: at.clone(), message };
    let doc: JsonDoc = serde_json::from_str(line).map_err(|e| malformed(format!("invalid JSON document: {e}")))?;
    let id = match doc.id {
        serde_json::Value::String(s) => s,
        serde_json::Value::Number(n) => n.to_string(),
        other => return Err(malformed(format!("\"id\" must be a string or a number, not {other}"))),
    };
    if id.trim().is_empty() {
        return Err(malformed("empty \"id\"".into()));
    }
    let text = doc.text.ok_or_else(|| malformed("no \"text\" (or \"contents\") field".into()))?;
    Ok(Document { id, title: doc.title.unwrap_or_default(), text, guessed_encoding: None })
}

fn parse_tsv(line: &str, at: Location) -> Result<Document, CorpusError> {
    let cols: Vec<&str> = line.split('\t').collect();
    let (id, title, text) = match cols.as_slice() {
        [id, text] => (*id, "", *text),
        [id, title, text] => (*id, *title, *text),
        [id, _url, title, body] => (*id, *title, *body),
        _ => {
            let message = format!("expected 2, 3 or 4 tab-separated columns, found {}", cols.len());
            return Err(CorpusError::Malformed { at, message });
        }
    };
    if id.trim().is_empty() {
        return Err(CorpusError::Malformed { at, message: "empty document id".into() });
    }
    Ok(Document {
        id: id.trim().to_string(),
        title: title.trim().to_string(),
        text: text.to_string(),
        guessed_encoding: None,
    })
}

/// The demo collection the quick start serves when no other collection is indexed: thirty short
/// multi-paragraph articles written for this project (JSONL).
pub const DEMO_JSONL: &str = include_str!("demo.jsonl");

#[cfg(test)]
mod tests {
    use super::*;

    fn loc() -> Location {
        Location { path: "f".into(), line: Some(3), offset: 10 }
    }

    #[test]
    fn jsonl_variants_and_errors() {
        let d = parse_jsonl(r#"{"id": "d1", "title": "T", "text": "body"}"#, loc()).unwrap();
        assert_eq!((d.id.as_str(), d.title.as_str(), d.text.as_str()), ("d1", "T", "body"));
        let d = parse_jsonl(r#"{"id": 7, "contents": "c"}"#, loc()).unwrap();
        assert_eq!((d.id.as_str(), d.text.as_str()), ("7", "c"));
        let err = parse_jsonl(r#"{"id": "x"}"#, loc()).unwrap_err().to_string();
        assert_eq!(err, "f:3 (byte 10): no \"text\" (or \"contents\") field");
        assert!(parse_jsonl("{oops", loc()).unwrap_err().to_string().starts_with("f:3 (byte 10): invalid JSON"));
    }

    #[test]
    fn tsv_column_layouts() {
        assert_eq!(parse_tsv("a\tbody", loc()).unwrap().text, "body");
        assert_eq!(parse_tsv("a\tT\tbody", loc()).unwrap().title, "T");
        let d = parse_tsv("D1\thttp://u\tTitle\tBody", loc()).unwrap();
        assert_eq!((d.title.as_str(), d.text.as_str()), ("Title", "Body"));
        assert!(parse_tsv("only-one-column", loc()).is_err());
    }

    #[test]
    fn format_detection() {
        assert_eq!(detect(b"\n {\"id\":1}"), Some(Format::Jsonl));
        assert_eq!(detect(b"<DOC>\n<DOCNO>x</DOCNO>\n<DOCHDR>"), Some(Format::Web));
        assert_eq!(detect(b"<DOC>\n<DOCNO>x</DOCNO>"), Some(Format::Trec));
        assert_eq!(detect(b"1\thello"), Some(Format::Tsv));
        assert_eq!(detect(b"just text"), None);
    }
}
