//! The dense first stage: every segment of a collection as a bi-encoder embedded it (the embeddings
//! `longrank embed` stored), a document scored by its best segment's cosine with the query (MaxP retrieval),
//! so a document's dense score is the score the bi-encoder's `maxp` gives it. Below `approximate_from`
//! segments, or without a vector index, every segment is compared with the query (its vectors read into
//! memory once per commit); above, the index (`model::Neighbours`) proposes the segments nearest the query,
//! and each document they belong to, with every document whose segments the index does not hold yet, is
//! scored over all its segments exactly as above: an index can miss a document, never misscore one.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use tantivy::DocAddress;

use super::first_stage::{self, best_first};
use super::rerank::SegmentCache;
use super::{LoadedModel, RankError};
use crate::index::{Hit, SegmentId, Snapshot};
use crate::model::{dot, norm, MappedVectors, Neighbours, VectorFile};
use crate::segment::SegmentOptions;

/// A collection's segment vectors under one bi-encoder, documents' segments contiguous.
pub struct SegmentVectors {
    dims: usize,
    /// Each segment's record in the vector file.
    records: Vec<u64>,
    /// Document d's segments are `starts[d]..starts[d + 1]`.
    starts: Vec<usize>,
    docs: Vec<(DocAddress, String)>,
    search: Search,
}

enum Search {
    /// Every segment's vector and length, in memory.
    Exact { vectors: Vec<f32>, norms: Vec<f32> },
    /// Candidates from the index; their vectors read in place from the file when scored. `owners` maps records
    /// to documents; `live` holds a bit per record that a live document's segment has (the graph keeps deleted
    /// documents' and other commits' records, and a search asks for each node it visits).
    Approximate { neighbours: Neighbours, vectors: MappedVectors, owners: Owners, live: Vec<u64> },
}

/// Each live document of one index segment, by its number there: its docid and its segments' records.
type Cut = HashMap<u32, (String, Vec<u64>)>;

/// What the documents of a commit's index segments were cut into, by segment: held from one commit to the next
/// (for one collection, model and vector file), so that a commit reads and cuts only its new documents.
pub type Cuts = HashMap<SegmentId, Arc<Cut>>;

/// Segments the index proposes per document asked for, at first: documents have several segments each, and
/// a document's best can sit below another's second (asked again with twice as many while they hold fewer
/// documents than asked for). Measured (BENCHMARKS.md, `longrank bench dense`, four segments a document): 2
/// against 4 kept recall@100 of documents at 0.996 / 0.984 / 0.987 at 10k / 100k / 1M segments (4: 0.999 /
/// 0.993 / 0.990) and took 3.9 ms at 1M rather than 5.7, most of it the graph's search.
const SEGMENTS_PER_DOCUMENT: usize = 2;

impl SegmentVectors {
    /// Reads the stored vector (or, with an index over `approximate_from` segments, the record) of every
    /// segment of every live document of `snapshot`, cut as `longrank embed` cuts them; refused (naming what
    /// to run) when any is missing. Documents of the index segments in `known` (an earlier commit's `Cuts`
    /// over the same vector file) are not read or cut again. Returns the cuts of this commit too.
    pub fn read(
        snapshot: &Snapshot,
        model: &LoadedModel,
        file: &Arc<VectorFile>,
        segments: &SegmentCache,
        options: &SegmentOptions,
        approximate_from: usize,
        known: &Cuts,
    ) -> Result<(SegmentVectors, Cuts), RankError> {
        let (mut records, mut starts, mut docs) = (vec![], vec![0], vec![]);
        let (mut missing, mut total) = (0usize, 0usize);
        let mut cuts: Cuts = HashMap::new();
        let mut fresh: HashMap<SegmentId, Cut> = HashMap::new();
        snapshot.for_each_address(|segment, address| {
            let (docid, cut) = match known.get(&segment).and_then(|c| Some((c, c.get(&address.doc_id)?))) {
                Some((held, (docid, cut))) => {
                    cuts.entry(segment).or_insert_with(|| held.clone());
                    total += cut.len();
                    (docid.clone(), cut.clone())
                }
                None => {
                    let doc = snapshot.document(address)?;
                    let mut cut = vec![];
                    for (_, text) in segments.inputs(&model.served, options, &doc, usize::MAX) {
                        total += 1;
                        match model.served.stored_record(&text, file) {
                            Some(record) => cut.push(record),
                            None => missing += 1,
                        }
                    }
                    fresh.entry(segment).or_default().insert(address.doc_id, (doc.docid.clone(), cut.clone()));
                    (doc.docid, cut)
                }
            };
            records.extend(cut);
            starts.push(records.len());
            docs.push((address, docid));
            Ok::<(), RankError>(())
        })?;
        if missing > 0 {
            let collection = snapshot.collection().name().to_string();
            return Err(RankError::NoVectors { collection, model: model.name.clone(), missing, segments: total });
        }
        for (segment, cut) in fresh {
            let merged = match cuts.remove(&segment) {
                Some(held) => held.iter().map(|(d, c)| (*d, c.clone())).chain(cut).collect(),
                None => cut,
            };
            cuts.insert(segment, Arc::new(merged));
        }
        let read = SegmentVectors::new(file, &model.name, records, starts, docs, approximate_from)?;
        Ok((read, cuts))
    }

