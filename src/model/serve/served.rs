//! A loaded model as the pipelines use it: (query, text) pairs in, scores out, through the model's inference
//! queue, with a bounded LRU in front of it. A cross-encoder's scores are cached by (query, text), so
//! switching between FirstP, MaxP and SumP for one query scores each segment once; a bi-encoder's embeddings
//! are cached by text, so repeated queries only embed the query. Both are also read from and added to an
//! on-disk store when one is given (a collection's embedding file; its pair outputs with `store_scores`).

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use lru::LruCache;

use super::queue::{BatchStats, JobTiming, Queue, Unfinished};
use super::vectors::VectorFile;
use crate::cancel::Cancel;
use crate::model::{cosine, Encoded, Fnv, ModelError, Reranker};

/// How pairs are built, batched and queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeOptions {
    /// Longest model input in word pieces.
    pub max_length: usize,
    /// Queries are cut to this many word pieces.
    pub max_query_tokens: usize,
    /// Padded tokens per forward pass (batch size × longest input).
    pub max_batch_tokens: usize,
    /// Inputs waiting for the model beyond which new requests are refused (429).
    pub max_queued_inputs: usize,
    /// Cached scores (cross-encoder) or embeddings (bi-encoder).
    pub cache_entries: usize,
}

/// Scores with what they cost.
#[derive(Debug, Clone, Default)]
pub struct Scores {
    pub scores: Vec<f32>,
    pub timing: JobTiming,
    /// Inputs that went through the model (the rest came from caches).
    pub computed: usize,
    /// FLOPs of the model passes the scores take, cached ones included (cross-encoders).
    pub flops: Option<f64>,
}

/// One model output (a logit, with a `[CLS]` state for Co-BERT, and the pair's length; or an embedding), shared
/// between the cache and its readers.
pub type Output = Arc<[f32]>;

pub struct Served {
    model: Arc<Reranker>,
    queue: Queue,
    /// Co-BERT's own backbone, when it is not the first round's (trained end to end).
    second: Option<Queue>,
    cache: Mutex<LruCache<u64, Output>>,
    /// Inputs answered without the model (memory cache, stored outputs, or the same input twice in a
    /// request), and inputs the model computed.
    hits: AtomicU64,
    misses: AtomicU64,
    options: ServeOptions,
}

impl Served {
    pub fn start(name: &str, model: Reranker, options: ServeOptions) -> Served {
        let model = Arc::new(model);
        let forward = {
            let model = model.clone();
            Box::new(move |batch: &[Encoded]| model.forward(batch))
        };
        let queue = Queue::start(name, forward, options.max_batch_tokens, options.max_queued_inputs);
        let second = matches!(&*model, Reranker::CoBert(m) if m.own.is_some()).then(|| {
            let model = model.clone();
            let forward = Box::new(move |batch: &[Encoded]| match &*model {
                Reranker::CoBert(m) => m.interactions().outputs_with_states(batch),
                _ => unreachable!("a second queue only for Co-BERT"),
            });
            Queue::start(&format!("{name}/cobert"), forward, options.max_batch_tokens, options.max_queued_inputs)
        });
        let entries = NonZeroUsize::new(options.cache_entries).unwrap_or(NonZeroUsize::MIN);
        let (hits, misses) = (AtomicU64::new(0), AtomicU64::new(0));
        Served { model, queue, second, cache: Mutex::new(LruCache::new(entries)), hits, misses, options }
    }

    pub fn model(&self) -> &Reranker {
        &self.model
    }

    /// The most word pieces a segment may have so that it is never cut (see `Reranker::segment_budget`).
    pub fn segment_budget(&self) -> usize {
        self.model.segment_budget(self.options.max_length, self.options.max_query_tokens)
    }

