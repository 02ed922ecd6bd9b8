//! Linear layers through the products: in inference `BlasLinear` (a sequence's rows in calls cut by its length
//! alone, or weights packed for our AVX-512 kernel, each row's sum its own), and in training `matmul_t` with its
//! backward pass.

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Shape, Tensor};

use super::threads::{split, written, Shared};
use super::{available_for, blas, operands, Blas, Kernels, Operand};
use crate::model::cpu::packed::Packed;

/// The `sgemm` calls of a linear layer over one sequence of `len` rows: parts of about equal size, at most
/// `CALL_ROWS` each, cut by `len` alone, so a sequence's rows go through the same calls in any batch. OpenBLAS
/// sums a row in an order that depends on its place in the call (its kernels take rows twelve at a time, the
/// rest by fours and ones): a batch cut by its own size would give a sequence other last bits than it has
/// alone. Calls of 128 rows keep OpenBLAS's throughput within a few % (BENCHMARKS.md), and a sequence of 256
/// tokens, alone in its batch, still spreads over two threads; padding rows are not computed at all.
fn sequence_calls(len: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    const CALL_ROWS: usize = 128;
    let size = len.div_ceil(len.div_ceil(CALL_ROWS).max(1)).max(1);
    (0..len).step_by(size).map(move |start| start..len.min(start + size))
}

/// `x · Wᵀ` over the last dimension (the encoder adds each bias in a later pass), the weights kept as the
/// kernels read them.
pub struct BlasLinear {
    weight: Weight,
    outputs: usize,
    inputs: usize,
}

/// A linear layer's weight as its kernels read it.
enum Weight {
    /// `[outputs, inputs]`, row-major: a library's `sgemm` or `gemm`'s.
    Rows(Vec<f32>),
    /// For the built-in kernels where the CPU has AVX-512.
    Packed(Packed),
}

impl BlasLinear {
    pub fn new(weight: &Tensor) -> candle_core::Result<BlasLinear> {
        let (outputs, inputs) = weight.dims2()?;
        let rows: Vec<f32> = weight.flatten_all()?.to_vec1()?;
        let packed = match blas() {
            Some(Blas { kernels: Kernels::Builtin { packed: true }, .. }) => Packed::new(&rows, outputs, inputs),
            _ => None,
        };
        let weight = packed.map_or(Weight::Rows(rows), Weight::Packed);
        Ok(BlasLinear { weight, outputs, inputs })
    }

    /// Output width (the weight's rows).
    pub fn outputs(&self) -> usize {
        self.outputs
    }

    /// The weight as a tensor again (for quantizing).
    pub fn weight(&self, device: &candle_core::Device) -> candle_core::Result<Tensor> {
        let shape = (self.outputs, self.inputs);
        match &self.weight {
            Weight::Rows(rows) => Tensor::from_slice(rows, shape, device),
            Weight::Packed(packed) => Tensor::from_vec(packed.unpacked(), shape, device),
        }
    }

    /// `x · Wᵀ` for `x` `[batch, len, inputs]` whose sequences have `lengths` real positions: each sequence's
    /// rows in calls of their own (`sequence_calls`), so that its result has the same bits in any batch;
    /// the rows of padding are zeros.
    pub fn forward(&self, x: &Tensor, lengths: &[usize]) -> candle_core::Result<Tensor> {
        x.contiguous()?.apply_op1_no_bwd(&Sequences { linear: self, lengths, gelu_bias: None, first_alone: 0 })
    }

    /// `forward` where the first `first_alone` outputs are read at each sequence's first position alone (a
    /// last layer's queries when only `[CLS]` attends): with packed weights the other positions get zeros
    /// there, for the whole panels it spans (about 1.5 % of a pass at 128 tokens not computed).
    pub fn forward_first_alone(
        &self,
        x: &Tensor,
        lengths: &[usize],
        first_alone: usize,
    ) -> candle_core::Result<Tensor> {
        x.contiguous()?.apply_op1_no_bwd(&Sequences { linear: self, lengths, gelu_bias: None, first_alone })
    }

    /// The exact GELU of `x · Wᵀ + bias` on the real rows (the rows of padding are zeros): with packed
    /// weights in the products' last step, while each tile's outputs are in L1 (a pass of its own over the
    /// outputs waited on memory for about 40 % of its time), else in a pass over each call's rows.
    pub fn forward_bias_gelu(&self, x: &Tensor, lengths: &[usize], bias: &Tensor) -> candle_core::Result<Tensor> {
        let bias: Vec<f32> = bias.to_dtype(DType::F32)?.to_vec1()?;
        if bias.len() != self.outputs {
            candle_core::bail!("blas-linear: a bias of {} for {} outputs", bias.len(), self.outputs);
        }
        x.contiguous()?.apply_op1_no_bwd(&Sequences { linear: self, lengths, gelu_bias: Some(&bias), first_alone: 0 })
    }
}