    /// Documents' segments as records of `file` (document d's are `records[starts[d]..starts[d + 1]]`),
    /// searched through the index beside `file` (holding `model`'s vectors) from `approximate_from` segments
    /// where there is one, else exactly.
    pub fn new(
        file: &Arc<VectorFile>,
        model: &str,
        records: Vec<u64>,
        starts: Vec<usize>,
        docs: Vec<(DocAddress, String)>,
        approximate_from: usize,
    ) -> Result<SegmentVectors, RankError> {
        let neighbours = match records.len() >= approximate_from {
            true => Neighbours::open(file, model).map_err(RankError::Model)?,
            false => None,
        };
        let mapped = file.mapped(records.iter().max().map_or(0, |r| r + 1)).map_err(RankError::Model)?;
        let search = match (neighbours, mapped) {
            (Some(neighbours), Some(vectors)) => Search::Approximate {
                neighbours,
                vectors,
                owners: Owners::new(&records, &starts),
                live: live(&records),
            },
            (_, mapped) => {
                // Copied out of the mapping: a commit's segments in order, for one pass over them per query.
                let read = |m: &MappedVectors| records.iter().flat_map(|&r| m.record(r).iter().copied()).collect();
                let vectors: Vec<f32> = mapped.as_ref().map(read).unwrap_or_default();
                let norms = vectors.chunks_exact(file.dims()).map(norm).collect();
                Search::Exact { vectors, norms }
            }
        };
        Ok(SegmentVectors { dims: file.dims(), records, starts, docs, search })
    }

    /// The `n` documents whose best segment is closest to `query` by cosine, best first (ties to the smaller
    /// docid); each scored as `model::cosine` scores the pair.
    pub fn search(&self, query: &[f32], n: usize) -> Result<Vec<Hit>, RankError> {
        let query_norm = norm(query);
        let cosine = |vector: &[f32], norm: f32| dot(query, vector) / (query_norm * norm).max(1e-12);
        let mut hits = match &self.search {
            Search::Exact { vectors, norms } => (0..self.docs.len())
                .filter_map(|d| {
                    let best = (self.starts[d]..self.starts[d + 1])
                        .map(|s| cosine(&vectors[s * self.dims..(s + 1) * self.dims], norms[s]))
                        .reduce(f32::max)?;
                    Some(self.hit(d, best))
                })
                .collect(),
            Search::Approximate { neighbours, vectors, owners, live } => {
                let mut hits = vec![];
                for d in self.candidates(neighbours, owners, live, query, n)? {
                    let segments = self.records[self.starts[d]..self.starts[d + 1]].iter().map(|&r| vectors.record(r));
                    let best = segments.map(|v| cosine(v, norm(v))).fold(f32::NEG_INFINITY, f32::max);
                    hits.push(self.hit(d, best));
                }
                hits
            }
        };
        if hits.len() > n {
            // Only the top n need sorting.
            hits.select_nth_unstable_by(n, best_first);
            hits.truncate(n);
        }
        first_stage::sort(&mut hits);
        Ok(hits)
    }