    /// Scores every text against the query (a decoder reranker's with `instruction`, else its recipe's
    /// default); `store` holds this model's outputs on disk (see the module).
    pub fn score(
        &self,
        query: &str,
        instruction: Option<&str>,
        texts: &[&str],
        store: Option<&VectorFile>,
        cancel: &Cancel,
    ) -> Result<Scores, ModelError> {
        match &*self.model {
            Reranker::Cross(m) | Reranker::CoBert(crate::model::cobert::CoBert { cross: m, .. }) => {
                let (pairs, timing, computed) =
                    self.pair_outputs(m, &self.queue, (query, instruction), texts, store, cancel)?;
                // Each output ends with the pair's length, so FLOPs count cached pairs too.
                let flops = pairs.iter().map(|o| m.pair_flops(o[o.len() - 1] as usize)).sum();
                let scores = pairs.iter().map(|o| o[0]).collect();
                Ok(Scores { scores, timing, computed, flops: Some(flops) })
            }
            Reranker::Bi(m) => {
                // The query goes last, so segment i stays at index i; texts' embeddings are stored, the query's
                // is not.
                let inputs: Vec<&str> = texts.iter().copied().chain([query]).collect();
                let (mut found, timing, missing) = self.embeddings(m, &inputs, store, |i| i < texts.len(), cancel)?;
                let q = found.pop().expect("the query embedded");
                let scores = found.iter().map(|e| cosine(&q, e)).collect();
                // A pair is computed when its text's embedding was (the query's is not a pair).
                let computed = missing.iter().filter(|&&i| i < texts.len()).count();
                Ok(Scores { scores, timing, computed, flops: None })
            }
        }
    }

