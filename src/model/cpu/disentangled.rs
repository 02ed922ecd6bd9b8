//! DeBERTa's attention probabilities in one pass a row: each score plus the two relative terms it reads
//! (content to position and position to content, by the bucket of its distance), then the softmax over its
//! sequence's keys, with the backward pass (the softmax's, then each term's gradient summed back into the row of
//! the table it was read from). transformers gathers two `[batch, heads, len, len]` tensors for the same sums;
//! elsewhere than f32 on the CPU, so does this (candle's `gather`, differentiable too).

use candle_core::{CpuStorage, CustomOp1, CustomOp3, DType, Layout, Shape, Tensor, D};

use super::kernels::{fused, last_dim, rows, rows_mut, slice, softmax_row_fn, SoftmaxBackward};

/// What DeBERTa's attention scores add before their softmax: each score `(i, j)` reads row
/// `rows[i − j + len − 1]` of query i's content-to-position products and of key j's position-to-content ones;
/// each sequence's keys end at its length.
#[derive(Debug, Clone)]
pub struct Disentangled {
    pub rows: Vec<u32>,
    pub lengths: Vec<usize>,
}

impl Disentangled {
    /// The table row of the score of query `i` and key `j` among `len` keys.
    fn at(&self, i: usize, j: usize, len: usize) -> usize {
        self.rows[i + len - 1 - j] as usize
    }
}

/// Softmax of attention scores `[batch, heads, rows, len]` (queries at positions `0..rows`) plus their
/// relative terms: `to_positions` `[batch, heads, rows, 2 · span]` (queries by position rows) and
/// `from_positions` `[batch, heads, len, 2 · span]` (keys by position rows), each score reading the row of its
/// distance; keys past a sequence's length get 0.
pub fn disentangled_softmax(
    scores: &Tensor,
    to_positions: &Tensor,
    from_positions: &Tensor,
    relative: &Disentangled,
) -> candle_core::Result<Tensor> {
    if !fused(scores) {
        return composite(scores, to_positions, from_positions, relative);
    }
    let (_, heads, rows, len) = scores.dims4()?;
    if relative.rows.len() + 1 < 2 * len {
        candle_core::bail!("disentangled softmax: {} distances for {len} keys", relative.rows.len());
    }
    let op = DisentangledSoftmax { relative: relative.clone(), heads, rows };
    scores.contiguous()?.apply_op3(&to_positions.contiguous()?, &from_positions.contiguous()?, op)
}

/// transformers' arithmetic in candle's operations: the terms gathered into `[batch, heads, rows, len]`.
fn composite(
    scores: &Tensor,
    to_positions: &Tensor,
    from_positions: &Tensor,
    relative: &Disentangled,
) -> candle_core::Result<Tensor> {
    let (batch, heads, rows, len) = scores.dims4()?;
    let index = |f: &dyn Fn(usize, usize) -> usize, (a, b): (usize, usize)| {
        let values: Vec<u32> = (0..a).flat_map(|x| (0..b).map(move |y| f(x, y) as u32)).collect();
        Tensor::from_vec(values, (1, 1, a, b), scores.device())?.broadcast_as((batch, heads, a, b))?.contiguous()
    };
    let to = to_positions.gather(&index(&|i, j| relative.at(i, j, len), (rows, len))?, D::Minus1)?;
    let from = from_positions.gather(&index(&|j, i| relative.at(i, j, len), (len, rows))?, D::Minus1)?;
    let mut mask = vec![-1e30f32; batch * len];
    for (b, sequence) in mask.chunks_mut(len).enumerate() {
        sequence[..relative.lengths[b].min(len)].fill(0.0);
    }
    let mask = Tensor::from_vec(mask, (batch, 1, 1, len), scores.device())?.to_dtype(scores.dtype())?;
    let summed = ((scores + to)? + from.transpose(2, 3)?)?.broadcast_add(&mask)?;
    candle_nn::ops::softmax(&summed.to_dtype(DType::F32)?, D::Minus1)?.to_dtype(scores.dtype())
}

struct DisentangledSoftmax {
    relative: Disentangled,
    heads: usize,
    rows: usize,
}

impl DisentangledSoftmax {
    /// Row `row` of the scores: its sequence, its query's position, and its keys (the sequence's length).
    fn row(&self, row: usize, len: usize) -> (usize, usize, usize) {
        let head = row / self.rows;
        (head, row % self.rows, self.relative.lengths[head / self.heads].min(len))
    }
}

