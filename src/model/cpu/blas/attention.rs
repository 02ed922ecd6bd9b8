//! Self-attention over a fused QKV projection as one op (inference, and training with its backward pass):
//! per (sequence, head) products read in place from the projection, the softmax in place, no per-head copies;
//! rotary positions and a local window (ModernBERT's) inside the same op.

use std::cell::RefCell;
use std::ops::Range;
use std::sync::Arc;

use candle_core::{CpuStorage, DType, Layout, Shape, Tensor};

use super::threads::{split, written, Shared};
use super::{available_for, operands, Blas};
use crate::model::dropout::DropMask;

/// How a projection's heads attend: how many, the rotary positions their queries and keys take (none: they
/// are in the projection as they attend), and how far each query reads on each side (none: every key).
#[derive(Clone)]
pub struct Heads {
    pub count: usize,
    pub rotary: Option<Arc<Rotary>>,
    pub window: Option<usize>,
}

impl Heads {
    /// `count` heads with neither rotary positions nor a window (BERT's).
    pub fn plain(count: usize) -> Heads {
        Heads { count, rotary: None, window: None }
    }
}

/// Rotary position tables (transformers' "rotate half": the first half of each head's values paired with its
/// second half): cosines and sines `[len, head_dim / 2]`, row-major.
pub struct Rotary {
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
}

impl Rotary {
    /// From the tables `rotary::tables` computes.
    pub fn new(cos: &Tensor, sin: &Tensor) -> candle_core::Result<Rotary> {
        let half = cos.dim(1)?;
        let values = |t: &Tensor| t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>();
        Ok(Rotary { cos: values(cos)?, sin: values(sin)?, half })
    }

    /// Rotates `rows` rows of one head (`2 · half` values each, `from.1` apart) into `to`'s (`to.1` apart) by
    /// their positions' angles, or back (`inverse`, the transpose: a gradient's way).
    ///
    /// # Safety
    /// Both must hold `rows` rows of `2 · half` values at those distances, and the tables `rows` positions.
    unsafe fn rotate(&self, from: (*const f32, usize), rows: usize, to: (*mut f32, usize), inverse: bool) {
        let h = self.half;
        let sign = if inverse { -1.0 } else { 1.0 };
        for p in 0..rows {
            // SAFETY: row p of each holds 2 · half values (the caller's contract); they do not overlap.
            let (x, out) = unsafe {
                (
                    std::slice::from_raw_parts(from.0.add(p * from.1), 2 * h),
                    std::slice::from_raw_parts_mut(to.0.add(p * to.1), 2 * h),
                )
            };
            let (cos, sin) = (&self.cos[p * h..(p + 1) * h], &self.sin[p * h..(p + 1) * h]);
            let ((out1, out2), (x1, x2)) = (out.split_at_mut(h), x.split_at(h));
            // Zipped slices, no indexing: the loop vectorizes (indexed, rotation took 3 % at 2,048 tokens).
            for ((((o1, o2), (a, b)), c), s) in out1.iter_mut().zip(out2).zip(x1.iter().zip(x2)).zip(cos).zip(sin) {
                let s = sign * s;
                *o1 = a * c - b * s;
                *o2 = b * c + a * s;
            }
        }
    }
}