    /// A cross-encoder's outputs for every (query, text) pair, from the cache or the model, each with the
    /// pair's length in word pieces appended.
    fn pair_outputs(
        &self,
        m: &crate::model::CrossEncoder,
        queue: &Queue,
        (query, instruction): (&str, Option<&str>),
        texts: &[&str],
        store: Option<&VectorFile>,
        cancel: &Cancel,
    ) -> Result<(Vec<Output>, JobTiming, usize), ModelError> {
        // The two queues' outputs differ, so their cache keys do; the store holds the first queue's only.
        let first = std::ptr::eq(queue, &self.queue);
        let mut salt: Vec<u8> = if first { Vec::new() } else { b"second".to_vec() };
        // An instruction makes other pairs; without one the keys are those stores already hold.
        if let Some(instruction) = instruction {
            salt.extend_from_slice(b"instruction\xff");
            salt.extend_from_slice(instruction.as_bytes());
            salt.push(0xff);
        }
        let store = store.filter(|_| first);
        let keys: Vec<u64> = texts.iter().map(|t| key(Some((&salt, query)), t)).collect();
        let (mut found, mut missing) = self.cached(&keys);
        from_store(store, &keys, |_| true, &mut found, &mut missing);
        let inputs = missing
            .iter()
            .map(|&i| {
                m.encode_with(instruction, query, texts[i], self.options.max_length, self.options.max_query_tokens)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let lengths: Vec<usize> = inputs.iter().map(|e| e.ids.len()).collect();
        let (mut outputs, timing) = match queue.run(inputs, cancel) {
            Ok(done) => done,
            Err(Unfinished { error, mut outputs }) => {
                for (output, &len) in outputs.iter_mut().zip(&lengths) {
                    if let Some(output) = output {
                        output.push(len as f32);
                    }
                }
                self.keep(&keys, &missing, outputs, store, |_| true)?;
                return Err(error);
            }
        };
        for (output, len) in outputs.iter_mut().zip(lengths) {
            output.push(len as f32);
        }
        to_store(store, &keys, |_| true, &missing, &outputs)?;
        self.remember(&keys, &missing, outputs, &mut found);
        let found = found.into_iter().map(|o| o.expect("every pair scored")).collect();
        Ok((found, timing, missing.len()))
    }

    /// Co-BERT's second round: the outputs (logit, `[CLS]` state, length) of (query, text) pairs, normally
    /// cached by the first round.
    pub fn interactions(
        &self,
        query: &str,
        texts: &[&str],
        store: Option<&VectorFile>,
        cancel: &Cancel,
    ) -> Result<Vec<Output>, ModelError> {
        let Reranker::CoBert(m) = &*self.model else {
            return Err(ModelError::Unsupported("the cobert pipeline needs a Co-BERT model".into()));
        };
        let queue = self.second.as_ref().unwrap_or(&self.queue);
        let (outputs, _, _) = self.pair_outputs(m.interactions(), queue, (query, None), texts, store, cancel)?;
        Ok(outputs)
    }

    /// A bi-encoder's embeddings of texts (pooled as it is configured, normalized when it normalizes), cached
    /// as scoring's are: a text embedded for a search is not embedded again.
    pub fn embed(&self, texts: &[&str], cancel: &Cancel) -> Result<Vec<Output>, ModelError> {
        let Reranker::Bi(m) = &*self.model else {
            return Err(ModelError::Unsupported("only a bi-encoder computes embeddings".into()));
        };
        Ok(self.embeddings(m, texts, None, |_| false, cancel)?.0)
    }

    /// Embeddings of texts: from the cache, then `store` (for the texts `stored` says it keeps), then computed;
    /// with the model's timing and the indices computed.
    fn embeddings(
        &self,
        m: &crate::model::BiEncoder,
        texts: &[&str],
        store: Option<&VectorFile>,
        stored: impl Fn(usize) -> bool + Copy,
        cancel: &Cancel,
    ) -> Result<(Vec<Output>, JobTiming, Vec<usize>), ModelError> {
        let keys: Vec<u64> = texts.iter().map(|t| key(None, t)).collect();
        let (mut found, mut missing) = self.cached(&keys);
        from_store(store, &keys, stored, &mut found, &mut missing);
        let inputs = missing.iter().map(|&i| m.encode(texts[i])).collect::<Result<Vec<_>, _>>()?;
        let (outputs, timing) = match self.queue.run(inputs, cancel) {
            Ok(done) => done,
            Err(Unfinished { error, outputs }) => {
                self.keep(&keys, &missing, outputs, store, stored)?;
                return Err(error);
            }
        };
        to_store(store, &keys, stored, &missing, &outputs)?;
        self.remember(&keys, &missing, outputs, &mut found);
        Ok((found.into_iter().map(|o| o.expect("every text embedded")).collect(), timing, missing))
    }

    /// The record of `store` holding a text's embedding (`embed_into`, or a search that embedded it), if any.
    pub fn stored_record(&self, text: &str, store: &VectorFile) -> Option<u64> {
        store.record(key(None, text))
    }

    /// Embeds texts ahead of queries into a collection's embedding file (bi-encoders; `longrank embed`).
    /// Returns how many were computed.
    pub fn embed_into(&self, texts: &[&str], file: &VectorFile, cancel: &Cancel) -> Result<usize, ModelError> {
        let Reranker::Bi(m) = &*self.model else {
            return Err(ModelError::Unsupported("only a bi-encoder's embeddings can be computed ahead".into()));
        };
        let keys: Vec<u64> = texts.iter().map(|t| key(None, t)).collect();
        let missing: Vec<usize> = (0..texts.len()).filter(|&i| file.get(keys[i]).is_none()).collect();
        let inputs = missing.iter().map(|&i| m.encode(texts[i])).collect::<Result<Vec<_>, _>>()?;
        let (outputs, _) = self.queue.run(inputs, cancel)?;
        for (&i, v) in missing.iter().zip(&outputs) {
            file.append(keys[i], v)?;
        }
        Ok(missing.len())
    }

    /// Outputs found in the cache, and the indices still missing: one per key, so that the same input twice
    /// (a duplicate document, a repeated segment) is computed once and both get the same output.
    fn cached(&self, keys: &[u64]) -> (Vec<Option<Output>>, Vec<usize>) {
        let mut cache = self.cache.lock();
        let found: Vec<Option<Output>> = keys.iter().map(|k| cache.get(k).cloned()).collect();
        let mut seen = std::collections::HashSet::new();
        let missing = (0..keys.len()).filter(|&i| found[i].is_none() && seen.insert(keys[i])).collect();
        (found, missing)
    }

    /// Keeps what a request computed before it was cut off (a timeout, a client gone): the outputs of its
    /// finished batches go to the store and the cache, so that a retry computes only the rest.
    fn keep(
        &self,
        keys: &[u64],
        missing: &[usize],
        outputs: Vec<Option<Vec<f32>>>,
        store: Option<&VectorFile>,
        stored: impl Fn(usize) -> bool,
    ) -> Result<(), ModelError> {
        let (done, outputs): (Vec<usize>, Vec<Vec<f32>>) =
            missing.iter().zip(outputs).filter_map(|(&i, output)| Some((i, output?))).unzip();
        to_store(store, keys, stored, &done, &outputs)?;
        self.misses.fetch_add(done.len() as u64, Ordering::Relaxed);
        let mut cache = self.cache.lock();
        for (&i, output) in done.iter().zip(outputs) {
            cache.put(keys[i], output.into());
        }
        Ok(())
    }

    /// Caches the computed outputs and fills them in, for the missing indices and their duplicates.
    fn remember(&self, keys: &[u64], missing: &[usize], outputs: Vec<Vec<f32>>, found: &mut [Option<Output>]) {
        self.hits.fetch_add((keys.len() - missing.len()) as u64, Ordering::Relaxed);
        self.misses.fetch_add(missing.len() as u64, Ordering::Relaxed);
        let mut cache = self.cache.lock();
        for (&i, output) in missing.iter().zip(outputs) {
            let output: Output = output.into();
            cache.put(keys[i], output.clone());
            found[i] = Some(output);
        }
        let mut known = std::collections::HashMap::new();
        for (slot, key) in found.iter().zip(keys) {
            if let Some(output) = slot {
                known.entry(*key).or_insert_with(|| output.clone());
            }
        }
        for (slot, key) in found.iter_mut().zip(keys) {
            if slot.is_none() {
                *slot = known.get(key).cloned();
            }
        }
    }

    /// Inputs waiting for the model.
    pub fn queued(&self) -> usize {
        self.queue.queued() + self.second.as_ref().map_or(0, Queue::queued)
    }

    /// What the model's inference threads have run.
    pub fn stats(&self) -> BatchStats {
        let mut stats = self.queue.stats();
        if let Some(second) = &self.second {
            stats.merge(&second.stats());
        }
        stats.cache_hits = self.hits.load(Ordering::Relaxed);
        stats.cache_misses = self.misses.load(Ordering::Relaxed);
        stats
    }
}

/// Moves the missing outputs that the store holds (among those `stored` says it keeps) into `found`.
fn from_store(
    store: Option<&VectorFile>,
    keys: &[u64],
    stored: impl Fn(usize) -> bool,
    found: &mut [Option<Output>],
    missing: &mut Vec<usize>,
) {
    let Some(file) = store else { return };
    missing.retain(|&i| match stored(i).then(|| file.get(keys[i])).flatten() {
        Some(output) => {
            found[i] = Some(output.into());
            false
        }
        None => true,
    });
}

/// Adds the computed outputs (of the `missing` indices) that `stored` says the store keeps.
fn to_store(
    store: Option<&VectorFile>,
    keys: &[u64],
    stored: impl Fn(usize) -> bool,
    missing: &[usize],
    outputs: &[Vec<f32>],
) -> Result<(), ModelError> {
    let Some(file) = store else { return Ok(()) };
    for (&i, output) in missing.iter().zip(outputs).filter(|(&i, _)| stored(i)) {
        file.append(keys[i], output)?;
    }
    Ok(())
}

/// The cache key of a (query, text) pair (after the queue's salt), or of a text alone; stable, since embedding
/// files keep it.
fn key(query: Option<(&[u8], &str)>, text: &str) -> u64 {
    let mut h = Fnv::default();
    if let Some((salt, query)) = query {
        h.write(salt);
        h.write(query.as_bytes());
        // 0xff never occurs in UTF-8: ("ab", "c") and ("a", "bc") differ.
        h.write(&[0xff]);
    }
    h.write(text.as_bytes());
    h.0
}

impl Scores {
    pub fn queue_ms(&self) -> f64 {
        ms(self.timing.queue)
    }

    pub fn inference_ms(&self) -> f64 {
        ms(self.timing.inference)
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
