//! DeBERTa's disentangled attention: besides content to content (`q · k`), each query reads the relative
//! position of each key (content to position, `q_i · K_pos[δ]`) and each key the relative position of the query
//! (position to content, `k_j · Q_pos[δ]`), where δ is the bucket of the distance `i − j`. The positions'
//! projections depend on the weights alone, so each layer's are computed once at load (`Tables`); a pass then
//! computes, per head, the two `[len, 2 · span]` products of the queries and keys with them, and one kernel adds
//! the terms each score reads to its row before the softmax (`cpu::disentangled`), where transformers
//! (and candle) gather `[batch, heads, len, len]` tensors from them. Arithmetic: transformers'
//! `DisentangledSelfAttention` with `share_att_key` (one projection for contents and positions) and both terms.

use candle_core::Tensor;

use super::cpu::disentangled::{disentangled_softmax, Disentangled};
use super::dropout::{drop_probabilities, DropMask};

/// How distances become rows of the relative embeddings: `make_log_bucket_position` and
/// `build_relative_position` of transformers' DeBERTa-v2, in the same f32 arithmetic.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Buckets {
    /// Rows on each side of distance 0 (`2 · span` in all).
    pub(super) span: usize,
    /// `position_buckets`, where distances beyond half of it share buckets on a log scale.
    pub(super) buckets: Option<usize>,
    /// `max_relative_positions` (or the maximal position where that is not set): where the log scale ends.
    pub(super) max_position: usize,
}

impl Buckets {
    /// The embedding row of each distance `i − j` of `len` positions, at `i − j + len − 1`.
    pub(super) fn rows(&self, len: usize) -> Vec<u32> {
        let len = len as i64;
        let span = self.span as i64;
        (-(len - 1)..len).map(|d| (self.bucket(d) + span).clamp(0, 2 * span - 1) as u32).collect()
    }

    fn bucket(&self, d: i64) -> i64 {
        let Some(buckets) = self.buckets else { return d };
        let mid = buckets as i64 / 2;
        let abs = if d < mid && d > -mid { mid - 1 } else { d.abs() };
        if abs <= mid {
            return d;
        }
        // As torch computes it: f32 throughout, the log's base a Python float made f32.
        let base = ((self.max_position as f64 - 1.0) / mid as f64) as f32;
        let scaled = (abs as f32 / mid as f32).ln() / base.ln() * (mid - 1) as f32;
        (scaled.ceil() + mid as f32) as i64 * d.signum()
    }
}

/// One layer's projections of the relative embeddings, `[heads, 2 · span, head_dim]` each.
pub(super) struct Tables {
    /// Through the query projection, the attention scale folded in as in the queries (position to content).
    queries: Tensor,
    /// Through the key projection (content to position).
    keys: Tensor,
}

impl Tables {
    /// From the layer's query, key and value projection of the (normalized) relative embeddings, `[2 · span, 3h]`
    /// with its bias (queries scaled as the layer scales them).
    pub(super) fn new(projected: &Tensor, heads: usize) -> candle_core::Result<Tables> {
        let (rows, width) = projected.dims2()?;
        let h = width / 3;
        let part = |i| projected.narrow(1, i * h, h)?.reshape((rows, heads, h / heads))?.transpose(0, 1)?.contiguous();
        Ok(Tables { queries: part(0)?, keys: part(1)? })
    }
}

/// Attention's context `[batch, rows, h]` of `q` (`[batch, heads, rows, head_dim]`, scaled; its rows are
/// positions `0..rows`), `k` and `v` (`[batch, heads, len, head_dim]`), under `relative` (the rows of `len`
/// keys' distances, `Buckets::rows`, and the sequences' lengths).
pub(super) fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    tables: &Tables,
    relative: &Disentangled,
    dropout: Option<DropMask>,
) -> candle_core::Result<Tensor> {
    let (batch, heads, rows, head_dim) = q.dims4()?;
    // Each sequence's heads against the same tables (one sequence at a time on the CPU: nothing copied).
    let table = |t: &Tensor| t.unsqueeze(0)?.broadcast_as((batch, heads, t.dim(1)?, head_dim))?.contiguous();
    let to_positions = q.matmul(&table(&tables.keys)?.t()?)?;
    let from_positions = k.matmul(&table(&tables.queries)?.t()?)?;
    let scores = q.matmul(&k.t()?)?;
    let probs = disentangled_softmax(&scores, &to_positions, &from_positions, relative)?;
    let probs = drop_probabilities(dropout, probs, (0, 0))?;
    probs.matmul(v)?.transpose(1, 2)?.contiguous()?.reshape((batch, rows, heads * head_dim))
}

/// The relative embeddings' rows that distances reach: the first `2 · span` of the checkpoint's `rel_embeddings`.
pub(super) fn embedding_rows(embeddings: &Tensor, buckets: &Buckets) -> candle_core::Result<Tensor> {
    let rows = 2 * buckets.span;
    if embeddings.dim(0)? < rows {
        candle_core::bail!("rel_embeddings has {} rows where {rows} are read", embeddings.dim(0)?);
    }
    embeddings.narrow(0, 0, rows)
}

#[cfg(test)]
mod tests {
    use super::Buckets;

    /// DeBERTa-v3-base's buckets (256 over 512 positions) and the test fixture's (16 over 128) against
    /// transformers' `make_log_bucket_position` (values printed by transformers 5.25 on torch 2.15; every distance
    /// within ±9,000 was compared once), and without buckets the distance itself, clamped.
    #[test]
    fn distances_fall_in_transformers_buckets() {
        let v3 = Buckets { span: 256, buckets: Some(256), max_position: 512 };
        let want = [
            (0, 0),
            (1, 1),
            (64, 64),
            (128, 128),
            (129, 129),
            (130, 130),
            (200, 169),
            (257, 192),
            (300, 207),
            (383, 229),
            (384, 229),
            (385, 230),
            (450, 244),
            (509, 255),
            (511, 255),
            (1000, 317),
            (4095, 446),
            (8191, 510),
        ];
        let fixture = Buckets { span: 16, buckets: Some(16), max_position: 128 };
        let fixtures =
            [(9, 9), (10, 9), (17, 10), (33, 12), (47, 13), (63, 14), (64, 14), (65, 14), (100, 15), (127, 15)];
        for (buckets, want) in [(v3, &want[..]), (fixture, &fixtures[..])] {
            for &(d, bucket) in want {
                assert_eq!(buckets.bucket(d), bucket, "{buckets:?}: distance {d}");
                assert_eq!(buckets.bucket(-d), -bucket, "{buckets:?}: distance {}", -d);
            }
        }
        let rows = v3.rows(3);
        assert_eq!(rows, [254, 255, 256, 257, 258]);
        let plain = Buckets { span: 4, buckets: None, max_position: 8 };
        assert_eq!(plain.rows(6), [0, 0, 1, 2, 3, 4, 5, 6, 7, 7, 7]);
    }
}
