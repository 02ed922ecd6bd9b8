//! Dropout in training, where each family's transformers model applies it in `train()` mode and at its
//! config's rates: each kept element scaled by 1/(1 − rate), the others zeroed. The masks come from one seeded
//! stream that the trainer starts per step (`Dropout::start`), so a run repeats bit for bit, a resumed run draws
//! as the uninterrupted one did, and a pass outside a step (dev scoring, inference) drops nothing. What an op
//! drops is a hash of its seed and each element's place (`DropMask`): on the CPU its backward pass (the fused
//! attention op's too) finds the same places again without a mask kept in memory, and candle's chain of
//! operations drops the same ones.

use std::ops::Range;
use std::sync::Arc;

use candle_core::{CpuStorage, DType, Layout, Shape, Tensor};
use parking_lot::Mutex;
use serde_json::Value;

use super::family::Family;
use crate::rng::Rng;

/// Where a model drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Site {
    /// The embeddings, after their LayerNorm.
    Embeddings,
    /// The attention block's output projection, before its residual.
    AttentionOutput,
    /// The feed-forward block: its output projection before the residual (ModernBERT: the gated activations
    /// before that projection, as transformers places it).
    FeedForward,
    /// The head's pooled state, before its dense layer.
    Pooled,
    /// The head's state before the classifier.
    Classifier,
}

/// Each site's rate.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rates {
    pub embeddings: f32,
    pub attention: f32,
    pub attention_output: f32,
    pub feed_forward: f32,
    pub pooled: f32,
    pub classifier: f32,
}

impl Rates {
    /// The rates a family's `config.json` sets, transformers' defaults where it is silent (and a classifier
    /// dropout of null meaning the hidden one).
    pub fn from_config(config: &Value, family: Family) -> Result<Rates, String> {
        let rate = |key: &str, default: f64| -> Result<f32, String> {
            let value = config.get(key).and_then(Value::as_f64).unwrap_or(default);
            match (0.0..1.0).contains(&value) {
                true => Ok(value as f32),
                false => Err(format!("{key} = {value}: a dropout rate is at least 0 and below 1")),
            }
        };
        Ok(match family {
            Family::DistilBert => {
                let hidden = rate("dropout", 0.1)?;
                // DistilBERT's attention output goes to its residual undropped.
                Rates {
                    embeddings: hidden,
                    attention: rate("attention_dropout", 0.1)?,
                    attention_output: 0.0,
                    feed_forward: hidden,
                    pooled: 0.0,
                    classifier: rate("seq_classif_dropout", 0.2)?,
                }
            }
            Family::ModernBert => {
                let attention = rate("attention_dropout", 0.0)?;
                Rates {
                    embeddings: rate("embedding_dropout", 0.0)?,
                    attention,
                    attention_output: attention,
                    feed_forward: rate("mlp_dropout", 0.0)?,
                    pooled: 0.0,
                    classifier: rate("classifier_dropout", 0.0)?,
                }
            }
            family => {
                let hidden = rate("hidden_dropout_prob", 0.1)?;
                let classifier = match family {
                    Family::Deberta => rate("cls_dropout", hidden as f64)?,
                    _ => rate("classifier_dropout", hidden as f64)?,
                };
                let pooled = match family {
                    // BERT's pooler reads the state undropped; RoBERTa's and ELECTRA's heads drop it first.
                    Family::Bert => 0.0,
                    Family::Deberta => rate("pooler_dropout", 0.0)?,
                    _ => classifier,
                };
                Rates {
                    embeddings: hidden,
                    attention: rate("attention_probs_dropout_prob", 0.1)?,
                    attention_output: hidden,
                    feed_forward: hidden,
                    pooled,
                    classifier,
                }
            }
        })
    }

    fn at(&self, site: Site) -> f32 {
        match site {
            Site::Embeddings => self.embeddings,
            Site::AttentionOutput => self.attention_output,
            Site::FeedForward => self.feed_forward,
            Site::Pooled => self.pooled,
            Site::Classifier => self.classifier,
        }
    }
}

/// A model's dropout, shared by its parts: none in an inference model; in a trainable one, its rates and the
/// stream of the step under way (none between steps).
#[derive(Clone, Default)]
pub struct Dropout(Option<Arc<Shared>>);