    fn hit(&self, d: usize, score: f32) -> Hit {
        let (address, docid) = &self.docs[d];
        Hit { address: *address, docid: docid.clone(), score }
    }

    /// The documents to score for the top `n`: those owning the segments nearest the query among the
    /// index's (at least `n` of them where there are), and all those owning a segment the index lacks.
    fn candidates(
        &self,
        neighbours: &Neighbours,
        owners: &Owners,
        live: &[u64],
        query: &[f32],
        n: usize,
    ) -> Result<BTreeSet<usize>, RankError> {
        let owned = |record: u64| live.get((record / 64) as usize).is_some_and(|bits| bits >> (record % 64) & 1 == 1);
        let mut count = n * SEGMENTS_PER_DOCUMENT;
        let found = loop {
            let found = neighbours.search(query, count, owned).map_err(RankError::Model)?;
            let mut docs = BTreeSet::new();
            for &record in &found {
                docs.extend(owners.of(record..record + 1).iter().map(|&d| d as usize));
            }
            if docs.len() >= n || found.len() < count {
                break docs;
            }
            count *= 2;
        };
        let unindexed = owners.of(neighbours.covered()..u64::MAX);
        Ok(found.into_iter().chain(unindexed.iter().map(|&d| d as usize)).collect())
    }
}

/// The documents each record belongs to (a text in two documents is one record), found in one step rather than
/// by a search through a million: record r's are `docs[first[r]..first[r + 1]]`.
struct Owners {
    first: Vec<usize>,
    docs: Vec<u32>,
}

impl Owners {
    /// Document d's segments are the records `records[starts[d]..starts[d + 1]]`.
    fn new(records: &[u64], starts: &[usize]) -> Owners {
        let mut first = vec![0; records.iter().max().map_or(0, |&r| r as usize + 1) + 1];
        for &r in records {
            first[r as usize + 1] += 1;
        }
        for r in 1..first.len() {
            first[r] += first[r - 1];
        }
        let (mut next, mut docs) = (first.clone(), vec![0; records.len()]);
        for (d, window) in starts.windows(2).enumerate() {
            for &r in &records[window[0]..window[1]] {
                docs[next[r as usize]] = d as u32;
                next[r as usize] += 1;
            }
        }
        Owners { first, docs }
    }

    /// The documents owning the records in `range`, by record.
    fn of(&self, range: std::ops::Range<u64>) -> &[u32] {
        let at = |r: u64| self.first[(r as usize).min(self.first.len() - 1)];
        &self.docs[at(range.start)..at(range.end)]
    }
}

/// A bit per record, set for `records`.
fn live(records: &[u64]) -> Vec<u64> {
    let mut bits = vec![0u64; records.iter().max().map_or(0, |&r| r as usize / 64 + 1)];
    for &r in records {
        bits[r as usize / 64] |= 1 << (r % 64);
    }
    bits
}

/// The segment vectors read, per collection opening, commit and model; the last few kept.
#[derive(Default)]
pub struct VectorsCache {
    kept: Mutex<Vec<(VectorsKey, Slot)>>,
    /// The last commit's cuts, by collection, model and vector file (`VectorFile::identity`).
    cuts: Mutex<HashMap<CutsKey, Cuts>>,
}

/// One key's vectors once read (`None` before, or after a failed read), behind the key's own lock.
type Slot = Arc<Mutex<Option<Arc<SegmentVectors>>>>;

/// A collection's opening, its commit (`Snapshot::generation`), the model's name and its vector index's
/// stamp (`Neighbours::stamp`: a `longrank embed` that updated the index is read at the next query).
type VectorsKey = (u64, u64, String, Option<(u64, std::time::SystemTime)>);

type CutsKey = (String, String, (u64, u64));

/// Commits (of any collections and models) whose vectors stay in memory.
const KEPT: usize = 4;

