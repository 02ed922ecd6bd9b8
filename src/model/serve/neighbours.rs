//! An approximate nearest-neighbour index over a bi-encoder's stored segment vectors: an HNSW graph (the
//! `usearch` crate, chosen over hannoy and hnsw_rs in BENCHMARKS.md's comparison) over a `VectorFile`'s
//! records, keyed by record number, in `NAME.usearch` beside the vectors, with `NAME.usearch.json` naming the
//! model whose vectors it holds. The vector file only grows and its records never move, so the graph holds a
//! prefix of them: an update adds the records appended since, and a search covers the rest exactly
//! (`rank::dense`), so an index behind its vectors costs time, never results. Each checkpoint of an update is
//! written beside and renamed into place: a kill leaves the last one whole, and the next update resumes there.

use std::path::{Path, PathBuf};

use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};
use usearch::{Index, IndexOptions, MetricKind, ScalarKind};

use super::vectors::VectorFile;
use crate::model::{load_err, ModelError};

/// HNSW's graph degree and candidate lists while adding and searching (BENCHMARKS.md, "The dense first stage
/// at scale"): a construction list of 400 rather than 128 raised recall@100 of segments at 100k from 0.979 to
/// 0.994 at three times the build time; degree 32 gained as much at more memory and slower queries.
const CONNECTIVITY: usize = 16;
const EXPANSION_ADD: usize = 400;
const EXPANSION_SEARCH: usize = 256;

/// Records added before an update's first checkpoint; later ones come each time the graph has doubled, since
/// each rewrites the whole graph: a kill loses at most half the work, and writing costs twice the graph's size
/// rather than growing with its square.
const CHECKPOINT: u64 = 100_000;

/// Whose vectors an index holds (`NAME.usearch.json`).
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct IndexHeader {
    /// The served model that built it (its name then).
    pub model: String,
    /// The vector file's name: the model's outputs fingerprint and dtype (`rank::models`).
    pub vectors: String,
    pub dims: usize,
}

pub struct Neighbours {
    index: Index,
    /// Searches that may run at once, and a wait for one to end: usearch keeps a search context per thread it
    /// reserved (as many as the CPU has) and fails a search beyond them, where a server may have more.
    free: Mutex<usize>,
    freed: Condvar,
}

impl Neighbours {
    /// The index beside `file`, memory-mapped, if one was built; refused when it holds another model's vectors.
    pub fn open(file: &VectorFile, model: &str) -> Result<Option<Neighbours>, ModelError> {
        let (path, header) = paths(file);
        if !path.exists() {
            return Ok(None);
        }
        check(&header, file, model)?;
        let index = new_index(file.dims(), &path)?;
        index.view(text(&path)?).map_err(|e| load_err(&path, e))?;
        index.change_expansion_search(EXPANSION_SEARCH);
        let free = Mutex::new(std::thread::available_parallelism().map_or(1, |n| n.get()));
        Ok(Some(Neighbours { index, free, freed: Condvar::new() }))
    }

    /// The index file's length and modification time: a new checkpoint has another.
    pub fn stamp(file: &VectorFile) -> Option<(u64, std::time::SystemTime)> {
        let meta = std::fs::metadata(paths(file).0).ok()?;
        Some((meta.len(), meta.modified().ok()?))
    }

    /// The headers of the indexes in `dir` (a collection's `embeddings`), by vector file.
    pub fn indexed(dir: &Path) -> Result<Vec<IndexHeader>, ModelError> {
        let Ok(entries) = std::fs::read_dir(dir) else { return Ok(vec![]) };
        let mut indexed = vec![];
        for entry in entries.filter_map(|e| e.ok()) {
            let path = entry.path();
            if !path.to_string_lossy().ends_with(".usearch.json") {
                continue;
            }
            let bytes = std::fs::read(&path).map_err(|e| load_err(&path, e))?;
            indexed.push(serde_json::from_slice::<IndexHeader>(&bytes).map_err(|e| load_err(&path, e))?);
        }
        indexed.sort_by(|a, b| a.vectors.cmp(&b.vectors));
        Ok(indexed)
    }