struct Shared {
    rates: Rates,
    stream: Mutex<Option<Rng>>,
}

impl Dropout {
    pub fn new(rates: Rates) -> Dropout {
        Dropout(Some(Arc::new(Shared { rates, stream: Mutex::new(None) })))
    }

    /// Drops from here on, with masks drawn from `seed`'s stream in the order the passes ask for them.
    pub fn start(&self, seed: u64) {
        if let Some(shared) = &self.0 {
            *shared.stream.lock() = Some(Rng::new(seed));
        }
    }

    /// Drops nothing from here on.
    pub fn stop(&self) {
        if let Some(shared) = &self.0 {
            *shared.stream.lock() = None;
        }
    }

    /// The masks of one attention op's probabilities (one layer's pass), drawn from the stream, while attention
    /// drops.
    pub fn attention(&self) -> Option<DropMask> {
        let shared = self.0.as_ref().filter(|s| s.rates.attention > 0.0)?;
        let seed = shared.stream.lock().as_mut()?.next_u64();
        Some(DropMask::new(shared.rates.attention, seed))
    }

    /// `x` with its elements dropped at `site`'s rate while a step is under way; else `x` itself. On the CPU
    /// (f32) one op whose backward pass drops the gradient at the same places, no mask kept between them;
    /// elsewhere a product by the mask's factors.
    pub fn apply(&self, site: Site, x: &Tensor) -> candle_core::Result<Tensor> {
        let Some(shared) = &self.0 else { return Ok(x.clone()) };
        let rate = shared.rates.at(site);
        let seed = if rate > 0.0 { shared.stream.lock().as_mut().map(Rng::next_u64) } else { None };
        let Some(seed) = seed else { return Ok(x.clone()) };
        let mask = DropMask::new(rate, seed);
        match (x.device().is_cpu(), x.dtype()) {
            (true, DType::F32) => x.contiguous()?.apply_op1(mask),
            _ => mask.times_factors(x),
        }
    }
}

/// What one op drops: element (sequence, head, query, key) of attention's probabilities, or element i of
/// another tensor (as (0, 0, 0, i)), drops where a hash of the op's seed and its place falls below the rate,
/// and the others are scaled by 1/(1 − rate).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DropMask {
    seed: u64,
    /// Rate × 2³², against a 32-bit hash.
    threshold: u32,
    scale: f32,
}

impl DropMask {
    pub fn new(rate: f32, seed: u64) -> DropMask {
        let threshold = (rate as f64 * 4_294_967_296.0).min(u32::MAX as f64) as u32;
        DropMask { seed, threshold, scale: 1.0 / (1.0 - rate) }
    }

    /// Multiplies `row`, the probabilities of `query` in (`sequence`, `head`) for the keys from `first_key` on,
    /// by their factors.
    pub fn apply(&self, (sequence, head, query): (usize, usize, usize), first_key: usize, row: &mut [f32]) {
        let mut mixer = Rng::new(self.seed ^ (((sequence as u64) << 40) | ((head as u64) << 24) | query as u64));
        let row_key = mixer.next_u64() as u32;
        // A loop of integer lanes the compiler vectorizes: attention holds millions of probabilities a pass.
        for (key, p) in (first_key as u32..).zip(row) {
            *p = if hash(row_key ^ key.wrapping_mul(0x9e37_79b9)) < self.threshold { 0.0 } else { *p * self.scale };
        }
    }

    /// Multiplies `block`, rows of `width` probabilities of (`sequence`, `head`) for the queries from
    /// `first_query` and the keys from `first_key` on, by their factors.
    pub fn apply_block(
        &self,
        (sequence, head): (usize, usize),
        (first_query, first_key): (usize, usize),
        block: &mut [f32],
        width: usize,
    ) {
        for (t, row) in block.chunks_exact_mut(width.max(1)).enumerate() {
            self.apply((sequence, head, first_query + t), first_key, row);
        }
    }

    /// `x` times its factors, as a tensor (any device and dtype).
    fn times_factors(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mut factors = vec![1.0; x.elem_count()];
        self.apply((0, 0, 0), 0, &mut factors);
        times(x, factors)
    }

