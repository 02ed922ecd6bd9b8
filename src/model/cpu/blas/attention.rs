//! Self-attention over a fused QKV projection as one op (inference, and training with its backward pass):
//! per (sequence, head) products read in place from the projection, the softmax in place, no per-head copies.

use candle_core::{CpuStorage, Layout, Shape, Tensor};

use super::threads::{split, written, Shared};
use super::{available_for, operands, Blas};

/// Self-attention over a fused QKV projection `[batch, len, 3 · hidden]` (the query rows already scaled by
/// 1/√d): per (sequence, head), scores = q · kᵀ read in place from the projection (leading dimension
/// 3 · hidden), plus the additive `mask` (`[batch, len]`), exponentiated in place, then · v written straight into
/// the context rows `[batch, len, hidden]`, each divided there by its row's sum (head_dim values rather than
/// len). No per-head copies and no `[batch, heads, len, len]` tensor: one `len × len` scratch per thread.
/// With `differentiable`, the op is on the graph: its backward pass recomputes each head's probabilities
/// rather than keeping them, and writes the three gradients into one `[batch, len, 3 · hidden]` tensor.
///
/// `bias` (inference only): the projection's bias `[3 · hidden]`, not yet added to `qkv`, which saves a pass
/// over the projection. Softmax ignores what is constant along a row, so the key bias drops out; the query
/// bias adds `b_q · k_j` to key j's mask value; the value bias adds `b_v` to each context row, whose
/// probabilities sum to 1.
///
/// `first_only` (inference only): only the first position attends, and the context is `[batch, 1, hidden]`
/// (a last layer whose head reads `[CLS]` alone). `None` when BLAS is not loaded.
pub fn attention(
    qkv: &Tensor,
    mask: &Tensor,
    bias: Option<&Tensor>,
    heads: usize,
    differentiable: bool,
    first_only: bool,
) -> candle_core::Result<Option<Tensor>> {
    if !available_for(qkv) {
        return Ok(None);
    }
    let (qkv, mask) = (qkv.contiguous()?, mask.contiguous()?);
    let op = Attention { heads, bias: bias.map(|b| b.to_vec1()).transpose()?, first_only };
    Ok(Some(match (differentiable, &op.bias, first_only) {
        (false, ..) => qkv.apply_op2_no_bwd(&mask, &op)?,
        (true, None, false) => qkv.apply_op2(&mask, op)?,
        (true, ..) => {
            candle_core::bail!("blas-attention: a separate bias or the first position alone has no backward pass")
        }
    }))
}

struct Attention {
    heads: usize,
    /// The projection's bias when it is not in `qkv` (inference).
    bias: Option<Vec<f32>>,
    /// Only the first position attends (inference).
    first_only: bool,
}

/// `kernels::masked_exp_row_fn()`'s row kernel, looked up once per op rather than per head.
type MaskedExpRow = fn(&mut [f32], &[f32]) -> f32;

/// One head of one sequence inside a QKV projection: q, k and v are `len` rows of `d` values, `width` apart, of
/// which the first `queries` attend.
#[derive(Clone, Copy)]
struct Head {
    q: *const f32,
    k: *const f32,
    v: *const f32,
    len: usize,
    queries: usize,
    d: usize,
    width: usize,
}

impl Attention {
    /// The shapes of a projection and its mask: (batch, len, hidden, head_dim).
    fn shapes(&self, qkv: &Layout, mask: &Layout) -> candle_core::Result<(usize, usize, usize, usize)> {
        let (batch, len, width) = qkv.shape().dims3()?;
        let hidden = width / 3;
        let d = hidden / self.heads.max(1);
        if width != 3 * hidden || d * self.heads != hidden || mask.shape().elem_count() != batch * len {
            candle_core::bail!("blas-attention: qkv {:?}, mask {:?}, {} heads", qkv.shape(), mask.shape(), self.heads);
        }
        Ok((batch, len, hidden, d))
    }

    /// Runs `work(head, its mask row, scratch)` for every (sequence, head), split over the threads; the
    /// scratch holds `scratch` values per thread.
    fn each_head(
        &self,
        blas: &Blas,
        (qkv, mask): (&[f32], &[f32]),
        (batch, len, hidden, d): (usize, usize, usize, usize),
        scratch: usize,
        work: impl Fn(usize, usize, &Head, &[f32], &mut [f32]) + Sync,
    ) {
        let width = 3 * hidden;
        split(batch * self.heads, blas.threads, |pairs| {
            let mut buffer = vec![0f32; scratch];
            for pair in pairs {
                let (seq, head) = (pair / self.heads, pair % self.heads);
                let base = qkv[seq * len * width..].as_ptr();
                // SAFETY: q, k and v of this head are len rows of d values, `width` apart, inside the sequence's
                // rows.
                let at = unsafe {
                    Head {
                        q: base.add(head * d),
                        k: base.add(hidden + head * d),
                        v: base.add(2 * hidden + head * d),
                        len,
                        queries: len,
                        d,
                        width,
                    }
                };
                work(seq, head, &at, &mask[seq * len..(seq + 1) * len], &mut buffer);
            }
        });
    }
}