    /// The index over the vector file `DIR/NAME` (`stem`) and its header: `DIR/NAME.usearch`, `….usearch.json`.
    pub fn files(stem: &Path) -> (PathBuf, PathBuf) {
        (stem.with_extension("usearch"), stem.with_extension("usearch.json"))
    }

    /// Records `0..covered()` are in the graph.
    pub fn covered(&self) -> u64 {
        self.index.size() as u64
    }

    /// Up to `count` records closest to `query` by cosine among those `keep` admits, closest first.
    pub fn search(&self, query: &[f32], count: usize, keep: impl Fn(u64) -> bool) -> Result<Vec<u64>, ModelError> {
        {
            let mut free = self.free.lock();
            while *free == 0 {
                self.freed.wait(&mut free);
            }
            *free -= 1;
        }
        let found = self.index.filtered_search(query, count, keep);
        *self.free.lock() += 1;
        self.freed.notify_one();
        Ok(found.map_err(|e| ModelError::Inference(format!("vector index: {e}")))?.keys)
    }

    /// Brings the index beside `file` (the vectors of the served model `model`) up to the file's records,
    /// adding those appended since, a checkpoint after `CHECKPOINT` records and each time the graph doubled; `done` is told the records covered
    /// after each. One thread adds them, in record order: the same vectors added by the same updates make the
    /// same graph, byte for byte, on any machine (usearch's concurrent insertions differ from run to run, and
    /// left some records unreachable in a small graph). Nothing is added while fewer than `least` records are
    /// missing (searches score those exactly, and each update rewrites the graph). Returns (records added,
    /// records covered).
    pub fn update(file: &VectorFile, model: &str, least: u64, done: &dyn Fn(u64)) -> Result<(u64, u64), ModelError> {
        let (path, header) = paths(file);
        if header.exists() {
            check(&header, file, model)?;
        } else {
            let written = IndexHeader { model: model.to_string(), vectors: name(file), dims: file.dims() };
            replace(&header, |partial| {
                std::fs::write(partial, serde_json::to_vec(&written).expect("a header serializes"))
                    .map_err(|e| load_err(partial, e))
            })?;
        }
        let index = new_index(file.dims(), &path)?;
        if path.exists() {
            // Mapped first, to count what it covers: a graph is loaded into memory (a gigabyte a million
            // segments) only when records are to be added.
            index.view(text(&path)?).map_err(|e| load_err(&path, e))?;
        }
        let (start, total) = (index.size() as u64, file.records()?);
        if total - start < least.max(1) {
            return Ok((0, start));
        }
        if path.exists() {
            index.load(text(&path)?).map_err(|e| load_err(&path, e))?;
        }
        let mut covered = start;
        while covered < total {
            let end = total.min(covered + CHECKPOINT.max(covered));
            let vectors = file.read(covered..end)?;
            index.reserve_capacity_and_threads(end as usize, 1).map_err(|e| load_err(&path, e))?;
            for (record, vector) in (covered..).zip(vectors.chunks_exact(file.dims())) {
                index.add(record, vector).map_err(|e| load_err(&path, e))?;
            }
            replace(&path, |partial| {
                index.save(text(partial)?).map_err(|e| load_err(partial, e))?;
                crate::hooks::point("neighbours.checkpoint");
                Ok(())
            })?;
            covered = end;
            done(covered);
        }
        Ok((covered - start, covered))
    }
}

fn new_index(dims: usize, path: &Path) -> Result<Index, ModelError> {
    let options = IndexOptions {
        dimensions: dims,
        metric: MetricKind::Cos,
        // Half precision: half the memory and disk of f32 at the same recall (BENCHMARKS.md); scores are
        // computed from the f32 vectors, never from the graph's.
        quantization: ScalarKind::F16,
        connectivity: CONNECTIVITY,
        expansion_add: EXPANSION_ADD,
        expansion_search: EXPANSION_SEARCH,
        multi: false,
    };
    Index::new(&options).map_err(|e| load_err(path, e))
}

