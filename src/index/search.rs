//! BM25 scoring over a collection's postings: term-at-a-time into a dense accumulator per segment, with
//! each document's length normalization cached per segment, parameters and commit, and docids resolved
//! through an in-memory table per segment.

use std::sync::Arc;

use tantivy::postings::Postings;
use tantivy::schema::IndexRecordOption;
use tantivy::{DocAddress, DocSet, Term, TERMINATED};

use super::{analyzer, bm25, Bm25Params, Hit, IndexError, Snapshot, DOCID_FIELD, LEN_FIELD};

/// Strings packed in one buffer, addressed by position (a segment's docids by document number).
#[derive(Default)]
pub(super) struct DocidTable {
    bytes: String,
    ends: Vec<u32>,
}

impl DocidTable {
    fn push(&mut self, s: &str) {
        self.bytes.push_str(s);
        self.ends.push(self.bytes.len() as u32);
    }

    fn get(&self, i: u32) -> &str {
        let i = i as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        self.ends.get(i).map_or("", |end| &self.bytes[start..*end as usize])
    }
}
/// Length normalizations depend on the segment, k1, b and avgdl (which changes with every commit).
pub(super) type NormKey = (tantivy::index::SegmentId, u32, u32, u64);

/// Cached normalization vectors (4 bytes per document each) kept per collection.
const MAX_CACHED_NORMS: usize = 64;

