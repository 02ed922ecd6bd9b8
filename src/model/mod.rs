//! BERT-class models with candle: Hugging Face directories (`config.json`, `tokenizer.json`, `*.safetensors`
//! or `pytorch_model.bin`) of the families `family` knows, loaded as cross-encoders (the first token's state
//! through the family's head, over the tokenizer's pair template) or as sentence-transformers bi-encoders (mean or
//! CLS pooling, optional normalization). Inputs are truncated here, never by the tokenizer file: the shipped
//! MiniLM's tokenizer.json truncates and pads to 128 on its own, which the loader switches off.

mod bert;
pub mod cobert;
mod cpu;
pub use cpu::blas::gemm_path;
pub use cpu::mapped::MappedVectors;
mod deberta;
mod decoder;
mod dropout;
mod encoder;
mod error;
mod family;
mod fingerprint;
mod head;
mod hub;
mod load;
mod modernbert;
mod network;
mod recipe;
mod relative;
mod rotary;
mod serve;
mod tokenize;
mod trainable;

use std::path::Path;

use candle_core::{DType, Device};
use serde::Deserialize;

pub use crate::cancel::Cancel;
pub(crate) use crate::hash::Fnv;
pub use dropout::Dropout;
pub use encoder::{BiEncoder, CrossEncoder, Pooling};
pub(crate) use error::load_err;
pub use error::ModelError;
pub use fingerprint::{outputs_hash, weights_hash};
pub use hub::resolve;
pub use load::{device, dtype};
use load::{read_config, read_json, weights};
pub use network::encoder_flops;
use network::Inputs;
pub use recipe::{Recipe, RECIPES};
pub use serve::neighbours::{IndexHeader, Neighbours};
pub use serve::queue::{BatchStats, JobTiming};
pub use serve::served::{Output, Scores, ServeOptions, Served};
pub use serve::vectors::{VectorFile, VectorWriter};
pub use tokenize::Encoded;
use tokenize::Pieces;
pub(crate) use trainable::replace_dir;
pub use trainable::{CoBertInit, TrainableEncoder};

/// Makes this thread, and every thread it starts from now on (they inherit it), treat subnormal floats as zero
/// and flush subnormal results to zero, as onnxruntime's threads do by default: a product that meets
/// subnormal operands (late in training, gradients underflow) takes a microcode assist per operation.
pub fn flush_subnormals() {
    #[cfg(target_arch = "x86_64")]
    #[allow(deprecated)] // `_mm_setcsr` is deprecated in favour of inline assembly, with the same effect.
    // SAFETY: sets only the FTZ (bit 15) and DAZ (bit 6) flags of this thread's MXCSR.
    unsafe {
        use std::arch::x86_64::{_mm_getcsr, _mm_setcsr};
        _mm_setcsr(_mm_getcsr() | 0x8040);
    }
}

/// A loaded model of either kind, scoring (query, segment) pairs: a cross-encoder's logit, or the cosine
/// of a bi-encoder's query and segment embeddings.
// One per loaded model: the variants' sizes do not matter, and boxing one would cost every match a deref.
#[allow(clippy::large_enum_variant)]
pub enum Reranker {
    Cross(CrossEncoder),
    Bi(BiEncoder),
    CoBert(cobert::CoBert),
}

/// What a model directory holds: detected (`auto`: sentence-transformers' `modules.json` means a bi-encoder) or
/// set in configuration.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    #[default]
    Auto,
    CrossEncoder,
    BiEncoder,
}

/// How a model's encoder multiplies: in its dtype, or with int8 linear layers on the CPU (our kernel, one scale per
/// weight row and per activation row, on CPUs with AVX-512 VNNI; candle's Q8_0 blocks elsewhere).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Quantize {
    #[default]
    None,
    Int8,
}

impl Reranker {
    /// Makes the encoders' linear layers int8 (Co-BERT's heads stay as they are: a few small layers).
    pub fn quantize(&mut self) -> Result<(), ModelError> {
        match self {
            Reranker::Cross(m) => m.quantize(),
            Reranker::Bi(m) => m.backbone.quantize(),
            Reranker::CoBert(m) => {
                m.cross.quantize()?;
                m.own.as_mut().map_or(Ok(()), CrossEncoder::quantize)
            }
        }
    }