/// Writes `path` through `write` on a partial file beside it, then renames that into place.
fn replace(path: &Path, write: impl FnOnce(&Path) -> Result<(), ModelError>) -> Result<(), ModelError> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    write(&partial)?;
    std::fs::rename(&partial, path).map_err(|e| load_err(path, e))
}

/// `DIR/NAME.usearch` and `DIR/NAME.usearch.json`.
fn paths(file: &VectorFile) -> (PathBuf, PathBuf) {
    Neighbours::files(file.path())
}

fn name(file: &VectorFile) -> String {
    file.path().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

fn text(path: &Path) -> Result<&str, ModelError> {
    path.to_str().ok_or_else(|| load_err(path, "not a UTF-8 path"))
}

/// Refuses an index that holds other vectors than `file`'s (copied in from another model's files).
fn check(header: &Path, file: &VectorFile, model: &str) -> Result<(), ModelError> {
    let bytes = std::fs::read(header).map_err(|e| load_err(header, e))?;
    let found: IndexHeader = serde_json::from_slice(&bytes).map_err(|e| load_err(header, e))?;
    if found.vectors != name(file) || found.dims != file.dims() {
        return Err(ModelError::OtherModelsIndex(format!(
            "{}: a vector index of model {}'s embeddings ({}, {} dimensions), not of model {model}'s: remove it \
             and run `longrank embed` with model {model}",
            header.display(),
            found.model,
            found.vectors,
            found.dims
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seeded(records: u64, dims: usize) -> Vec<Vec<f32>> {
        let mut rng = crate::rng::Rng::new(7);
        (0..records).map(|_| (0..dims).map(|_| rng.uniform() as f32 - 0.5).collect()).collect()
    }

    #[test]
    fn an_update_adds_what_was_appended_since_and_search_finds_each_record_first() {
        let dir = tempfile::tempdir().unwrap();
        // 32 dimensions: no two of 250 seeded vectors so alike that the graph's half precision swaps them; fewer
        // than the search list, so that a search visits them all.
        let file = VectorFile::open(dir.path(), "m-f32", 32).unwrap();
        let vectors = seeded(250, 32);
        for (i, v) in vectors[..200].iter().enumerate() {
            file.append(i as u64 + 1000, v).unwrap();
        }
        assert!(Neighbours::open(&file, "m").unwrap().is_none());
        assert_eq!(Neighbours::update(&file, "m", 0, &|_| {}).unwrap(), (200, 200));
        for (i, v) in vectors[200..].iter().enumerate() {
            file.append(i as u64 + 2000, v).unwrap();
        }
        assert_eq!(Neighbours::open(&file, "m").unwrap().unwrap().covered(), 200);
        assert_eq!(Neighbours::update(&file, "m", 51, &|_| {}).unwrap(), (0, 200), "fewer missing than asked");
        assert_eq!(Neighbours::update(&file, "m", 50, &|_| {}).unwrap(), (50, 250));
        let header = IndexHeader { model: "m".into(), vectors: "m-f32".into(), dims: 32 };
        assert_eq!(Neighbours::indexed(dir.path()).unwrap(), [header]);
        let index = Neighbours::open(&file, "m").unwrap().unwrap();
        for (record, v) in vectors.iter().enumerate() {
            assert_eq!(index.search(v, 1, |_| true).unwrap(), [record as u64]);
        }
        // The filter holds: odd records only.
        let odd = index.search(&vectors[4], 10, |r| r % 2 == 1).unwrap();
        assert!(odd.len() == 10 && odd.iter().all(|r| r % 2 == 1));
        assert_eq!(Neighbours::update(&file, "m", 0, &|_| {}).unwrap(), (0, 250));
        // The same vectors added in the same updates make the same graph, byte for byte.
        let again = tempfile::tempdir().unwrap();
        let copy = VectorFile::open(again.path(), "m-f32", 32).unwrap();
        for (i, v) in vectors.iter().enumerate() {
            copy.append(i as u64, v).unwrap();
            if i == 199 || i == 249 {
                Neighbours::update(&copy, "m", 0, &|_| {}).unwrap();
            }
        }
        let bytes = |dir: &Path| std::fs::read(dir.join("m-f32.usearch")).unwrap();
        assert!(bytes(dir.path()) == bytes(again.path()), "two builds of one index differ");
    }

    /// A graph of many more records than a search visits: its answers are the exact nearest ones for nearly
    /// every query (HNSW's recall, which an index smaller than the search list cannot show).
    #[test]
    fn a_large_graph_finds_the_nearest_records() {
        let (dims, records) = (24, 20_000u64);
        let dir = tempfile::tempdir().unwrap();
        let file = VectorFile::open(dir.path(), "m-f32", dims).unwrap();
        let vectors = seeded(records, dims);
        for (i, v) in vectors.iter().enumerate() {
            file.append(i as u64, v).unwrap();
        }
        Neighbours::update(&file, "m", 0, &|_| {}).unwrap();
        let index = Neighbours::open(&file, "m").unwrap().unwrap();
        let cosine = |a: &[f32], b: &[f32]| crate::model::dot(a, b) / (crate::model::norm(a) * crate::model::norm(b));
        let (mut found, queries, k) = (0, 50, 10);
        for query in seeded(records + queries, dims).into_iter().skip(records as usize) {
            let mut exact: Vec<(f32, u64)> = vectors.iter().zip(0..).map(|(v, r)| (-cosine(&query, v), r)).collect();
            exact.sort_by(|a, b| a.partial_cmp(b).unwrap());
            let want: Vec<u64> = exact[..k].iter().map(|e| e.1).collect();
            found += index.search(&query, k, |_| true).unwrap().iter().filter(|r| want.contains(r)).count();
        }
        let recall = found as f64 / (queries as usize * k) as f64;
        assert!(recall >= 0.95, "recall@{k} {recall}");
    }

    /// More searches at once than the CPU has threads (a server's blocking pool): each waits its turn.
    #[test]
    fn searches_beyond_the_cpus_threads_wait_rather_than_fail() {
        let dir = tempfile::tempdir().unwrap();
        let file = VectorFile::open(dir.path(), "m-f32", 8).unwrap();
        let vectors = seeded(100, 8);
        for (i, v) in vectors.iter().enumerate() {
            file.append(i as u64, v).unwrap();
        }
        Neighbours::update(&file, "m", 0, &|_| {}).unwrap();
        let index = Neighbours::open(&file, "m").unwrap().unwrap();
        std::thread::scope(|s| {
            for t in 0..16 {
                let (index, vectors) = (&index, &vectors);
                s.spawn(move || {
                    for r in (t..100).step_by(16) {
                        assert_eq!(index.search(&vectors[r], 1, |_| true).unwrap(), [r as u64]);
                    }
                });
            }
        });
    }

    #[test]
    fn another_models_index_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) =
            (VectorFile::open(dir.path(), "a-f32", 4).unwrap(), VectorFile::open(dir.path(), "b-f32", 4).unwrap());
        a.append(1, &[1.0, 0.0, 0.0, 0.0]).unwrap();
        Neighbours::update(&a, "minilm", 0, &|_| {}).unwrap();
        for ext in ["usearch", "usearch.json"] {
            std::fs::copy(dir.path().join(format!("a-f32.{ext}")), dir.path().join(format!("b-f32.{ext}"))).unwrap();
        }
        let refused = Neighbours::open(&b, "e5").err().unwrap().to_string();
        assert!(refused.contains("of model minilm's embeddings (a-f32, 4 dimensions), not of model e5's"), "{refused}");
        assert!(Neighbours::update(&b, "e5", 0, &|_| {}).is_err());
    }
}
