//! One entry per parser of user files: the cargo-fuzz targets (`fuzz_targets/`) and the corpus replay test
//! (`tests/it/fuzz.rs`, which includes this file) call the same functions. Each takes any bytes and must
//! return, never panic; text formats get the bytes as the readers do (UTF-8, invalid sequences replaced).

use std::borrow::Cow;
use std::io::Cursor;
use std::path::Path;

use longrank::config::Config;
use longrank::corpus::{self, Format};
use longrank::eval::formats::parse_topics;
use longrank::eval::passages::parse_passages;
use longrank::eval::{Measure, Qrels, Run};

/// A parser's entry: any bytes in, nothing out.
pub type Entry = fn(&[u8]);

/// Every target, by its name under `fuzz_targets/` and `corpus/`.
pub const TARGETS: [(&str, Entry); 7] = [
    ("documents", documents),
    ("topics", topics),
    ("qrels", qrels),
    ("run", run),
    ("passages", passages),
    ("config", config),
    ("measures", measures),
];

fn path() -> &'static Path {
    Path::new("fuzz-input")
}

fn text(data: &[u8]) -> Cow<'_, str> {
    String::from_utf8_lossy(data)
}

/// A collection file: the first byte picks the format (detection from the content included), the rest is
/// the file; every document is read.
pub fn documents(data: &[u8]) {
    let Some((&pick, content)) = data.split_first() else { return };
    let formats = [Format::Auto, Format::Trec, Format::Web, Format::Jsonl, Format::Tsv];
    let format = formats[usize::from(pick) % formats.len()];
    if let Ok(docs) = corpus::read(Box::new(Cursor::new(content.to_vec())), path(), format) {
        docs.for_each(drop);
    }
}

/// A topic file in any of its formats (TREC SGML, XML, TSV), detected from the content.
pub fn topics(data: &[u8]) {
    let _ = parse_topics(&text(data), path());
}

pub fn qrels(data: &[u8]) {
    let _ = Qrels::parse(&text(data), path());
}

/// A run file, whole and as a job's partial run being resumed.
pub fn run(data: &[u8]) {
    let text = text(data);
    let _ = Run::parse(&text, path());
    let _ = Run::resume(&text, path(), "fuzz");
}

pub fn passages(data: &[u8]) {
    let _ = parse_passages(&text(data), path());
}

pub fn config(data: &[u8]) {
    let _ = Config::parse(&text(data), path());
}

/// trec_eval `-m` arguments, one per line.
pub fn measures(data: &[u8]) {
    let specs: Vec<String> = text(data).lines().map(String::from).collect();
    let _ = Measure::parse_all(&specs);
}