/// The op of `BlasLinear::forward`.
struct Sequences<'a> {
    linear: &'a BlasLinear,
    lengths: &'a [usize],
    /// The bias of an exact GELU applied to the products.
    gelu_bias: Option<&'a [f32]>,
    /// Leading outputs read at each sequence's first position alone.
    first_alone: usize,
}

impl CustomOp1 for Sequences<'_> {
    fn name(&self) -> &'static str {
        "blas-linear"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let Some(blas) = blas() else { candle_core::bail!("BLAS is not loaded") };
        let (CpuStorage::F32(data), Some((start, end))) = (storage, layout.contiguous_offsets()) else {
            candle_core::bail!("blas-linear takes contiguous f32 inputs")
        };
        let x = &data[start..end];
        let (n, k) = (self.linear.outputs, self.linear.inputs);
        let &[batch, len, inputs] = layout.shape().dims() else {
            candle_core::bail!("blas-linear takes [batch, len, inputs], not {:?}", layout.shape())
        };
        if inputs != k || self.lengths.len() != batch || self.lengths.iter().any(|&l| l > len) {
            candle_core::bail!(
                "blas-linear: input {:?}, weight [{n}, {k}], lengths {:?}",
                layout.shape(),
                self.lengths
            );
        }
        let rows = batch * len;
        let x = Operand { data: x.as_ptr(), transposed: false };
        let out = written(rows * n, |c| {
            let c = Shared(c);
            // SAFETY: x is rows × k, the weight n × k, the output rows × n; the calls (or the real rows) and
            // the padding cover every row once.
            match &self.linear.weight {
                Weight::Rows(w) => {
                    // Each sequence's rows in calls from its first, then the padding after it.
                    let calls: Vec<std::ops::Range<usize>> = self
                        .lengths
                        .iter()
                        .enumerate()
                        .flat_map(|(i, &l)| sequence_calls(l).map(move |r| i * len + r.start..i * len + r.end))
                        .collect();
                    let weight = Operand { data: w.as_ptr(), transposed: true };
                    let gelu = crate::model::cpu::kernels::bias_gelu_rows_fn();
                    split(calls.len(), blas.threads, |part| {
                        for call in &calls[part] {
                            unsafe { blas.rows(call.clone(), (rows, n, k), x, weight, c.ptr()) };
                            if let Some(bias) = self.gelu_bias {
                                let out = unsafe {
                                    std::slice::from_raw_parts_mut(c.ptr().add(call.start * n), call.len() * n)
                                };
                                gelu(out, bias);
                            }
                        }
                    });
                }
                // A row's bits do not depend on the rows it is computed with: every real row of the batch,
                // in equal parts over the threads.
                Weight::Packed(w) => {
                    // Each sequence's real rows from its `skip`th.
                    let real = |skip: usize| -> Vec<usize> {
                        let lengths = self.lengths.iter().enumerate();
                        lengths.flat_map(|(i, &l)| i * len + skip.min(l)..i * len + l).collect()
                    };
                    // With `first_alone`, the first rows apart with every output, the others from that output on.
                    let parts = match self.first_alone {
                        0 => vec![(real(0), 0)],
                        from => {
                            let first = (0..batch).filter(|&i| self.lengths[i] > 0).map(|i| i * len).collect();
                            vec![(first, 0), (real(1), from)]
                        }
                    };
                    for (rows, from) in &parts {
                        split(rows.len(), blas.threads, |part| unsafe {
                            w.rows(x.data(), &rows[part], c.ptr(), self.gelu_bias, *from)
                        });
                    }
                }
            }
            for (i, &l) in self.lengths.iter().enumerate() {
                unsafe { std::ptr::write_bytes(c.ptr().add((i * len + l) * n), 0, (len - l) * n) };
            }
        });
        Ok((CpuStorage::F32(out), Shape::from((batch, len, n))))
    }
}

