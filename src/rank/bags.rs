//! The bm25 selector's view of documents' segments: each segment's analyzed terms, counted (a bag of terms), and
//! its length. It depends on the text and the segmentation, not on the query, so it is made once per document
//! and kept, as segmentations are (`rerank::SegmentCache`): a query then scores a segment by looking up its own
//! few terms instead of analyzing the segment's text again, which cost ten times what reading every segment's
//! stored embedding costs (BENCHMARKS.md, "Preselection's cost").

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::ops::Range;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::index::analyzer;

/// A segment's analyzed terms: how many, and each one's count, by id in the cache's vocabulary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bag {
    pub len: u64,
    /// (term id, count), sorted by id.
    counts: Vec<(u32, u32)>,
}

impl Bag {
    fn of(terms: &[String], vocabulary: &mut HashMap<String, u32>) -> Bag {
        let mut ids: Vec<u32> = terms
            .iter()
            .map(|t| match vocabulary.get(t) {
                Some(&id) => id,
                None => {
                    let id = vocabulary.len() as u32;
                    vocabulary.insert(t.clone(), id);
                    id
                }
            })
            .collect();
        ids.sort_unstable();
        let mut counts: Vec<(u32, u32)> = Vec::new();
        for id in ids {
            match counts.last_mut() {
                Some((last, count)) if *last == id => *count += 1,
                _ => counts.push((id, 1)),
            }
        }
        Bag { len: terms.len() as u64, counts }
    }

    /// How often the term of this id occurs (none: a term no bag of the vocabulary holds).
    pub fn tf(&self, id: Option<u32>) -> u32 {
        let Some(id) = id else { return 0 };
        self.counts.binary_search_by_key(&id, |&(i, _)| i).map_or(0, |at| self.counts[at].1)
    }
}

/// Each document's bags, and the ids of the query's terms in the same vocabulary.
pub struct Bags {
    pub docs: Vec<Arc<Vec<Bag>>>,
    pub query: Vec<Option<u32>>,
}

/// Bags held at most, counted in (segment, distinct term) entries of 8 bytes: 64 MB, then the cache starts over.
const MAX_ENTRIES: usize = 8_000_000;

#[derive(Default)]
pub struct BagCache {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    vocabulary: HashMap<String, u32>,
    docs: HashMap<u64, Arc<Vec<Bag>>>,
    entries: usize,
}

/// A document's text and the byte ranges of its segments: what its bags depend on.
fn key(text: &str, segments: &[Range<usize>]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    segments.hash(&mut h);
    h.finish()
}

impl BagCache {
    /// The bags of each document's segments (`docs`: its text and its segments' byte ranges), analyzed once
    /// (outside the lock), and the query's term ids.
    pub fn bags(&self, docs: &[(&str, Vec<Range<usize>>)], query: &[String]) -> Bags {
        let analyze = |(text, segments): &(&str, Vec<Range<usize>>)| -> Vec<Vec<String>> {
            segments.iter().map(|s| analyzer::terms(&text[s.clone()])).collect()
        };
        let keys: Vec<u64> = docs.iter().map(|(text, segments)| key(text, segments)).collect();
        let missing: Vec<usize> = {
            let inner = self.inner.lock();
            (0..docs.len()).filter(|&i| !inner.docs.contains_key(&keys[i])).collect()
        };
        let mut analyzed: HashMap<usize, Vec<Vec<String>>> = missing.iter().map(|&i| (i, analyze(&docs[i]))).collect();
        let mut inner = self.inner.lock();
        let adding: usize = analyzed.values().flatten().map(Vec::len).sum();
        if inner.entries + adding > MAX_ENTRIES {
            *inner = Inner::default();
        }
        let bags = (0..docs.len())
            .map(|i| {
                if let Some(bags) = inner.docs.get(&keys[i]) {
                    return bags.clone();
                }
                // Found before, and gone since the cache started over: analyzed now.
                let segments = analyzed.remove(&i).unwrap_or_else(|| analyze(&docs[i]));
                let inner = &mut *inner;
                let bags: Vec<Bag> = segments.iter().map(|terms| Bag::of(terms, &mut inner.vocabulary)).collect();
                inner.entries += bags.iter().map(|b| b.counts.len()).sum::<usize>();
                let bags = Arc::new(bags);
                inner.docs.insert(keys[i], bags.clone());
                bags
            })
            .collect();
        let query = query.iter().map(|t| inner.vocabulary.get(t).copied()).collect();
        Bags { docs: bags, query }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bags_count_each_segments_terms_as_the_analyzer_gives_them() {
        let cache = BagCache::default();
        let text = "Bees dance. The bees' dance tells where flowers are; bees follow.";
        let segments = vec![0..11, 12..text.len()];
        let query = analyzer::terms("bee dancing flowers honey");
        let bags = cache.bags(&[(text, segments.clone())], &query);
        for (bag, range) in bags.docs[0].iter().zip(&segments) {
            let terms = analyzer::terms(&text[range.clone()]);
            assert_eq!(bag.len, terms.len() as u64);
            for (term, &id) in query.iter().zip(&bags.query) {
                assert_eq!(bag.tf(id) as usize, terms.iter().filter(|t| *t == term).count(), "{term}");
            }
        }
        assert_eq!(bags.query[3], None, "honey is in no segment");
        // Kept: the same document again is not analyzed again (the same bags), whatever the query.
        let again = cache.bags(&[(text, segments)], &analyzer::terms("flowers"));
        assert!(Arc::ptr_eq(&again.docs[0], &bags.docs[0]));
        assert_eq!(again.docs[0][1].tf(again.query[0]), 1);
    }
}