impl Blas {
    /// A head's probabilities, unnormalized, into `scores` (`queries × len`) and each row's sum into `sums`.
    ///
    /// # Safety
    /// `head` must point into a projection of its shapes.
    unsafe fn head_scores(
        &self,
        head: &Head,
        mask: &[f32],
        scores: &mut [f32],
        sums: &mut [f32],
        masked_exp_row: MaskedExpRow,
    ) {
        // SAFETY: `head` points into a projection of its shapes (the caller's contract), `scores` holds its `queries ×
        // len`.
        unsafe {
            let (l, d, w) = (head.len, head.d, head.width);
            self.block((head.queries, l, d), (head.q, w, false), (head.k, w, true), (scores.as_mut_ptr(), l));
            for (row, sum) in scores[..head.queries * l].chunks_exact_mut(l).zip(sums) {
                *sum = masked_exp_row(row, mask);
            }
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
        let out = written(batch * out_len * hidden, |c| {
            let c = Shared(c);
            self.each_head(blas, (qkv, mask), shapes, len * len + 2 * len, |seq, head, at, mask, buffer| {
                // In inference only the sequence's own positions are computed, with the shapes and sums it would
                // have unpadded: a pair scores the same bits whatever it is batched with. Padding positions
                // (which no real one attends to) get zeros.
                let n = if self.bias.is_some() { mask.iter().position(|m| *m != 0.0).unwrap_or(len) } else { len };
                let queries = n.min(out_len);
                let (scores, rest) = buffer.split_at_mut(len * len);
                let (sums, shifted) = rest.split_at_mut(len);
                let (mask, value_bias) = match &self.bias {
                    Some(bias) => {
                        let query_bias = &bias[head * d..(head + 1) * d];
                        for (j, (shifted, m)) in shifted.iter_mut().zip(mask).enumerate() {
                            // SAFETY: key j of this head is d values inside the projection.
                            let key = unsafe { std::slice::from_raw_parts(at.k.add(j * at.width), d) };
                            *shifted = m + key.iter().zip(query_bias).map(|(k, b)| k * b).sum::<f32>();
                        }
                        (&*shifted, Some(&bias[2 * hidden + head * d..2 * hidden + (head + 1) * d]))
                    }
                    None => (mask, None),
                };
                let at = Head { len: n, queries, ..*at };
                let (scores, sums) = (&mut scores[..queries * n], &mut sums[..queries]);
                // SAFETY: the context block is out_len rows of d values, `hidden` apart, written by this
                // (sequence, head) alone: its first `queries` rows by the product, the rest here.
                unsafe {
                    blas.head_scores(&at, &mask[..n], scores, sums, masked_exp_row);
                    let context = c.ptr().add(seq * out_len * hidden + head * d);
                    blas.block(
                        (queries, d, n),
                        (scores.as_ptr(), n, false),
                        (at.v, at.width, false),
                        (context, hidden),
                    );
                    for (i, sum) in sums.iter().enumerate() {
                        let row = std::slice::from_raw_parts_mut(context.add(i * hidden), d);
                        match value_bias {
                            Some(b) => row.iter_mut().zip(b).for_each(|(x, b)| *x = *x / sum + b),
                            None => row.iter_mut().for_each(|x| *x /= sum),
                        }
                    }
                    for i in queries..out_len {
                        std::slice::from_raw_parts_mut(context.add(i * hidden), d).fill(0.0);
                    }
                }
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
        let dqkv = qkv.apply_op3_no_bwd(mask, &grad.contiguous()?, &AttentionBackward { heads: self.heads })?;
        Ok((Some(dqkv), None))
    }
}

/// The gradient of `Attention` with respect to its projection: per head, with P the probabilities and dC the
/// context's gradient, dV = Pᵀ · dC, dS = P ⊙ (dC · vᵀ − rowsum(dC · vᵀ ⊙ P)), dQ = dS · K, dK = dSᵀ · Q.
struct AttentionBackward {
    heads: usize,
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
        let attention = Attention { heads: self.heads, bias: None, first_only: false };
        let (blas, qkv, mask) = operands(self.name(), (qkv, qkv_layout), (mask, mask_layout))?;
        let shapes @ (batch, len, hidden, d) = attention.shapes(qkv_layout, mask_layout)?;
        let grad = match (grad, grad_layout.contiguous_offsets()) {
            (CpuStorage::F32(g), Some((start, end))) if end - start == batch * len * hidden => &g[start..end],
            _ => candle_core::bail!("{}: the gradient must be a contiguous [batch, len, hidden]", self.name()),
        };
        let width = 3 * hidden;
        let (softmax_grad_row, masked_exp_row) =
            (crate::model::cpu::kernels::softmax_grad_row_fn(), crate::model::cpu::kernels::masked_exp_row_fn());
        let out = written(batch * len * width, |dqkv| {
            let dqkv = Shared(dqkv);
            let scratch = 2 * len * len + len;
            attention.each_head(blas, (qkv, mask), shapes, scratch, |seq, head, at, mask, buffer| {
                let (probs, rest) = buffer.split_at_mut(len * len);
                let (dp, sums) = rest.split_at_mut(len * len);
                // SAFETY: dC of this head is len rows of d values, `hidden` apart; its three gradient blocks are
                // len rows of d values, `width` apart, written by this (sequence, head) alone.
                unsafe {
                    blas.head_scores(at, mask, probs, sums, masked_exp_row);
                    for (row, sum) in probs.chunks_exact_mut(len).zip(sums.iter()) {
                        row.iter_mut().for_each(|p| *p /= sum);
                    }
                    let dc = grad.as_ptr().add(seq * len * hidden + head * d);
                    let out = dqkv.ptr().add(seq * len * width + head * d);
                    let (dq, dk, dv) = (out, out.add(hidden), out.add(2 * hidden));
                    let p = probs.as_ptr();
                    blas.block((len, d, len), (p, len, true), (dc, hidden, false), (dv, width));
                    blas.block((len, len, d), (dc, hidden, false), (at.v, width, true), (dp.as_mut_ptr(), len));
                    for (p_row, dp_row) in probs.chunks_exact(len).zip(dp.chunks_exact_mut(len)) {
                        softmax_grad_row(p_row, dp_row);
                    }
                    let ds = dp.as_ptr();
                    blas.block((len, d, len), (ds, len, false), (at.k, width, false), (dq, width));
                    blas.block((len, d, len), (ds, len, true), (at.q, width, false), (dk, width));
                }
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
        let chain = |qkv: &Tensor| {
            let split = qkv.reshape((batch, len, 3, heads, d)).unwrap().permute((2, 0, 3, 1, 4)).unwrap();
            let part = |i: usize| split.get(i).unwrap().contiguous().unwrap();
            let scores = part(0).matmul(&part(1).t().unwrap()).unwrap();
            let scores = scores.broadcast_add(&mask.reshape((batch, 1, 1, len)).unwrap()).unwrap();
            let probs = candle_nn::ops::softmax(&scores, candle_core::D::Minus1).unwrap();
            probs.matmul(&part(2)).unwrap().transpose(1, 2).unwrap().reshape((batch, len, hidden)).unwrap()
        };
        let want = run(chain(qkv.as_tensor()));
        let inference = attention(qkv.as_tensor(), &mask, None, heads, false, false).unwrap().unwrap();
        let got = run(attention(qkv.as_tensor(), &mask, None, heads, true, false).unwrap().unwrap());
        // The projection's bias passed apart (inference): as the chain on the biased projection.
        // Inference computes a sequence's own positions only: its padding rows (which nothing reads) are zeros.
        let bias = Tensor::randn(0f32, 1.0, 3 * hidden, &device).unwrap();
        let biased = attention(qkv.as_tensor(), &mask, Some(&bias), heads, false, false).unwrap().unwrap();
        let real = mask.eq(0f32).unwrap().to_dtype(DType::F32).unwrap().unsqueeze(2).unwrap();
        let want_biased = chain(&qkv.broadcast_add(&bias).unwrap()).broadcast_mul(&real).unwrap();
        // The first position alone attending: the first row of each sequence's context.
        let first = attention(qkv.as_tensor(), &mask, Some(&bias), heads, false, true).unwrap().unwrap();
        assert_eq!(first.dims(), [batch, 1, hidden]);
        let want_first = want_biased.narrow(1, 0, 1).unwrap();
        let pairs = [
            ("inference", &inference, &want[0]),
            ("graph", &got[0], &want[0]),
            ("gradient", &got[1], &want[1]),
            ("bias apart", &biased, &want_biased),
            ("first position", &first, &want_first),
        ];
        for (what, got, want) in pairs {
            let worst = (got - want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(worst < 1e-5, "{what}: {worst}");
        }
    }
}