    /// Loads a directory as the given kind; a decoder reranker reads by `recipe` (else detected).
    pub fn load(
        dir: &Path,
        device: &Device,
        dtype: DType,
        kind: Kind,
        recipe: Option<Recipe>,
    ) -> Result<Reranker, ModelError> {
        let bi = match kind {
            Kind::Auto => dir.join("modules.json").exists(),
            Kind::CrossEncoder => false,
            Kind::BiEncoder => true,
        };
        if recipe.is_some() && bi {
            return Err(load_err(dir, "a recipe is for decoder rerankers, not bi-encoders"));
        }
        if kind == Kind::Auto && dir.join(cobert::CONFIG_FILE).exists() {
            return Ok(Reranker::CoBert(cobert::CoBert::load(dir, device, dtype)?));
        }
        if bi {
            Ok(Reranker::Bi(BiEncoder::load(dir, device, dtype)?))
        } else {
            Ok(Reranker::Cross(CrossEncoder::load(dir, device, dtype, recipe)?))
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Reranker::Cross(_) => "cross-encoder",
            Reranker::Bi(_) => "bi-encoder",
            Reranker::CoBert(_) => "co-bert",
        }
    }

    /// The encoder the model reads its inputs with.
    fn backbone(&self) -> &encoder::Backbone {
        match self {
            Reranker::Cross(m) | Reranker::CoBert(cobert::CoBert { cross: m, .. }) => &m.backbone,
            Reranker::Bi(m) => &m.backbone,
        }
    }

    /// The model's tokenizer.
    fn pieces(&self) -> &Pieces {
        &self.backbone().pieces
    }

    pub fn count_tokens(&self, text: &str) -> Result<usize, ModelError> {
        self.pieces().count(text)
    }

    /// A decoder reranker's recipe (none for the encoders).
    pub fn recipe(&self) -> Option<Recipe> {
        match self {
            Reranker::Cross(m) => m.recipe(),
            Reranker::Bi(_) | Reranker::CoBert(_) => None,
        }
    }

    /// Which tokenizer (with its templates) the model reads with: models with equal ones cut text alike, and
    /// whatever is cut or counted for one may be shared with the others, never with a model of another.
    pub fn tokenizer_fingerprint(&self) -> u64 {
        self.pieces().fingerprint()
    }

    /// The bytes of `text` that hold its first `n` word pieces, as this model's tokenizer cuts them.
    pub fn prefix_bytes(&self, text: &str, n: usize) -> Result<usize, ModelError> {
        self.pieces().prefix_bytes(text, n)
    }

    /// The most word pieces a segment may have so that it is never cut: what is left of the input after the
    /// query budget and the special tokens (cross-encoder), or the input less `[CLS]`/`[SEP]` (bi-encoder).
    pub fn segment_budget(&self, max_length: usize, max_query_tokens: usize) -> usize {
        match self {
            Reranker::Cross(m) | Reranker::CoBert(cobert::CoBert { cross: m, .. }) => {
                m.segment_budget(max_length, max_query_tokens)
            }
            Reranker::Bi(m) => m.layout.max_seq_length.saturating_sub(2),
        }
        .max(1)
    }

    /// The length of `forward`'s outputs.
    pub fn output_width(&self) -> usize {
        match self {
            Reranker::Cross(_) | Reranker::CoBert(cobert::CoBert { own: Some(_), .. }) => 1,
            Reranker::Bi(m) => m.dims(),
            Reranker::CoBert(m) => 1 + m.backbone.hidden_size,
        }
    }

    /// One output per encoded input: `[logit]` (cross-encoder), the embedding (bi-encoder), or the logit
    /// and the `[CLS]` state (Co-BERT with one backbone, whose second round reads the first round's states).
    pub fn forward(&self, batch: &[Encoded]) -> Result<Vec<Vec<f32>>, ModelError> {
        // An output must not depend on what its input was batched with (nor then on whether it was computed
        // now or read from a store): where the encoder's products are not exact across batch shapes (the CPU
        // without BLAS), each input is computed alone, at its own length.
        if batch.len() > 1 && self.backbone().computes_alone() {
            let alone = batch.iter().map(|input| self.forward(std::slice::from_ref(input)));
            return alone.collect::<Result<Vec<_>, _>>().map(|outputs| outputs.into_iter().flatten().collect());
        }
        match self {
            Reranker::Cross(m) | Reranker::CoBert(cobert::CoBert { cross: m, own: Some(_), .. }) => {
                Ok(m.score(batch)?.into_iter().map(|s| vec![s]).collect())
            }
            Reranker::Bi(m) => m.embed(batch),
            Reranker::CoBert(m) => m.cross.outputs_with_states(batch),
        }
    }
}