impl Snapshot<'_> {
    /// BM25 top-k for a query analyzed as documents are.
    pub fn search(&self, query: &str, k: usize, params: Bm25Params) -> Result<Vec<Hit>, IndexError> {
        let mut weights: Vec<(String, f32)> = Vec::new();
        for term in analyzer::terms(query) {
            match weights.iter_mut().find(|(t, _)| *t == term) {
                Some((_, w)) => *w += 1.0,
                None => weights.push((term, 1.0)),
            }
        }
        self.search_weighted(&weights, k, params)
    }

    /// BM25 top-k for a bag of analyzed terms with weights (a query term occurring twice weighs 2, as in
    /// Anserini's bag-of-words queries; RM3 gives expansion terms fractional weights). Term-at-a-time over
    /// a dense accumulator per segment; ties go to the smaller docid.
    pub fn search_weighted(
        &self,
        terms: &[(String, f32)],
        k: usize,
        params: Bm25Params,
    ) -> Result<Vec<Hit>, IndexError> {
        let searcher = &self.searcher;
        let stats = self.stats()?;
        let mut term_weights = Vec::with_capacity(terms.len());
        for (text, weight) in terms {
            let term = Term::from_field_text(self.collection.fields.contents, text);
            let df = searcher.doc_freq(&term).map_err(|e| self.collection.tantivy_err(e))?;
            let weight_idf = weight * bm25::idf(stats.num_docs, df);
            // A zero contribution would mark no document as touched; negative weights have no meaning here.
            if df > 0 && weight_idf > 0.0 {
                term_weights.push((term, weight_idf));
            }
        }
        let mut top: Vec<(f32, DocAddress)> = Vec::new();
        let mut floor = f32::NEG_INFINITY;
        for (ord, segment) in searcher.segment_readers().iter().enumerate() {
            self.go_on()?;
            let norms = self.norms(segment, params, stats.avg_len)?;
            let inverted =
                segment.inverted_index(self.collection.fields.contents).map_err(|e| self.collection.tantivy_err(e))?;
            let mut acc = vec![0f32; segment.max_doc() as usize];
            let mut touched = Vec::new();
            for (term, weight_idf) in &term_weights {
                self.go_on()?;
                let io_err = |source| IndexError::Io { path: self.collection.path.clone(), source };
                let Some(mut postings) = inverted.read_postings(term, IndexRecordOption::WithFreqs).map_err(io_err)?
                else {
                    continue;
                };
                let mut doc = postings.doc();
                while doc != TERMINATED {
                    let norm = norms[doc as usize];
                    let slot = &mut acc[doc as usize];
                    if *slot == 0.0 {
                        touched.push(doc);
                    }
                    *slot += bm25::term_score(*weight_idf, postings.term_freq(), norm);
                    doc = postings.advance();
                }
            }
            let alive = segment.alive_bitset();
            for doc in touched {
                let score = acc[doc as usize];
                if score < floor || alive.is_some_and(|a| a.is_deleted(doc)) {
                    continue;
                }
                top.push((score, DocAddress::new(ord as u32, doc)));
                if top.len() >= 2 * k.max(16) {
                    floor = prune(&mut top, k);
                }
            }
        }
        // The k best and every tie with the k-th: which of those make the cut is decided by docid, not by
        // where the documents sit in the index (which differs between two builds of one collection).
        prune(&mut top, k);
        let mut hits = self.resolve_docids(top)?;
        hits.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.docid.cmp(&b.docid)));
        hits.truncate(k);
        Ok(hits)
    }

    /// `k1 * (1 - b + b * dl / avgdl)` for every document of a segment, computed once per parameters and
    /// commit: scoring then reads one float per posting instead of decoding a length and dividing.
    fn norms(
        &self,
        segment: &tantivy::SegmentReader,
        params: Bm25Params,
        avg_len: f64,
    ) -> Result<Arc<Vec<f32>>, IndexError> {
        let key = (segment.segment_id(), params.k1.to_bits(), params.b.to_bits(), avg_len.to_bits());
        if let Some(norms) = self.collection.norms.lock().get(&key) {
            return Ok(norms.clone());
        }
        let lens = segment.fast_fields().u64(LEN_FIELD).map_err(|e| self.collection.tantivy_err(e))?;
        let norms: Arc<Vec<f32>> = Arc::new(
            (0..segment.max_doc()).map(|doc| bm25::length_norm(params, lens.values.get_val(doc), avg_len)).collect(),
        );
        let mut cache = self.collection.norms.lock();
        if cache.len() >= MAX_CACHED_NORMS {
            cache.clear();
        }
        cache.insert(key, norms.clone());
        Ok(norms)
    }

    /// Looks up the docids of scored addresses through each segment's docid table.
    fn resolve_docids(&self, top: Vec<(f32, DocAddress)>) -> Result<Vec<Hit>, IndexError> {
        top.into_iter()
            .map(|(score, address)| {
                let table = self.docid_table(self.searcher.segment_reader(address.segment_ord))?;
                Ok(Hit { address, docid: table.get(address.doc_id).to_string(), score })
            })
            .collect()
    }

    /// A segment's docids in memory, built once per segment by streaming its docid dictionary: looking a
    /// docid up in the dictionary decompresses a zstd block each time, which cost more than scoring.
    fn docid_table(&self, segment: &tantivy::SegmentReader) -> Result<Arc<DocidTable>, IndexError> {
        let id = segment.segment_id();
        if let Some(table) = self.collection.docids.lock().get(&id) {
            return Ok(table.clone());
        }
        let io_err = |source| IndexError::Io { path: self.collection.path.clone(), source };
        let column = segment.fast_fields().str(DOCID_FIELD).map_err(|e| self.collection.tantivy_err(e))?;
        let mut terms = DocidTable::default();
        if let Some(column) = &column {
            let mut stream = column.dictionary().stream().map_err(io_err)?;
            while stream.advance() {
                terms.push(&String::from_utf8_lossy(stream.key()));
            }
        }
        let mut table = DocidTable::default();
        for doc in 0..segment.max_doc() {
            let ord = column.as_ref().and_then(|c| c.term_ords(doc).next());
            table.push(ord.map_or("", |o| terms.get(o as u32)));
        }
        let table = Arc::new(table);
        let mut cache = self.collection.docids.lock();
        // Segments come and go with merges: keep the cache to the live ones.
        let live: std::collections::HashSet<_> =
            self.searcher.segment_readers().iter().map(|s| s.segment_id()).collect();
        cache.retain(|id, _| live.contains(id));
        cache.insert(id, table.clone());
        Ok(table)
    }
}

/// Keeps the k best (score descending), returning the k-th score as the floor for later candidates.
fn prune(top: &mut Vec<(f32, DocAddress)>, k: usize) -> f32 {
    top.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    // Keep ties with the k-th score so the docid tie-break is applied over all of them.
    let kth = top.get(k.saturating_sub(1)).map(|t| t.0);
    if let Some(kth) = kth {
        let keep = top.iter().take_while(|t| t.0 >= kth).count();
        top.truncate(keep.max(k));
    }
    kth.unwrap_or(f32::NEG_INFINITY)
}
