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
    read: Mutex<Vec<(VectorsKey, Arc<SegmentVectors>)>>,
}

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
        if let Some((_, found)) = self.read.lock().iter().find(|(k, _)| *k == key) {
            return Ok(found.clone());
        }
        // Read outside the lock: other collections' queries go on meanwhile.
        let read = Arc::new(SegmentVectors::read(snapshot, model, store, segments, options)?);
        let mut kept = self.read.lock();
        if kept.len() >= KEPT {
            kept.remove(0);
        }
        kept.push((key, read.clone()));
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