impl VectorsCache {
    pub fn get(
        &self,
        snapshot: &Snapshot,
        model: &LoadedModel,
        store: &Arc<VectorFile>,
        segments: &SegmentCache,
        options: &SegmentOptions,
        approximate_from: usize,
    ) -> Result<Arc<SegmentVectors>, RankError> {
        let stamp = Neighbours::stamp(store);
        let key = (snapshot.collection().opening(), snapshot.generation(), model.name.clone(), stamp);
        let cuts = (snapshot.collection().name().to_string(), model.name.clone(), store.identity());
        self.get_or_read(key, || {
            let known = self.cuts.lock().get(&cuts).cloned().unwrap_or_default();
            let (read, now) =
                SegmentVectors::read(snapshot, model, store, segments, options, approximate_from, &known)?;
            self.cuts.lock().insert(cuts, now);
            Ok(read)
        })
    }

    /// The vectors kept under `key`, or `read`'s, kept. Each key has a lock of its own: the requests that
    /// arrive while a commit's vectors are being read wait for that read rather than each reading the whole
    /// collection again, and other keys' requests go on meanwhile. A failed read keeps nothing.
    fn get_or_read(
        &self,
        key: VectorsKey,
        read: impl FnOnce() -> Result<SegmentVectors, RankError>,
    ) -> Result<Arc<SegmentVectors>, RankError> {
        let slot = {
            let mut kept = self.kept.lock();
            match kept.iter().find(|(k, _)| *k == key) {
                Some((_, slot)) => slot.clone(),
                None => {
                    if kept.len() >= KEPT {
                        kept.remove(0);
                    }
                    let slot = Arc::default();
                    kept.push((key, Arc::clone(&slot)));
                    slot
                }
            }
        };
        let mut slot = slot.lock();
        if let Some(read) = &*slot {
            return Ok(read.clone());
        }
        let read = Arc::new(read()?);
        *slot = Some(read.clone());
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn documents(count: usize) -> Vec<(DocAddress, String)> {
        (0..count).map(|i| (DocAddress::new(0, i as u32), format!("d{i:03}"))).collect()
    }

    fn exact(dims: usize, vectors: Vec<f32>, starts: Vec<usize>) -> SegmentVectors {
        let norms = vectors.chunks_exact(dims).map(norm).collect();
        let records = (0..starts[starts.len() - 1] as u64).collect();
        let docs = documents(starts.len() - 1);
        SegmentVectors { dims, records, starts, docs, search: Search::Exact { vectors, norms } }
    }

    fn two_documents() -> SegmentVectors {
        exact(1, vec![1.0, 2.0], vec![0, 1, 2])
    }

    #[test]
    fn each_record_names_the_documents_it_belongs_to() {
        // Three documents over records 0, 2, 3 and 5; record 3 in two of them, 1 and 4 in none (deleted).
        let owners = Owners::new(&[2, 0, 3, 3, 5], &[0, 2, 3, 5]);
        let of = |r: u64| owners.of(r..r + 1).to_vec();
        assert_eq!((of(0), of(1), of(2), of(3), of(4), of(5)), (vec![0], vec![], vec![0], vec![1, 2], vec![], vec![2]));
        assert_eq!(of(6), Vec::<u32>::new(), "past the records held");
        assert_eq!(owners.of(3..u64::MAX), [1, 2, 2], "from a record on");
        assert!(Owners::new(&[], &[0]).of(0..u64::MAX).is_empty());
    }
    #[test]
    fn a_commits_vectors_are_read_once_however_many_ask_at_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let cache = VectorsCache::default();
        let reads = AtomicUsize::new(0);
        let read = || {
            reads.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(200));
            Ok(two_documents())
        };
        let key = || (1, 7, "minilm".to_string(), None);
        std::thread::scope(|s| {
            let asked: Vec<_> = (0..4).map(|_| s.spawn(|| cache.get_or_read(key(), read))).collect();
            let got: Vec<_> = asked.into_iter().map(|t| t.join().unwrap().ok().unwrap()).collect();
            assert!(got.windows(2).all(|w| Arc::ptr_eq(&w[0], &w[1])));
        });
        assert_eq!(reads.load(Ordering::SeqCst), 1);
        // A failed read keeps nothing: the next request reads again.
        let failed = cache.get_or_read((1, 8, "minilm".into(), None), || {
            Err(RankError::NoVectors { collection: "c".into(), model: "minilm".into(), missing: 1, segments: 2 })
        });
        assert!(failed.is_err());
        assert!(cache.get_or_read((1, 8, "minilm".into(), None), || Ok(two_documents())).is_ok());
        // Another commit is another key.
        cache.get_or_read((1, 9, "minilm".into(), None), read).ok().unwrap();
        assert_eq!(reads.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_document_scores_its_best_segment_and_the_top_n_come_best_first() {
        // Document d000: two segments; d001: one; d002: none (an empty document).
        let vectors = exact(2, vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0], vec![0, 2, 3, 3]);
        let scored = |hits: Vec<Hit>| hits.into_iter().map(|h| (h.docid, h.score)).collect::<Vec<_>>();
        assert_eq!(
            scored(vectors.search(&[0.0, 2.0], 5).unwrap()),
            [("d000".into(), 1.0), ("d001".into(), 2.0 / (2.0 * 2f32.sqrt()))]
        );
        let best = 2.0 / (2f32.sqrt() * 2f32.sqrt());
        assert_eq!(scored(vectors.search(&[1.0, 1.0], 1).unwrap()), [("d001".into(), best)]);
        // Equal scores: the smaller docid first.
        assert_eq!(scored(vectors.search(&[1.0, -1.0], 2).unwrap())[0].0, "d000");
    }