impl crate::segment::TokenCounter for Reranker {
    fn count(&self, text: &str) -> usize {
        count_or_words(self.count_tokens(text), text)
    }
}

impl crate::segment::TokenCounter for CrossEncoder {
    fn count(&self, text: &str) -> usize {
        count_or_words(self.count_tokens(text), text)
    }
}

impl crate::segment::TokenCounter for TrainableEncoder {
    fn count(&self, text: &str) -> usize {
        count_or_words(self.count_tokens(text), text)
    }
}

/// A tokenizer error on valid UTF-8 would be a bug in the tokenizer file; words are a fair fallback.
fn count_or_words(count: Result<usize, ModelError>, text: &str) -> usize {
    count.unwrap_or_else(|_| text.split_whitespace().count())
}

pub(crate) fn cosine(a: &[f32], b: &[f32]) -> f32 {
    dot(a, b) / (norm(a) * norm(b)).max(1e-12)
}

/// Running sums of the dot product: element i goes to sum i % LANES, and the sums are added pairwise at the
/// end. A fixed order, so the same result on every machine (the dense first stage's cosine is bit for bit
/// `cosine`'s), which the compiler turns into vector adds: one running sum waits on each addition before the
/// next, and took four times as long (BENCHMARKS.md, "The dense first stage at scale").
const LANES: usize = 16;

/// The dot product of the common length of `a` and `b`.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let len = a.len().min(b.len());
    let (a, b) = (&a[..len], &b[..len]);
    let mut sums = [0f32; LANES];
    let (whole_a, whole_b) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (rest_a, rest_b) = (whole_a.remainder(), whole_b.remainder());
    for (x, y) in whole_a.zip(whole_b) {
        for i in 0..LANES {
            sums[i] += x[i] * y[i];
        }
    }
    for (i, (x, y)) in rest_a.iter().zip(rest_b).enumerate() {
        sums[i] += x * y;
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            sums[i] += sums[i + width];
        }
    }
    sums[0]
}

/// A vector's Euclidean length.
pub(crate) fn norm(v: &[f32]) -> f32 {
    dot(v, v).sqrt()
}

#[cfg(test)]
mod tests {
    #[test]
    fn dot_products_sum_lanes_in_one_fixed_order_at_every_length() {
        let mut rng = crate::rng::Rng::new(5);
        for len in [0, 1, 15, 16, 17, 384, 1001] {
            let mut draw = || (0..len).map(|_| rng.normal() as f32).collect::<Vec<f32>>();
            let (a, b) = (draw(), draw());
            let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            let got = super::dot(&a, &b);
            assert!((got as f64 - exact).abs() <= 1e-5 * (1.0 + exact.abs()), "{len}: {got} against {exact}");
            // Only the lengths in common count.
            assert_eq!(super::dot(&a, &b[..len / 2]), super::dot(&a[..len / 2], &b));
            if len == 384 {
                // The order of the sums, pinned: another gives other low bits, and other scores from the same
                // vectors on another build.
                assert_eq!(got.to_bits(), 1086839254, "{got}");
            }
        }
        assert_eq!(super::norm(&[3.0, 4.0]), 5.0);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn flushed_threads_and_the_threads_they_start_zero_subnormals() {
        // On a thread of its own, so that the test harness's threads keep their defaults.
        use std::hint::black_box;
        std::thread::spawn(|| {
            let (tiny, subnormal) = (black_box(1e-30f32), black_box(1e-40f32));
            assert!(black_box(tiny * 1e-10) > 0.0 && black_box(subnormal) * 1e10 > 0.0, "subnormals before");
            super::flush_subnormals();
            assert_eq!(black_box(tiny * 1e-10), 0.0, "subnormal results flushed to zero");
            assert_eq!(black_box(subnormal) * 1e10, 0.0, "subnormal operands read as zero");
            std::thread::spawn(move || assert_eq!(black_box(tiny * 1e-10), 0.0, "inherited by new threads"))
                .join()
                .unwrap();
        })
        .join()
        .unwrap();
    }
}