/// `x · wᵀ` for 2-D `x` (rows × k) and `w` (n × k) through BLAS, on the autograd graph (training's linear
/// layers), its backward passes BLAS products too. `None` when BLAS is not loaded.
pub fn matmul_t(x: &Tensor, w: &Tensor) -> candle_core::Result<Option<Tensor>> {
    if !available_for(x) || !available_for(w) {
        return Ok(None);
    }
    Ok(Some(x.contiguous()?.apply_op2(&w.contiguous()?, Product { transpose_a: false, transpose_b: true })?))
}

/// `op(A) · op(B)` of 2-D contiguous f32 tensors.
#[derive(Clone, Copy)]
struct Product {
    transpose_a: bool,
    transpose_b: bool,
}

impl candle_core::CustomOp2 for Product {
    fn name(&self) -> &'static str {
        "blas-product"
    }

    fn cpu_fwd(
        &self,
        a: &CpuStorage,
        a_layout: &Layout,
        b: &CpuStorage,
        b_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (blas, a, b) = operands(self.name(), (a, a_layout), (b, b_layout))?;
        let ((a_rows, a_cols), (b_rows, b_cols)) = (a_layout.shape().dims2()?, b_layout.shape().dims2()?);
        let (m, k) = if self.transpose_a { (a_cols, a_rows) } else { (a_rows, a_cols) };
        let (n, inner) = if self.transpose_b { (b_rows, b_cols) } else { (b_cols, b_rows) };
        if inner != k {
            candle_core::bail!("blas-product: [{a_rows}, {a_cols}] and [{b_rows}, {b_cols}] do not multiply");
        }
        let a = Operand { data: a.as_ptr(), transposed: self.transpose_a };
        let b = Operand { data: b.as_ptr(), transposed: self.transpose_b };
        // SAFETY: the shapes were checked above.
        let out = written(m * n, |c| unsafe { blas.product((m, n, k), a, b, c) });
        Ok((CpuStorage::F32(out), Shape::from((m, n))))
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        _: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        if self.transpose_a || !self.transpose_b {
            candle_core::bail!("blas-product: only x · wᵀ has a backward pass");
        }
        // C = A · Bᵀ: dA = dC · B, dB = dCᵀ · A.
        let grad = grad.contiguous()?;
        let da = grad.apply_op2_no_bwd(b, &Product { transpose_a: false, transpose_b: false })?;
        let db = grad.apply_op2_no_bwd(a, &Product { transpose_a: true, transpose_b: false })?;
        Ok((Some(da), Some(db)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cpu::blas::gemm_path;
    use candle_core::{Device, IndexOp, Module};

    #[test]
    fn a_sequence_is_cut_into_calls_by_its_length_alone() {
        let calls = |len| sequence_calls(len).map(|r| (r.start, r.end)).collect::<Vec<_>>();
        assert!(calls(0).is_empty());
        assert_eq!(calls(5), [(0, 5)]);
        assert_eq!(calls(128), [(0, 128)]);
        assert_eq!(calls(129), [(0, 65), (65, 129)]);
        assert_eq!(calls(256), [(0, 128), (128, 256)]);
        assert_eq!(calls(300), [(0, 100), (100, 200), (200, 300)]);
    }

    /// A linear layer of random weights `[outputs, inputs]`, or `None` with BLAS off.
    fn random_linear(outputs: usize, inputs: usize) -> Option<BlasLinear> {
        let weight = Tensor::randn(0f32, 1.0, (outputs, inputs), &Device::Cpu).unwrap();
        available_for(&weight).then(|| BlasLinear::new(&weight).unwrap())
    }

    /// A sequence's rows have the same bits alone and in any batch (padded to a longer one, after others):
    /// what makes a pair's score independent of the batch the queue put it in, through OpenBLAS too.
    #[test]
    fn a_sequence_has_the_same_bits_alone_and_in_any_batch() {
        let device = Device::Cpu;
        let Some(linear) = random_linear(1152, 384) else { return };
        let lengths = [37, 300, 5, 261];
        let longest = 300;
        let batch = Tensor::randn(0f32, 1.0, (lengths.len(), longest, 384), &device).unwrap();
        let together = linear.forward(&batch, &lengths).unwrap();
        for (i, &l) in lengths.iter().enumerate() {
            let alone = linear.forward(&batch.i((i..i + 1, ..l)).unwrap(), &[l]).unwrap();
            let bits = |t: Tensor| {
                t.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            };
            assert!(bits(alone) == bits(together.i((i..i + 1, ..l)).unwrap()), "sequence {i} of {l} rows");
        }
    }

    /// A last layer's queries at the first positions alone: those rows and every other output as `forward`
    /// gives them, bit for bit; with packed weights the queries' whole panels elsewhere are zeros.
    #[test]
    fn the_queries_of_first_positions_alone_leave_the_rest_as_it_was() {
        let Some(linear) = random_linear(144, 40) else { return };
        let (x, lengths) = (Tensor::randn(0f32, 1.0, (3, 7, 40), &Device::Cpu).unwrap(), [7, 0, 5]);
        let all = linear.forward(&x, &lengths).unwrap().to_vec3::<f32>().unwrap();
        let first = linear.forward_first_alone(&x, &lengths, 58).unwrap().to_vec3::<f32>().unwrap();
        let packed = matches!(linear.weight, Weight::Packed(_));
        for (s, (all, first)) in all.iter().zip(&first).enumerate() {
            for (t, (all, first)) in all.iter().zip(first).enumerate() {
                let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                let skipped = if packed && t > 0 && t < lengths[s] { 48 } else { 0 };
                assert!(first[..skipped].iter().all(|v| *v == 0.0), "sequence {s} row {t}");
                assert_eq!(bits(&first[skipped..]), bits(&all[skipped..]), "sequence {s} row {t}");
            }
        }
    }

    #[test]
    fn blas_linear_equals_candles() {
        let device = Device::Cpu;
        let weight = Tensor::randn(0f32, 1.0, (48, 40), &device).unwrap();
        let x = Tensor::randn(0f32, 1.0, (3, 7, 40), &device).unwrap();
        if !available_for(&weight) {
            return; // LONGRANK_BLAS=off
        }
        let want = candle_nn::Linear::new(weight.clone(), None).forward(&x).unwrap();
        let linear = BlasLinear::new(&weight).unwrap();
        // What `/metrics` says is what multiplies.
        assert_eq!(matches!(linear.weight, Weight::Packed(_)), gemm_path().1 == "avx512", "{:?}", gemm_path());
        let got = linear.forward(&x, &[7, 3, 7]).unwrap();
        assert_eq!(got.dims(), [3, 7, 48]);
        // The second sequence's padding rows are zeros, the real rows candle's.
        let padding = got.i((1, 3..)).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert_eq!(padding, 0.0);
        let want =
            Tensor::cat(&[want.i((0, ..)).unwrap(), want.i((1, ..3)).unwrap(), want.i((2, ..)).unwrap()], 0).unwrap();
        let got =
            Tensor::cat(&[got.i((0, ..)).unwrap(), got.i((1, ..3)).unwrap(), got.i((2, ..)).unwrap()], 0).unwrap();
        let worst = (got - want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(worst < 1e-4, "{worst}");
        // With a GELU's bias: on the real rows the row kernel's GELU of the product plus the bias, bit for bit.
        let bias = Tensor::randn(0f32, 1.0, 48, &device).unwrap();
        let gelu = linear.forward_bias_gelu(&x, &[7, 3, 7], &bias).unwrap();
        let plain = linear.forward(&x, &[7, 3, 7]).unwrap();
        let (bias, plain, gelu) =
            (bias.to_vec1::<f32>().unwrap(), plain.to_vec3::<f32>().unwrap(), gelu.to_vec3::<f32>().unwrap());
        for (i, l) in [7, 3, 7].into_iter().enumerate() {
            for (t, (plain, gelu)) in plain[i].iter().zip(&gelu[i]).enumerate() {
                let mut want = plain.clone();
                if t < l {
                    crate::model::cpu::kernels::bias_gelu_rows(&mut want, &bias);
                }
                assert_eq!(
                    want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    gelu.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "sequence {i} row {t}"
                );
            }
        }
        // x · wᵀ on the graph: the values and both gradients as candle's.
        let x = candle_core::Var::randn(0f32, 1.0, (9, 40), &device).unwrap();
        let w = candle_core::Var::randn(0f32, 1.0, (48, 40), &device).unwrap();
        let direction = Tensor::randn(0f32, 1.0, (9, 48), &device).unwrap();
        let run = |y: Tensor| {
            let grads = (y.clone() * &direction).unwrap().sum_all().unwrap().backward().unwrap();
            [y, grads.get(x.as_tensor()).unwrap().clone(), grads.get(w.as_tensor()).unwrap().clone()]
        };
        let want = run(x.matmul(&w.t().unwrap()).unwrap());
        let got = run(matmul_t(&x, &w).unwrap().unwrap());
        for (g, w) in got.iter().zip(&want) {
            let worst = (g - w).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(worst < 1e-4, "{worst}");
        }
    }
}