/// Self-attention over a fused QKV projection `[batch, len, 3 · hidden]` (the query rows already scaled by
/// 1/√d): per (sequence, head), scores = q · kᵀ read in place from the projection (leading dimension
/// 3 · hidden; with rotary positions, q and k rotated into a per-thread scratch first), plus the additive
/// `mask` (`[batch, len]`), exponentiated in place, then · v written straight into the context rows
/// `[batch, len, hidden]`, each divided there by its row's sum (head_dim values rather than len). Queries go
/// in blocks, each against the keys it reads (a local layer's window: about len × (block + 2 · window) scores a
/// head, not len × len). No per-head copies and no `[batch, heads, len, len]` tensor: one block's scores per
/// thread. With `differentiable`, the op is on the graph: its backward pass recomputes each block's
/// probabilities rather than keeping them, and writes the three gradients into one `[batch, len, 3 · hidden]`
/// tensor. In inference only each sequence's own positions are computed, with the shapes and sums it would
/// have unpadded: a pair scores the same bits whatever it is batched with; padding rows are zeros.
///
/// `bias` (inference, without rotary positions): the projection's bias `[3 · hidden]`, not yet added to `qkv`,
/// which saves a pass over the projection. Softmax ignores what is constant along a row, so the key bias drops
/// out; the query bias adds `b_q · k_j` to key j's mask value; the value bias adds `b_v` to each context row,
/// whose probabilities sum to 1.
///
/// `first_only` (inference only): only the first position attends, and the context is `[batch, 1, hidden]`
/// (a last layer whose head reads `[CLS]` alone). `dropout` (training): the probabilities that drop, found
/// again by the backward pass. `None` when BLAS is not loaded.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    qkv: &Tensor,
    mask: &Tensor,
    bias: Option<&Tensor>,
    heads: &Heads,
    differentiable: bool,
    first_only: bool,
    dropout: Option<DropMask>,
) -> candle_core::Result<Option<Tensor>> {
    if !available_for(qkv) {
        return Ok(None);
    }
    let (qkv, mask) = (qkv.contiguous()?, mask.contiguous()?);
    let bias = bias.map(|b| b.to_vec1()).transpose()?;
    let op = Attention { heads: heads.clone(), bias, first_only, differentiable, dropout };
    Ok(Some(match (differentiable, &op.bias, first_only, &heads.rotary) {
        (false, Some(_), _, Some(_)) => candle_core::bail!("blas-attention: a separate bias with rotary positions"),
        (false, ..) => qkv.apply_op2_no_bwd(&mask, &op)?,
        (true, None, false, _) => qkv.apply_op2(&mask, op)?,
        (true, ..) => {
            candle_core::bail!("blas-attention: a separate bias or the first position alone has no backward pass")
        }
    }))
}

struct Attention {
    heads: Heads,
    /// The projection's bias when it is not in `qkv` (inference).
    bias: Option<Vec<f32>>,
    /// Only the first position attends (inference).
    first_only: bool,
    /// On the graph: every position computed, padding masked (the backward pass recomputes the same).
    differentiable: bool,
    dropout: Option<DropMask>,
}

/// `kernels::masked_exp_row_fn()`'s row kernel, looked up once per op rather than per head.
type MaskedExpRow = fn(&mut [f32], &[f32]) -> f32;

/// Most scores a block of a global head holds (4 MiB): queries go in blocks of at least `QUERY_BLOCK` rows,
/// as many more as fit, so that BERT's sequences (up to 1,024 positions) are one block.
const BLOCK_SCORES: usize = 1 << 20;

/// Query positions per block of a local head: a block reads at most `QUERY_BLOCK + 2 · window` keys.
const QUERY_BLOCK: usize = 128;

/// Rows of `d` values, `ld` apart.
#[derive(Clone, Copy)]
struct Rows {
    at: *const f32,
    ld: usize,
}

impl Rows {
    /// The rows from `row` on.
    ///
    /// # Safety
    /// Row `row` must lie inside the rows.
    unsafe fn from(self, row: usize) -> *const f32 {
        // SAFETY: the caller's contract.
        unsafe { self.at.add(row * self.ld) }
    }
}

/// One head of one sequence: its queries, keys and values (in the projection, or rotated into scratch), of
/// which the first `queries` attend to the first `len` keys, `d` values each.
#[derive(Clone, Copy)]
struct Head {
    q: Rows,
    k: Rows,
    v: Rows,
    len: usize,
    queries: usize,
    d: usize,
}

/// The blocks of a head's queries (the first `queries` of `len` positions) and the keys each reads.
fn blocks(queries: usize, len: usize, window: Option<usize>) -> impl Iterator<Item = (Range<usize>, Range<usize>)> {
    let rows = match window {
        Some(_) => QUERY_BLOCK,
        None => (BLOCK_SCORES / len.max(1)).max(QUERY_BLOCK),
    };
    (0..queries).step_by(rows).map(move |start| {
        let end = (start + rows).min(queries);
        let keys = match window {
            Some(w) => start.saturating_sub(w)..(end + w).min(len),
            None => 0..len,
        };
        (start..end, keys)
    })
}

/// The most scores one of those blocks holds.
fn block_area(queries: usize, len: usize, window: Option<usize>) -> usize {
    blocks(queries, len, window).map(|(q, k)| q.len() * k.len()).max().unwrap_or(0)
}