    /// The factors of every probability `[batch, heads, queries, keys]`.
    pub fn factors(&self, (batch, heads): (usize, usize), queries: Range<usize>, keys: Range<usize>) -> Vec<f32> {
        let area = queries.len() * keys.len();
        let mut factors = vec![1.0; batch * heads * area];
        for (i, block) in factors.chunks_exact_mut(area.max(1)).enumerate() {
            self.apply_block((i / heads, i % heads), (queries.start, keys.start), block, keys.len());
        }
        factors
    }
}

/// `probs` (`[batch, heads, queries, keys]`, the queries from `first_query` and the keys from `first_key` on)
/// with `dropout`'s probabilities dropped, if any: candle's chain, as the fused op drops them.
pub fn drop_probabilities(
    dropout: Option<DropMask>,
    probs: Tensor,
    (first_query, first_key): (usize, usize),
) -> candle_core::Result<Tensor> {
    let Some(dropout) = dropout else { return Ok(probs) };
    let (batch, heads, queries, keys) = probs.dims4()?;
    times(&probs, dropout.factors((batch, heads), first_query..first_query + queries, first_key..first_key + keys))
}

/// `x` times `factors` (its shape's elements), on its device and in its dtype.
fn times(x: &Tensor, factors: Vec<f32>) -> candle_core::Result<Tensor> {
    x.mul(&Tensor::from_vec(factors, x.shape(), x.device())?.to_dtype(x.dtype())?)
}