impl CustomOp3 for DisentangledSoftmax {
    fn name(&self) -> &'static str {
        "disentangled-softmax"
    }

    fn cpu_fwd(
        &self,
        s: &CpuStorage,
        l: &Layout,
        ts: &CpuStorage,
        tl: &Layout,
        fs: &CpuStorage,
        fl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (scores, to, from) = (slice(s, l, self.name())?, slice(ts, tl, self.name())?, slice(fs, fl, self.name())?);
        let (len, width) = (last_dim(l), last_dim(tl));
        if to.len() / width != scores.len() / len || from.len() / width * self.rows != scores.len() {
            candle_core::bail!("{}: tables {:?} and {:?}, scores {:?}", self.name(), tl.shape(), fl.shape(), l.shape());
        }
        let mut output = vec![0f32; scores.len()];
        let row_softmax = softmax_row_fn();
        rows(scores, len, &mut output, |first_row, inp, out| {
            let mut summed = vec![0f32; len];
            for (n, (row_in, row_out)) in inp.chunks(len).zip(out.chunks_mut(len)).enumerate() {
                let row = first_row + n;
                let (head, i, keys) = self.row(row, len);
                let to = &to[row * width..(row + 1) * width];
                let from = &from[head * len * width..(head + 1) * len * width];
                for (j, (s, &score)) in summed[..keys].iter_mut().zip(row_in).enumerate() {
                    let at = self.relative.at(i, j, len);
                    *s = score + to[at] + from[j * width + at];
                }
                row_softmax(&summed[..keys], &mut row_out[..keys]);
            }
        });
        Ok((CpuStorage::F32(output), l.shape().clone()))
    }

    /// The softmax's gradient is the scores'; each term's is summed into the table row it was read from.
    fn bwd(
        &self,
        _: &Tensor,
        to: &Tensor,
        from: &Tensor,
        probs: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let scores = probs.apply_op2_no_bwd(&grad.contiguous()?, &SoftmaxBackward)?;
        let onto = |keys: bool, table: &Tensor| {
            let op = Scatter { of: self, keys, width: table.dim(D::Minus1)? };
            scores.apply_op1_no_bwd(&op)
        };
        let (to, from) = (onto(false, to)?, onto(true, from)?);
        Ok((Some(scores), Some(to), Some(from)))
    }
}

/// The gradient of a relative term's table from the scores' gradient `[batch, heads, rows, len]`: per query
/// (`to_positions`), or per key (`from_positions`, with `keys`).
struct Scatter<'a> {
    of: &'a DisentangledSoftmax,
    keys: bool,
    width: usize,
}

impl CustomOp1 for Scatter<'_> {
    fn name(&self) -> &'static str {
        "disentangled-softmax-table-gradient"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let grad = slice(s, l, self.name())?;
        let (dims, len, width) = (l.shape().dims(), last_dim(l), self.width);
        let (rows, relative) = (self.of.rows, &self.of.relative);
        let outputs = if self.keys { len } else { rows };
        let mut output = vec![0f32; grad.len() / (rows * len) * outputs * width];
        rows_mut(&mut output, width, |first, out| {
            for (n, out) in out.chunks_mut(width).enumerate() {
                let (head, at) = ((first + n) / outputs, (first + n) % outputs);
                let scores = &grad[head * rows * len..(head + 1) * rows * len];
                if self.keys {
                    for i in 0..rows {
                        out[relative.at(i, at, len)] += scores[i * len + at];
                    }
                } else {
                    for (j, g) in scores[at * len..(at + 1) * len].iter().enumerate() {
                        out[relative.at(at, j, len)] += g;
                    }
                }
            }
        });
        let mut shape = dims.to_vec();
        shape[dims.len() - 2..].copy_from_slice(&[outputs, width]);
        Ok((CpuStorage::F32(output), Shape::from(shape)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cpu::kernels::tests::{compare, random};

    /// The fused pass against transformers' gathers (the composite), values and gradients, with a padded
    /// sequence, query rows fewer than the keys (the first position alone) and distances that clamp.
    #[test]
    fn disentangled_softmax_adds_the_terms_transformers_gathers() {
        let (batch, heads, len, width) = (2, 3, 7, 10);
        let rows: Vec<u32> = (0..2 * len - 1).map(|d| ((d * 5 + 1) % width) as u32).collect();
        let relative = Disentangled { rows, lengths: vec![7, 4] };
        for queries in [len, 1] {
            let inputs = [
                random(&[batch, heads, queries, len], 21, 2.0),
                random(&[batch, heads, queries, width], 22, 2.0),
                random(&[batch, heads, len, width], 23, 2.0),
            ];
            compare(
                &inputs,
                |t| disentangled_softmax(&t[0], &t[1], &t[2], &relative).unwrap(),
                |t| composite(&t[0], &t[1], &t[2], &relative).unwrap(),
                2e-6,
            );
            let fused = disentangled_softmax(&inputs[0], &inputs[1], &inputs[2], &relative).unwrap();
            let padding = fused.get(1).unwrap().narrow(2, 4, 3).unwrap().abs().unwrap().sum_all().unwrap();
            assert_eq!(padding.to_scalar::<f32>().unwrap(), 0.0, "keys past a sequence's length get weight");
        }
    }
}