    /// 100 documents of two segments, the index built over the first 150 of their 200: the index's answers are
    /// exact search's, scores bit for bit, documents the index lacks included (fewer segments than the search
    /// list: the graph search visits them all).
    #[test]
    fn the_index_proposes_documents_and_exact_scores_rank_them() {
        let (dims, dir) = (16, tempfile::tempdir().unwrap());
        let mut rng = crate::rng::Rng::new(11);
        let starts: Vec<usize> = (0..=100).map(|d| 2 * d).collect();
        let vectors: Vec<f32> = (0..200 * dims).map(|_| rng.uniform() as f32 - 0.5).collect();
        let file = Arc::new(VectorFile::open(dir.path(), "m-f32", dims).unwrap());
        for (record, v) in vectors.chunks_exact(dims).enumerate() {
            file.append(record as u64 + 100, v).unwrap();
            if record == 149 {
                Neighbours::update(&file, "m", 0, &|_| {}).unwrap();
            }
        }
        let records: Vec<u64> = (0..200).collect();
        let whole = SegmentVectors::new(&file, "m", records.clone(), starts.clone(), documents(100), usize::MAX);
        let approximate = SegmentVectors::new(&file, "m", records, starts, documents(100), 0).unwrap();
        let (whole, Search::Approximate { neighbours, .. }) = (whole.unwrap(), &approximate.search) else {
            panic!("the index searches from 0 segments")
        };
        assert_eq!(neighbours.covered(), 150);
        let pairs = |hits: &[Hit]| hits.iter().map(|h| (h.docid.clone(), h.score.to_bits())).collect::<Vec<_>>();
        for query in vectors.chunks_exact(dims).step_by(7) {
            let (want, got) = (whole.search(query, 10).unwrap(), approximate.search(query, 10).unwrap());
            assert_eq!(pairs(&got), pairs(&want));
        }
        // Half the documents deleted: the graph still holds their records, and the search passes over them.
        let kept: Vec<(DocAddress, String)> = documents(100).into_iter().step_by(2).collect();
        let records: Vec<u64> = (0..200).filter(|r| r / 2 % 2 == 0).collect();
        let starts: Vec<usize> = (0..=50).map(|d| 2 * d).collect();
        let whole = SegmentVectors::new(&file, "m", records.clone(), starts.clone(), kept.clone(), usize::MAX).unwrap();
        let approximate = SegmentVectors::new(&file, "m", records, starts, kept, 0).unwrap();
        for query in vectors.chunks_exact(dims).step_by(5) {
            let (want, got) = (whole.search(query, 10).unwrap(), approximate.search(query, 10).unwrap());
            assert_eq!(pairs(&got), pairs(&want));
            assert!(got.iter().all(|h| h.docid[1..].parse::<usize>().unwrap() % 2 == 0));
        }
    }
}