/// A 32-bit integer hash (Wellons's "lowbias32"): each output bit depends on every input bit.
fn hash(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

/// Dropout of a contiguous f32 tensor on the CPU as one op, its elements in order (element i at (0, 0, 0, i)).
impl candle_core::CustomOp1 for DropMask {
    fn name(&self) -> &'static str {
        "dropout"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (CpuStorage::F32(values), Some((start, end))) = (storage, layout.contiguous_offsets()) else {
            candle_core::bail!("dropout: a contiguous f32 tensor");
        };
        let mut out = values[start..end].to_vec();
        self.apply((0, 0, 0), 0, &mut out);
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }

    /// The gradient dropped at the same places and scaled the same.
    fn bwd(&self, _: &Tensor, _: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(grad.contiguous()?.apply_op1_no_bwd(self)?))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::*;

    fn ones(count: usize) -> Tensor {
        Tensor::ones(count, candle_core::DType::F32, &Device::Cpu).unwrap()
    }

    fn rates(rate: f32) -> Rates {
        Rates { embeddings: rate, attention: rate, ..Default::default() }
    }

    #[test]
    fn masks_drop_at_the_rate_scale_the_rest_and_repeat_with_their_seed() {
        let dropout = Dropout::new(rates(0.25));
        let x = ones(100_001);
        assert_eq!(dropout.apply(Site::Embeddings, &x).unwrap().to_vec1::<f32>().unwrap(), x.to_vec1::<f32>().unwrap());
        dropout.start(7);
        let first = dropout.apply(Site::Embeddings, &x).unwrap().to_vec1::<f32>().unwrap();
        let dropped = first.iter().filter(|&&v| v == 0.0).count() as f64 / first.len() as f64;
        assert!((dropped - 0.25).abs() < 0.005, "dropped {dropped}");
        assert!(first.iter().all(|&v| v == 0.0 || v == 1.0 / 0.75), "kept ones scaled by 1/(1 - rate)");
        let mean = first.iter().map(|&v| v as f64).sum::<f64>() / first.len() as f64;
        assert!((mean - 1.0).abs() < 0.01, "expectation kept: {mean}");
        // The next draw differs; the same seed draws the same masks again.
        let second = dropout.apply(Site::Embeddings, &x).unwrap().to_vec1::<f32>().unwrap();
        assert_ne!(first, second);
        dropout.start(7);
        assert_eq!(dropout.apply(Site::Embeddings, &x).unwrap().to_vec1::<f32>().unwrap(), first);
        dropout.start(8);
        assert_ne!(dropout.apply(Site::Embeddings, &x).unwrap().to_vec1::<f32>().unwrap(), first);
        // Sites at rate 0 and a stopped stream drop nothing.
        let unchanged =
            |site: Site| dropout.apply(site, &x).unwrap().to_vec1::<f32>().unwrap() == x.to_vec1::<f32>().unwrap();
        assert!(unchanged(Site::FeedForward));
        dropout.stop();
        assert!(unchanged(Site::Embeddings));
        assert!(
            Dropout::default().apply(Site::Embeddings, &x).unwrap().to_vec1::<f32>().unwrap()
                == x.to_vec1::<f32>().unwrap()
        );
    }

    #[test]
    fn the_cpu_op_drops_as_the_factors_do_and_its_gradient_at_the_same_places() {
        let x = candle_core::Var::randn(0f32, 1.0, (3, 70), &Device::Cpu).unwrap();
        let mask = DropMask::new(0.4, 9);
        let fused = x.as_tensor().apply_op1(mask).unwrap();
        assert_eq!(
            fused.to_vec2::<f32>().unwrap(),
            mask.times_factors(x.as_tensor()).unwrap().to_vec2::<f32>().unwrap()
        );
        let weights = Tensor::randn(0f32, 1.0, (3, 70), &Device::Cpu).unwrap();
        let grads = (&fused * &weights).unwrap().sum_all().unwrap().backward().unwrap();
        let want = mask.times_factors(&weights).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(grads.get(x.as_tensor()).unwrap().to_vec2::<f32>().unwrap(), want);
    }

    #[test]
    fn attention_masks_follow_each_probabilitys_place_at_the_rate() {
        let dropout = Dropout::new(rates(0.1));
        assert_eq!(dropout.attention(), None, "no step under way");
        dropout.start(3);
        let (a, b) = (dropout.attention().unwrap(), dropout.attention().unwrap());
        assert_ne!(a, b, "each op its own seed");
        let factors = a.factors((2, 3), 0..50, 0..200);
        let dropped = factors.iter().filter(|&&f| f == 0.0).count() as f64 / factors.len() as f64;
        assert!((dropped - 0.1).abs() < 0.01, "dropped {dropped}");
        assert!(factors.iter().all(|&f| f == 0.0 || f == 1.0 / 0.9));
        // A block of queries and keys gets the factors the whole has at those places.
        let block = a.factors((2, 3), 10..20, 150..200);
        let at = |s: usize, h: usize, q: usize, k: usize| factors[((s * 3 + h) * 50 + q) * 200 + k];
        for (i, f) in block.iter().enumerate() {
            let (s, h, q, k) = (i / (3 * 10 * 50), i / (10 * 50) % 3, 10 + i / 50 % 10, 150 + i % 50);
            assert_eq!(*f, at(s, h, q, k), "{s} {h} {q} {k}");
        }
        assert_ne!(b.factors((2, 3), 0..50, 0..200), factors);
        dropout.start(3);
        assert_eq!(dropout.attention(), Some(a), "the same stream, the same seeds");
    }

    #[test]
    fn each_family_drops_where_and_as_much_as_its_transformers_model() {
        let bert = serde_json::json!({"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.2});
        let got = Rates::from_config(&bert, Family::Bert).unwrap();
        assert_eq!((got.embeddings, got.attention, got.attention_output, got.feed_forward), (0.1, 0.2, 0.1, 0.1));
        assert_eq!((got.pooled, got.classifier), (0.0, 0.1));
        let roberta = serde_json::json!({"hidden_dropout_prob": 0.1, "classifier_dropout": 0.3});
        let got = Rates::from_config(&roberta, Family::Roberta).unwrap();
        assert_eq!((got.attention, got.pooled, got.classifier), (0.1, 0.3, 0.3));
        let got = Rates::from_config(&serde_json::json!({}), Family::DistilBert).unwrap();
        assert_eq!((got.attention_output, got.feed_forward, got.classifier), (0.0, 0.1, 0.2));
        let got = Rates::from_config(&serde_json::json!({"cls_dropout": null}), Family::Deberta).unwrap();
        assert_eq!((got.pooled, got.classifier), (0.0, 0.1));
        assert_eq!(Rates::from_config(&serde_json::json!({}), Family::ModernBert).unwrap(), Rates::default());
        let bad = serde_json::json!({"hidden_dropout_prob": 1.0});
        assert!(Rates::from_config(&bad, Family::Bert).unwrap_err().contains("hidden_dropout_prob = 1"));
    }
}