/// Query `i`'s keys within a block's `keys`, as offsets into the block: within its window, if any.
fn read(i: usize, keys: &Range<usize>, window: Option<usize>) -> Range<usize> {
    let (lo, hi) = match window {
        Some(w) => (i.saturating_sub(w).max(keys.start), (i + w + 1).min(keys.end)),
        None => (keys.start, keys.end),
    };
    lo - keys.start..hi.max(lo) - keys.start
}

/// A per-thread scratch of at least `len` values, kept between ops: a fresh one per op made the kernel zero
/// new pages on every layer (3 % of ModernBERT's time at 2,048 tokens). Its values are whatever was left.
fn with_scratch<R>(len: usize, work: impl FnOnce(&mut [f32]) -> R) -> R {
    thread_local!(static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) });
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buffer) => {
            if buffer.len() < len {
                buffer.resize(len, 0.0);
            }
            work(&mut buffer[..len])
        }
        // Not reached (no op runs inside another on one thread), but a fresh buffer is correct there too.
        Err(_) => work(&mut vec![0.0; len]),
    })
}

impl Attention {
    /// The shapes of a projection and its mask: (batch, len, hidden, head_dim).
    fn shapes(&self, qkv: &Layout, mask: &Layout) -> candle_core::Result<(usize, usize, usize, usize)> {
        let (batch, len, width) = qkv.shape().dims3()?;
        let heads = self.heads.count;
        let hidden = width / 3;
        let d = hidden / heads.max(1);
        let rotary_fits = self.heads.rotary.as_ref().is_none_or(|r| 2 * r.half == d && r.cos.len() >= len * r.half);
        if width != 3 * hidden || d * heads != hidden || mask.shape().elem_count() != batch * len || !rotary_fits {
            candle_core::bail!("blas-attention: qkv {:?}, mask {:?}, {heads} heads", qkv.shape(), mask.shape());
        }
        Ok((batch, len, hidden, d))
    }

    /// Runs `work(sequence, head, its place in the projection, its mask row)` for every (sequence, head), split
    /// over the threads.
    fn each_head(
        &self,
        blas: &Blas,
        (qkv, mask): (&[f32], &[f32]),
        (batch, len, hidden, d): (usize, usize, usize, usize),
        work: impl Fn(usize, usize, &Head, &[f32]) + Sync,
    ) {
        let (heads, width) = (self.heads.count, 3 * hidden);
        split(batch * heads, blas.threads, |pairs| {
            for pair in pairs {
                let (seq, head) = (pair / heads, pair % heads);
                let base = qkv[seq * len * width..].as_ptr();
                // SAFETY: q, k and v of this head are len rows of d values, `width` apart, inside the sequence's
                // rows.
                let at = unsafe {
                    let rows = |offset| Rows { at: base.add(offset + head * d), ld: width };
                    Head { q: rows(0), k: rows(hidden), v: rows(2 * hidden), len, queries: len, d }
                };
                work(seq, head, &at, &mask[seq * len..(seq + 1) * len]);
            }
        });
    }

    /// `head` with its first `queries` queries and `len` keys rotated into `q` and `k` (packed rows), when the
    /// heads take rotary positions.
    ///
    /// # Safety
    /// `head` must point into a projection of its shapes.
    unsafe fn rotated(&self, head: Head, q: &mut [f32], k: &mut [f32]) -> Head {
        let Some(rotary) = &self.heads.rotary else { return head };
        // SAFETY: the head's rows lie in the projection (the caller's contract); the tables cover `len`
        // positions (`shapes`).
        unsafe {
            rotary.rotate((head.q.at, head.q.ld), head.queries, (q.as_mut_ptr(), head.d), false);
            rotary.rotate((head.k.at, head.k.ld), head.len, (k.as_mut_ptr(), head.d), false);
        }
        let packed = |rows: &[f32]| Rows { at: rows.as_ptr(), ld: head.d };
        Head { q: packed(q), k: packed(k), ..head }
    }
}

