//! The dense first stage, by exact search: every segment of a collection as a bi-encoder embedded it (the
//! embeddings `longrank embed` stored), a document scored by its best segment's cosine with the query (MaxP
//! retrieval), so a document's dense score is the score the bi-encoder's `maxp` gives it. The vectors of one
//! commit of a collection are read into memory once and kept for the queries that follow.

use std::sync::Arc;

use parking_lot::Mutex;
use tantivy::DocAddress;

use super::first_stage::{self, best_first};
use super::rerank::SegmentCache;
use super::{LoadedModel, RankError};
use crate::index::{Hit, Snapshot};
use crate::model::{dot, norm, VectorFile};
use crate::segment::SegmentOptions;

/// A collection's segment vectors under one bi-encoder, documents' segments contiguous.
pub struct SegmentVectors {
    dims: usize,
    vectors: Vec<f32>,
    norms: Vec<f32>,
    /// Document d's segments are `starts[d]..starts[d + 1]`.
    starts: Vec<usize>,
    docs: Vec<(DocAddress, String)>,
}

impl SegmentVectors {
    /// Reads the stored vector of every segment of every live document of `snapshot`, cut as `longrank embed`
    /// cuts them; refused (naming what to run) when any is missing.
    pub fn read(
        snapshot: &Snapshot,
        model: &LoadedModel,
        store: &VectorFile,
        segments: &SegmentCache,
        options: &SegmentOptions,
    ) -> Result<SegmentVectors, RankError> {
        let mut read = SegmentVectors { dims: 0, vectors: vec![], norms: vec![], starts: vec![0], docs: vec![] };
        let (mut missing, mut total) = (0usize, 0usize);
        snapshot.for_each_document(|address, doc| {
            for (_, text) in segments.inputs(&model.served, options, &doc, usize::MAX) {
                total += 1;
                match model.served.stored_embedding(&text, store) {
                    Some(vector) => {
                        read.dims = vector.len();
                        read.norms.push(norm(&vector));
                        read.vectors.extend_from_slice(&vector);
                    }
                    None => missing += 1,
                }
            }
            read.starts.push(read.norms.len());
            read.docs.push((address, doc.docid));
            Ok::<(), RankError>(())
        })?;
        if missing > 0 {
            let collection = snapshot.collection().name().to_string();
            return Err(RankError::NoVectors { collection, model: model.name.clone(), missing, segments: total });
        }
        Ok(read)
    }

    /// The `n` documents whose best segment is closest to `query` by cosine, best first (ties to the smaller
    /// docid); each scored as `model::cosine` scores the pair.
    pub fn search(&self, query: &[f32], n: usize) -> Vec<Hit> {
        let query_norm = norm(query);
        let mut hits: Vec<Hit> = self
            .docs
            .iter()
            .enumerate()
            .filter(|(d, _)| self.starts[d + 1] > self.starts[*d])
            .map(|(d, (address, docid))| {
                let score = (self.starts[d]..self.starts[d + 1])
                    .map(|s| {
                        let vector = &self.vectors[s * self.dims..(s + 1) * self.dims];
                        dot(query, vector) / (query_norm * self.norms[s]).max(1e-12)
                    })
                    .fold(f32::NEG_INFINITY, f32::max);
                Hit { address: *address, docid: docid.clone(), score }
            })
            .collect();
        if hits.len() > n {
            // Only the top n need sorting.
            hits.select_nth_unstable_by(n, best_first);
            hits.truncate(n);
        }
        first_stage::sort(&mut hits);
        hits
    }
}

/// The segment vectors read, per collection opening, commit and model; the last few kept.
#[derive(Default)]
pub struct VectorsCache {
    kept: Mutex<Vec<(VectorsKey, Slot)>>,
}

/// One key's vectors once read (`None` before, or after a failed read), behind the key's own lock.
type Slot = Arc<Mutex<Option<Arc<SegmentVectors>>>>;

/// A collection's opening, its commit (`Snapshot::generation`) and the model's name.
type VectorsKey = (u64, u64, String);

/// Commits (of any collections and models) whose vectors stay in memory.
const KEPT: usize = 4;

impl VectorsCache {
    pub fn get(
        &self,
        snapshot: &Snapshot,
        model: &LoadedModel,
        store: &VectorFile,
        segments: &SegmentCache,
        options: &SegmentOptions,
    ) -> Result<Arc<SegmentVectors>, RankError> {
        let key = (snapshot.collection().opening(), snapshot.generation(), model.name.clone());
        self.get_or_read(key, || SegmentVectors::read(snapshot, model, store, segments, options))
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

    fn two_documents() -> SegmentVectors {
        SegmentVectors {
            dims: 1,
            vectors: vec![1.0, 2.0],
            norms: vec![1.0, 2.0],
            starts: vec![0, 1, 2],
            docs: vec![(DocAddress::new(0, 0), "a".into()), (DocAddress::new(0, 1), "b".into())],
        }
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
        let key = || (1, 7, "minilm".to_string());
        std::thread::scope(|s| {
            let asked: Vec<_> = (0..4).map(|_| s.spawn(|| cache.get_or_read(key(), read))).collect();
            let got: Vec<_> = asked.into_iter().map(|t| t.join().unwrap().ok().unwrap()).collect();
            assert!(got.windows(2).all(|w| Arc::ptr_eq(&w[0], &w[1])));
        });
        assert_eq!(reads.load(Ordering::SeqCst), 1);
        // A failed read keeps nothing: the next request reads again.
        let failed = cache.get_or_read((1, 8, "minilm".into()), || {
            Err(RankError::NoVectors { collection: "c".into(), model: "minilm".into(), missing: 1, segments: 2 })
        });
        assert!(failed.is_err());
        assert!(cache.get_or_read((1, 8, "minilm".into()), || Ok(two_documents())).is_ok());
        // Another commit is another key.
        cache.get_or_read((1, 9, "minilm".into()), read).ok().unwrap();
        assert_eq!(reads.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_document_scores_its_best_segment_and_the_top_n_come_best_first() {
        let vectors = SegmentVectors {
            dims: 2,
            // Document a: two segments; b: one; c: none (an empty document).
            vectors: vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0],
            norms: vec![1.0, 1.0, 2f32.sqrt()],
            starts: vec![0, 2, 3, 3],
            docs: ["a", "b", "c"]
                .iter()
                .enumerate()
                .map(|(i, d)| (DocAddress::new(0, i as u32), d.to_string()))
                .collect(),
        };
        let scored = |hits: Vec<Hit>| hits.into_iter().map(|h| (h.docid, h.score)).collect::<Vec<_>>();
        assert_eq!(
            scored(vectors.search(&[0.0, 2.0], 5)),
            [("a".into(), 1.0), ("b".into(), 2.0 / (2.0 * 2f32.sqrt()))]
        );
        assert_eq!(scored(vectors.search(&[1.0, 1.0], 1)), [("b".into(), 2.0 / (2f32.sqrt() * 2f32.sqrt()))]);
        // Equal scores: the smaller docid first.
        assert_eq!(scored(vectors.search(&[1.0, -1.0], 2))[0].0, "a");
    }
}