impl Blas {
    /// A block's probabilities, unnormalized, into `scores` (`queries × keys`, 0 at the keys a query does not
    /// read) and each row's sum into `sums`.
    ///
    /// # Safety
    /// `head` must point into a projection of its shapes, the block lie inside it.
    #[allow(clippy::too_many_arguments)]
    unsafe fn block_scores(
        &self,
        head: &Head,
        (queries, keys): (&Range<usize>, &Range<usize>),
        window: Option<usize>,
        mask: &[f32],
        scores: &mut [f32],
        sums: &mut [f32],
        masked_exp_row: MaskedExpRow,
    ) {
        let (rows, cols) = (queries.len(), keys.len());
        // SAFETY: the block's query and key rows lie in the head (the caller's contract); `scores` holds
        // rows × cols.
        unsafe {
            let (q, k) = ((head.q.from(queries.start), head.q.ld, false), (head.k.from(keys.start), head.k.ld, true));
            self.block((rows, cols, head.d), q, k, (scores.as_mut_ptr(), cols));
        }
        for (t, (row, sum)) in scores[..rows * cols].chunks_exact_mut(cols).zip(sums).enumerate() {
            let read = read(queries.start + t, keys, window);
            let at = keys.start + read.start..keys.start + read.end;
            *sum = masked_exp_row(&mut row[read.clone()], &mask[at]);
            row[..read.start].fill(0.0);
            row[read.end..].fill(0.0);
        }
    }
}

impl candle_core::CustomOp2 for Attention {
    fn name(&self) -> &'static str {
        "blas-attention"
    }

    fn cpu_fwd(
        &self,
        qkv: &CpuStorage,
        qkv_layout: &Layout,
        mask: &CpuStorage,
        mask_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (blas, qkv, mask) = operands(self.name(), (qkv, qkv_layout), (mask, mask_layout))?;
        let shapes @ (batch, len, hidden, d) = self.shapes(qkv_layout, mask_layout)?;
        let masked_exp_row = crate::model::cpu::kernels::masked_exp_row_fn();
        let out_len = if self.first_only { len.min(1) } else { len };
        let window = self.heads.window;
        let out = written(batch * out_len * hidden, |c| {
            let c = Shared(c);
            self.each_head(blas, (qkv, mask), shapes, |seq, head, at, mask| {
                // In inference a sequence's own positions alone (padding is where the mask is not 0).
                let n = match self.differentiable {
                    true => len,
                    false => mask.iter().position(|m| *m != 0.0).unwrap_or(len),
                };
                let queries = n.min(out_len);
                let area = block_area(queries, n, window);
                with_scratch(area + 2 * n + 2 * n * d, |buffer| {
                    let (scores, rest) = buffer.split_at_mut(area);
                    let (sums, rest) = rest.split_at_mut(n);
                    let (shifted, rest) = rest.split_at_mut(n);
                    let (q, k) = rest.split_at_mut(n * d);
                    // SAFETY: the head lies in the projection, rotated into this thread's scratch; the context
                    // block is out_len rows of d values, `hidden` apart, written by this (sequence, head) alone:
                    // its first `queries` rows by the products, the rest here.
                    unsafe {
                        let at = self.rotated(Head { len: n, queries, ..*at }, q, k);
                        let (mask, value_bias) = match &self.bias {
                            Some(bias) => {
                                let query_bias = &bias[head * d..(head + 1) * d];
                                for (j, (shifted, m)) in shifted.iter_mut().zip(mask).enumerate() {
                                    let key = std::slice::from_raw_parts(at.k.from(j), d);
                                    *shifted = m + key.iter().zip(query_bias).map(|(k, b)| k * b).sum::<f32>();
                                }
                                (&*shifted, Some(&bias[2 * hidden + head * d..2 * hidden + (head + 1) * d]))
                            }
                            None => (&mask[..n], None),
                        };
                        let context = c.ptr().add(seq * out_len * hidden + head * d);
                        for (rows, keys) in blocks(queries, n, window) {
                            let scores = &mut scores[..rows.len() * keys.len()];
                            let sums = &mut sums[..rows.len()];
                            blas.block_scores(&at, (&rows, &keys), window, mask, scores, sums, masked_exp_row);
                            // Dropped after the sums: softmax, then dropout.
                            if let Some(dropout) = &self.dropout {
                                dropout.apply_block((seq, head), (rows.start, keys.start), scores, keys.len());
                            }
                            let out = context.add(rows.start * hidden);
                            let v = (at.v.from(keys.start), at.v.ld, false);
                            blas.block(
                                (rows.len(), d, keys.len()),
                                (scores.as_ptr(), keys.len(), false),
                                v,
                                (out, hidden),
                            );
                            for (i, sum) in sums.iter().enumerate() {
                                let row = std::slice::from_raw_parts_mut(out.add(i * hidden), d);
                                match value_bias {
                                    Some(b) => row.iter_mut().zip(b).for_each(|(x, b)| *x = *x / sum + b),
                                    None => row.iter_mut().for_each(|x| *x /= sum),
                                }
                            }
                        }
                        for i in queries..out_len {
                            std::slice::from_raw_parts_mut(context.add(i * hidden), d).fill(0.0);
                        }
                    }
                });
            });
        });
        Ok((CpuStorage::F32(out), Shape::from((batch, out_len, hidden))))
    }

    fn bwd(
        &self,
        qkv: &Tensor,
        mask: &Tensor,
        _: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let backward = AttentionBackward { heads: self.heads.clone(), dropout: self.dropout };
        let dqkv = qkv.apply_op3_no_bwd(mask, &grad.contiguous()?, &backward)?;
        Ok((Some(dqkv), None))
    }
}

/// The gradient of `Attention` with respect to its projection: per block, with P the probabilities and dC the
/// context's gradient, dV += Pᵀ · dC, dS = P ⊙ (dC · vᵀ − rowsum(dC · vᵀ ⊙ P)), dQ = dS · K, dK += dSᵀ · Q
/// (blocks of a local head share keys); with rotary positions, dQ and dK rotated back. With dropout's factors
/// M, the context read P ⊙ M: dV += (P ⊙ M)ᵀ · dC, and dC · vᵀ ⊙ M takes the place of dC · vᵀ.
struct AttentionBackward {
    heads: Heads,
    dropout: Option<DropMask>,
}

impl candle_core::CustomOp3 for AttentionBackward {
    fn name(&self) -> &'static str {
        "blas-attention-backward"
    }

    fn cpu_fwd(
        &self,
        qkv: &CpuStorage,
        qkv_layout: &Layout,
        mask: &CpuStorage,
        mask_layout: &Layout,
        grad: &CpuStorage,
        grad_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let attention = Attention {
            heads: self.heads.clone(),
            bias: None,
            first_only: false,
            differentiable: true,
            dropout: self.dropout,
        };
        let (blas, qkv, mask) = operands(self.name(), (qkv, qkv_layout), (mask, mask_layout))?;
        let shapes @ (batch, len, hidden, d) = attention.shapes(qkv_layout, mask_layout)?;
        let grad = match (grad, grad_layout.contiguous_offsets()) {
            (CpuStorage::F32(g), Some((start, end))) if end - start == batch * len * hidden => &g[start..end],
            _ => candle_core::bail!("{}: the gradient must be a contiguous [batch, len, hidden]", self.name()),
        };
        let (width, window) = (3 * hidden, self.heads.window);
        let rotary = self.heads.rotary.as_deref();
        let (softmax_grad_row, masked_exp_row) =
            (crate::model::cpu::kernels::softmax_grad_row_fn(), crate::model::cpu::kernels::masked_exp_row_fn());
        let area = block_area(len, len, window);
        let out = written(batch * len * width, |dqkv| {
            let dqkv = Shared(dqkv);
            attention.each_head(blas, (qkv, mask), shapes, |seq, head, at, mask| {
                with_scratch(2 * area + len + 4 * len * d, |buffer| {
                    let (probs, rest) = buffer.split_at_mut(area);
                    let (dp, rest) = rest.split_at_mut(area);
                    let (sums, rest) = rest.split_at_mut(len);
                    let (q, rest) = rest.split_at_mut(len * d);
                    let (k, rest) = rest.split_at_mut(len * d);
                    let (dq_rotated, dk_rotated) = rest.split_at_mut(len * d);
                    // SAFETY: dC of this head is len rows of d values, `hidden` apart; its three gradient blocks
                    // are len rows of d values, `width` apart, written by this (sequence, head) alone (dQ and dK
                    // through packed scratch rows first with rotary positions).
                    unsafe {
                        let at = attention.rotated(*at, q, k);
                        let dc = grad.as_ptr().add(seq * len * hidden + head * d);
                        let out = dqkv.ptr().add(seq * len * width + head * d);
                        let (dq, dk, dv) = match rotary {
                            Some(_) => (
                                (dq_rotated.as_mut_ptr(), d),
                                (dk_rotated.as_mut_ptr(), d),
                                (out.add(2 * hidden), width),
                            ),
                            None => ((out, width), (out.add(hidden), width), (out.add(2 * hidden), width)),
                        };
                        // dK and dV gather from every block that reads a key.
                        for row in 0..len {
                            std::slice::from_raw_parts_mut(dk.0.add(row * dk.1), d).fill(0.0);
                            std::slice::from_raw_parts_mut(dv.0.add(row * dv.1), d).fill(0.0);
                        }
                        for (rows, keys) in blocks(len, len, window) {
                            let (r, n) = (rows.len(), keys.len());
                            let (probs, dp, sums) = (&mut probs[..r * n], &mut dp[..r * n], &mut sums[..r]);
                            blas.block_scores(&at, (&rows, &keys), window, mask, probs, sums, masked_exp_row);
                            for (row, sum) in probs.chunks_exact_mut(n).zip(sums.iter()) {
                                row.iter_mut().for_each(|p| *p /= sum);
                            }
                            let dc = (dc.add(rows.start * hidden), hidden, false);
                            // What the context read: P, or P ⊙ M (in dP's place until dP is computed).
                            let read = match &self.dropout {
                                Some(dropout) => {
                                    dp.copy_from_slice(probs);
                                    dropout.apply_block((seq, head), (rows.start, keys.start), dp, n);
                                    dp.as_ptr()
                                }
                                None => probs.as_ptr(),
                            };
                            let v = at.v.from(keys.start);
                            blas.block_into((n, d, r), (read, n, true), dc, (dv.0.add(keys.start * dv.1), dv.1), true);
                            blas.block((r, n, d), dc, (v, at.v.ld, true), (dp.as_mut_ptr(), n));
                            if let Some(dropout) = &self.dropout {
                                dropout.apply_block((seq, head), (rows.start, keys.start), dp, n);
                            }
                            for (p_row, dp_row) in probs.chunks_exact(n).zip(dp.chunks_exact_mut(n)) {
                                softmax_grad_row(p_row, dp_row);
                            }
                            let ds = dp.as_ptr();
                            let (k_rows, q_rows) = (at.k.from(keys.start), at.q.from(rows.start));
                            blas.block(
                                (r, d, n),
                                (ds, n, false),
                                (k_rows, at.k.ld, false),
                                (dq.0.add(rows.start * dq.1), dq.1),
                            );
                            let dk_rows = (dk.0.add(keys.start * dk.1), dk.1);
                            blas.block_into((n, d, r), (ds, n, true), (q_rows, at.q.ld, false), dk_rows, true);
                        }
                        if let Some(rotary) = rotary {
                            rotary.rotate((dq.0, d), len, (out, width), true);
                            rotary.rotate((dk.0, d), len, (out.add(hidden), width), true);
                        }
                    }
                });
            });
        });
        Ok((CpuStorage::F32(out), Shape::from((batch, len, width))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    #[test]
    fn fused_attention_equals_the_plain_chain() {
        let device = Device::Cpu;
        if !available_for(&Tensor::zeros(1, DType::F32, &device).unwrap()) {
            return; // LONGRANK_BLAS=off
        }
        // Fused attention against the plain chain, per head softmax(q · kᵀ + mask) · v: the values, in
        // inference and on the graph, and the projection's gradient.
        let (batch, len, heads, d) = (2, 5, 3, 4);
        let hidden = heads * d;
        let qkv = candle_core::Var::randn(0f32, 1.0, (batch, len, 3 * hidden), &device).unwrap();
        let mask = Tensor::new(&[[0f32, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, f32::MIN, f32::MIN]], &device).unwrap();
        let direction = Tensor::randn(0f32, 1.0, (batch, len, hidden), &device).unwrap();
        let run = |y: Tensor| {
            let grads = (y.clone() * &direction).unwrap().sum_all().unwrap().backward().unwrap();
            [y, grads.get(qkv.as_tensor()).unwrap().clone()]
        };
        // The chain's probabilities times `factors` (dropout's), if any.
        let chain_dropped = |qkv: &Tensor, factors: Option<&Tensor>| {
            let split = qkv.reshape((batch, len, 3, heads, d)).unwrap().permute((2, 0, 3, 1, 4)).unwrap();
            let part = |i: usize| split.get(i).unwrap().contiguous().unwrap();
            let scores = part(0).matmul(&part(1).t().unwrap()).unwrap();
            let scores = scores.broadcast_add(&mask.reshape((batch, 1, 1, len)).unwrap()).unwrap();
            let probs = candle_nn::ops::softmax(&scores, candle_core::D::Minus1).unwrap();
            let probs = factors.map_or(probs.clone(), |f| (probs * f).unwrap());
            probs.matmul(&part(2)).unwrap().transpose(1, 2).unwrap().reshape((batch, len, hidden)).unwrap()
        };
        let chain = |qkv: &Tensor| chain_dropped(qkv, None);
        let want = run(chain(qkv.as_tensor()));
        let inference =
            attention(qkv.as_tensor(), &mask, None, &Heads::plain(heads), false, false, None).unwrap().unwrap();
        let got =
            run(attention(qkv.as_tensor(), &mask, None, &Heads::plain(heads), true, false, None).unwrap().unwrap());
        // Dropout on the graph: the probabilities of the same places dropped, the gradient through them.
        let dropout = DropMask::new(0.3, 11);
        let factors = dropout.factors((batch, heads), 0..len, 0..len);
        let factors = Tensor::from_vec(factors, (batch, heads, len, len), &device).unwrap();
        let want_dropped = run(chain_dropped(qkv.as_tensor(), Some(&factors)));
        let dropped = attention(qkv.as_tensor(), &mask, None, &Heads::plain(heads), true, false, Some(dropout));
        let dropped = run(dropped.unwrap().unwrap());
        // Inference computes a sequence's own positions only: its padding rows (which nothing reads) are zeros.
        // The projection's bias passed apart (inference): as the chain on the biased projection.
        let bias = Tensor::randn(0f32, 1.0, 3 * hidden, &device).unwrap();
        let biased =
            attention(qkv.as_tensor(), &mask, Some(&bias), &Heads::plain(heads), false, false, None).unwrap().unwrap();
        let real = mask.eq(0f32).unwrap().to_dtype(DType::F32).unwrap().unsqueeze(2).unwrap();
        let want_biased = chain(&qkv.broadcast_add(&bias).unwrap()).broadcast_mul(&real).unwrap();
        // The first position alone attending: the first row of each sequence's context.
        let first =
            attention(qkv.as_tensor(), &mask, Some(&bias), &Heads::plain(heads), false, true, None).unwrap().unwrap();
        assert_eq!(first.dims(), [batch, 1, hidden]);
        let want_first = want_biased.narrow(1, 0, 1).unwrap();
        let want_inference = want[0].broadcast_mul(&real).unwrap();
        let pairs = [
            ("inference", &inference, &want_inference),
            ("graph", &got[0], &want[0]),
            ("gradient", &got[1], &want[1]),
            ("bias apart", &biased, &want_biased),
            ("first position", &first, &want_first),
            ("dropped", &dropped[0], &want_dropped[0]),
            ("dropped gradient", &dropped[1], &want_dropped[1]),
        ];
        assert!((&dropped[0] - &got[0]).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap() > 1e-3);
        for (what, got, want) in pairs {
            let worst = (got - want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(worst < 1e-5, "{what}: {worst}");
        }
    }

    #[test]
    fn rotary_positions_and_a_window_equal_the_plain_chain_across_blocks() {
        let device = Device::Cpu;
        if !available_for(&Tensor::zeros(1, DType::F32, &device).unwrap()) {
            return; // LONGRANK_BLAS=off
        }
        // ModernBERT's attention: queries and keys rotated ("rotate half"), each query reading the keys at most
        // `window` away, against the plain chain; 300 positions make three query blocks whose keys overlap, the
        // second sequence (250 real) ends inside the last but one. Values in inference (padding rows zero) and
        // on the graph, and the projection's gradient; then every key read (no window).
        let (batch, len, heads, d, window) = (2, 300, 2, 8, 20);
        let hidden = heads * d;
        let random = crate::model::cpu::kernels::tests::random;
        let qkv = candle_core::Var::from_tensor(&random(&[batch, len, 3 * hidden], 11, 1.0)).unwrap();
        let lengths = [len, 250];
        let rows: Vec<f32> =
            lengths.iter().flat_map(|n| (0..len).map(move |i| if i < *n { 0.0 } else { f32::MIN })).collect();
        let mask = Tensor::from_vec(rows, (batch, len), &device).unwrap();
        let (cos, sin) = crate::model::rotary::tables(d, 160.0, len, DType::F32, &device).unwrap();
        let rotary = Some(Arc::new(Rotary::new(&cos, &sin).unwrap()));
        let direction = random(&[batch, len, hidden], 12, 1.0);
        let real = mask.eq(0f32).unwrap().to_dtype(DType::F32).unwrap().unsqueeze(2).unwrap();
        let run = |y: Tensor| {
            let grads = (y.broadcast_mul(&real).unwrap() * &direction).unwrap().sum_all().unwrap().backward().unwrap();
            [y.broadcast_mul(&real).unwrap(), grads.get(qkv.as_tensor()).unwrap().clone()]
        };
        let rotate = |x: Tensor| {
            let (x1, x2) = (x.narrow(3, 0, d / 2).unwrap(), x.narrow(3, d / 2, d / 2).unwrap());
            let half = Tensor::cat(&[&x2.neg().unwrap(), &x1], 3).unwrap();
            let (cos, sin) = (Tensor::cat(&[&cos, &cos], 1).unwrap(), Tensor::cat(&[&sin, &sin], 1).unwrap());
            (x.broadcast_mul(&cos).unwrap() + half.broadcast_mul(&sin).unwrap()).unwrap()
        };
        let chain = |window: Option<usize>, factors: Option<&Tensor>| {
            let split = qkv.reshape((batch, len, 3, heads, d)).unwrap().permute((2, 0, 3, 1, 4)).unwrap();
            let part = |i: usize| split.get(i).unwrap().contiguous().unwrap();
            let scores = rotate(part(0)).matmul(&rotate(part(1)).t().unwrap()).unwrap();
            let band: Vec<f32> = (0..len * len)
                .map(|ij| match window {
                    Some(w) if (ij / len).abs_diff(ij % len) > w => -1e30,
                    _ => 0.0,
                })
                .collect();
            let band = Tensor::from_vec(band, (1, 1, len, len), &device).unwrap();
            let scores = scores.broadcast_add(&mask.reshape((batch, 1, 1, len)).unwrap()).unwrap();
            let probs = candle_nn::ops::softmax(&scores.broadcast_add(&band).unwrap(), candle_core::D::Minus1).unwrap();
            let probs = factors.map_or(probs.clone(), |f| (probs * f).unwrap());
            probs.matmul(&part(2)).unwrap().transpose(1, 2).unwrap().reshape((batch, len, hidden)).unwrap()
        };
        // With dropout too (each block's keys from their own first key on): the chain's probabilities times
        // the factors of the same places.
        let dropout = DropMask::new(0.2, 5);
        let factors = dropout.factors((batch, heads), 0..len, 0..len);
        let factors = Tensor::from_vec(factors, (batch, heads, len, len), &device).unwrap();
        for (window, dropout) in [(Some(window), None), (None, None), (Some(window), Some(dropout))] {
            let heads = Heads { count: heads, rotary: rotary.clone(), window };
            let want = run(chain(window, dropout.map(|_| &factors)));
            let got = run(attention(qkv.as_tensor(), &mask, None, &heads, true, false, dropout).unwrap().unwrap());
            let mut pairs = vec![("graph", &got[0], &want[0]), ("gradient", &got[1], &want[1])];
            let inference;
            if dropout.is_none() {
                inference = attention(qkv.as_tensor(), &mask, None, &heads, false, false, None).unwrap().unwrap();
                pairs.push(("inference", &inference, &want[0]));
            }
            for (what, got, want) in pairs {
                // Relative to the largest value: a gradient sums over up to 300 keys (one CI run met 1.4e-5
                // absolute on unseeded values of about 10).
                let max = |t: &Tensor| t.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
                let worst = max(&(got - want).unwrap()) / max(want).max(1.0);
                assert!(worst < 1e-5, "{what}, window {window:?}, dropout {dropout:?}: {worst}");
            }
        }
    }

    #[test]
    fn blocks_cover_every_query_once_with_the_keys_it_reads() {
        for (queries, len, window) in [(300, 300, Some(20)), (1, 300, Some(20)), (5000, 5000, None), (0, 0, None)] {
            let mut next = 0;
            for (rows, keys) in blocks(queries, len, window) {
                assert_eq!(rows.start, next);
                next = rows.end;
                for i in rows {
                    let read = read(i, &keys, window);
                    let want = match window {
                        Some(w) => i.saturating_sub(w)..(i + w + 1).min(len),
                        None => 0..len,
                    };
                    assert_eq!(keys.start + read.start..keys.start + read.end, want, "query {i}");
                }
            }
            assert_eq!(next, queries);
        }
        // A global head's blocks hold at most BLOCK_SCORES scores, and BERT's lengths are one block.
        assert_eq!(blocks(1024, 1024, None).count(), 1);
        assert!(block_area(5000, 5000, None) <= BLOCK_SCORES);
    }
}
