//! Fused CPU kernels with their backward passes, for f32 tensors: bias + exact GELU, softmax over the last
//! dimension, LayerNorm. Each replaces a chain of whole-tensor candle operations (and, in training, the
//! chain's backward and the zero-filled gradient buffers candle allocates for every node) with one pass over
//! rows on every core. Elsewhere (GPU, half precision) the same functions fall back to candle's composite
//! operations, which are differentiable too.

use candle_core::{
    CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, InplaceOp2, InplaceOp3, Layout, Shape, Tensor, D,
};

/// The exact GELU of `x + bias` (bias along the last dimension), `y · Φ(y)`, with a polynomial erf
/// (absolute error under 1.5e-7).
pub fn bias_gelu(x: &Tensor, bias: &Tensor) -> candle_core::Result<Tensor> {
    if fused(x) {
        x.contiguous()?.apply_op2(bias, BiasGelu)
    } else {
        x.broadcast_add(bias)?.gelu_erf()
    }
}

/// Softmax over the last dimension.
pub fn softmax(x: &Tensor) -> candle_core::Result<Tensor> {
    if fused(x) {
        x.contiguous()?.apply_op1(Softmax)
    } else {
        candle_nn::ops::softmax(x, D::Minus1)
    }
}

/// Softmax over the last dimension under a causal mask, for attention scores whose rows are queries from
/// position `first` on and whose columns are keys from position 0: row r of each `[rows, width]` matrix reads
/// its first `first + r + 1` entries, and the rest are 0. Inference only.
pub fn causal_softmax(x: &Tensor, first: usize) -> candle_core::Result<Tensor> {
    if fused(x) {
        return x.contiguous()?.apply_op1_no_bwd(&CausalSoftmax { first });
    }
    let (rows, width) = (x.dim(D::Minus2)?, x.dim(D::Minus1)?);
    let mask: Vec<f32> =
        (0..rows).flat_map(|r| (0..width).map(move |c| if c > first + r { f32::NEG_INFINITY } else { 0.0 })).collect();
    let mask = Tensor::from_vec(mask, (rows, width), x.device())?.to_dtype(DType::F32)?;
    candle_nn::ops::softmax_last_dim(&x.to_dtype(DType::F32)?.broadcast_add(&mask)?)?.to_dtype(x.dtype())
}

/// Which keys each query of a block of attention scores reads, for `band_softmax`: queries from position
/// `first_query` on, keys from `first_key` on, each sequence's keys below its length, and with a `window`
/// only those at most that far from the query (ModernBERT's local layers).
#[derive(Debug, Clone)]
pub struct Band {
    pub first_query: usize,
    pub first_key: usize,
    pub window: Option<usize>,
    /// Each sequence's real positions (the batch's first dimension).
    pub lengths: Vec<usize>,
}

impl Band {
    /// Row `r`'s readable columns (empty for a query of padding whose window holds no real key), of `cols`.
    fn columns(&self, sequence: usize, r: usize, cols: usize) -> std::ops::Range<usize> {
        let i = self.first_query + r;
        let (lo, hi) = match self.window {
            Some(w) => (i.saturating_sub(w), i + w + 1),
            None => (0, usize::MAX),
        };
        let lo = (lo.max(self.first_key) - self.first_key).min(cols);
        let hi = hi.min(self.lengths[sequence]).min(self.first_key + cols).saturating_sub(self.first_key);
        lo..hi.max(lo)
    }
}

/// Softmax over the last dimension of attention scores `[batch, heads, rows, cols]` under `band`: each row
/// over the keys it reads, 0 elsewhere (a row that reads none is all 0); with its backward pass.
pub fn band_softmax(x: &Tensor, band: &Band) -> candle_core::Result<Tensor> {
    let (batch, heads, rows, cols) = x.dims4()?;
    if fused(x) {
        return x.contiguous()?.apply_op1(BandSoftmax { band: band.clone(), heads, rows });
    }
    // A finite mask: a row that reads no key gets finite weights (its outputs are padding's), never NaN.
    let mut mask = vec![-1e30f32; batch * rows * cols];
    for (b, sequence) in mask.chunks_mut(rows * cols).enumerate() {
        for (r, row) in sequence.chunks_mut(cols).enumerate() {
            row[band.columns(b, r, cols)].fill(0.0);
        }
    }
    let mask = Tensor::from_vec(mask, (batch, 1, rows, cols), x.device())?;
    candle_nn::ops::softmax_last_dim(&x.to_dtype(DType::F32)?.broadcast_add(&mask)?)?.to_dtype(x.dtype())
}

/// A gated feed-forward's activation: `silu(gate) ⊙ up` for `x` = `[…, gate | up]` (the two projections side by
/// side along the last dimension), half as wide as `x`; with its backward pass (`[dgate | dup]`).
pub fn silu_gate(x: &Tensor) -> candle_core::Result<Tensor> {
    if fused(x) {
        x.contiguous()?.apply_op1(Gate::silu())
    } else {
        let half = x.dim(D::Minus1)? / 2;
        candle_nn::ops::silu(&x.narrow(D::Minus1, 0, half)?)? * x.narrow(D::Minus1, half, half)?
    }
}

/// GeGLU's activation, `gelu(gate) ⊙ up` (the exact GELU, with `erf`'s polynomial), as `silu_gate`.
pub fn gelu_gate(x: &Tensor) -> candle_core::Result<Tensor> {
    if fused(x) {
        x.contiguous()?.apply_op1(Gate::gelu())
    } else {
        let half = x.dim(D::Minus1)? / 2;
        x.narrow(D::Minus1, 0, half)?.gelu_erf()? * x.narrow(D::Minus1, half, half)?
    }
}

/// LayerNorm over the last dimension with weight and bias.
pub fn layer_norm(x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    if fused(x) {
        x.contiguous()?.apply_op3(weight, bias, LayerNorm { eps: eps as f32 })
    } else {
        candle_nn::ops::layer_norm_slow(x, weight, bias, eps as f32)
    }
}

/// Inference: the exact GELU of `x + bias`, written over `x` (a fresh projection no other tensor shares).
pub fn bias_gelu_in_place(x: Tensor, bias: &Tensor) -> candle_core::Result<Tensor> {
    if fused(&x) && x.is_contiguous() {
        x.inplace_op2(bias, &BiasGeluInPlace)?;
        Ok(x)
    } else {
        x.broadcast_add(bias)?.gelu_erf()
    }
}

/// Inference: `LayerNorm(y + shift + residual)`, written over `y` (a fresh projection no other tensor shares;
/// `shift`, its bias, one row): the projection's bias, the residual connection and the norm in one pass, no
/// new tensor.
pub fn add_layer_norm_in_place(
    y: Tensor,
    shift: &Tensor,
    residual: &Tensor,
    norm: &candle_nn::LayerNorm,
    eps: f64,
) -> candle_core::Result<Tensor> {
    match norm.bias() {
        Some(bias) if fused(&y) && y.is_contiguous() => {
            let params = Tensor::stack(&[shift, norm.weight(), bias], 0)?;
            y.inplace_op3(residual, &params, &AddLayerNorm { eps: eps as f32 })?;
            Ok(y)
        }
        _ => candle_nn::Module::forward(norm, &(y.broadcast_add(shift)? + residual)?),
    }
}

pub(super) fn fused(x: &Tensor) -> bool {
    x.device().is_cpu() && x.dtype() == DType::F32
}

/// `f` over groups of whole rows of `width`, in parallel: `f(first_row, input rows, output rows)`.
pub(super) fn rows<F>(input: &[f32], width: usize, output: &mut [f32], f: F)
where
    F: Fn(usize, &[f32], &mut [f32]) + Sync,
{
    rows_mut(output, width, |first, out| f(first, &input[first * width..first * width + out.len()], out));
}

/// `f` over groups of whole rows of `width` of `data`, in place, in parallel: `f(first_row, rows)`.
pub(super) fn rows_mut<F>(data: &mut [f32], width: usize, f: F)
where
    F: Fn(usize, &mut [f32]) + Sync,
{
    let rows = data.len() / width.max(1);
    let per_chunk = rows.div_ceil(rayon::current_num_threads()).max(1);
    // On rayon's pool, as `blas::split`.
    rayon::scope(|scope| {
        for (i, chunk) in data.chunks_mut(per_chunk * width).enumerate() {
            let f = &f;
            scope.spawn(move |_| f(i * per_chunk, chunk));
        }
    });
}

pub(super) fn slice<'a>(storage: &'a CpuStorage, layout: &Layout, what: &str) -> candle_core::Result<&'a [f32]> {
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&storage.as_slice::<f32>()?[start..end]),
        None => candle_core::bail!("{what} needs contiguous tensors"),
    }
}

pub(super) fn last_dim(layout: &Layout) -> usize {
    layout.shape().dims().last().copied().unwrap_or(1)
}

/// erf by Abramowitz and Stegun 7.1.26 (absolute error under 1.5e-7), branch-free so it vectorizes.
#[inline(always)]
fn erf(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = t * (0.254_829_6 + t * (-0.284_496_74 + t * (1.421_413_7 + t * (-1.453_152_1 + t * 1.061_405_4))));
    (1.0 - poly * exp(-a * a)).copysign(x)
}

struct BiasGelu;

impl CustomOp2 for BiasGelu {
    fn name(&self) -> &'static str {
        "bias-gelu-erf"
    }

    fn cpu_fwd(
        &self,
        s: &CpuStorage,
        l: &Layout,
        bs: &CpuStorage,
        bl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (input, bias) = (slice(s, l, self.name())?, slice(bs, bl, self.name())?);
        if last_dim(l) != bias.len() {
            candle_core::bail!("bias-gelu-erf: a bias of {} for rows of {:?}", bias.len(), l.shape());
        }
        let mut output = input.to_vec();
        let gelu = bias_gelu_rows_fn();
        rows_mut(&mut output, bias.len(), |_, out| gelu(out, bias));
        Ok((CpuStorage::F32(output), l.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        bias: &Tensor,
        _: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        // One pass gives d(x + b) for every row and, as one more row, its sum over rows (the bias gradient).
        let packed = x.apply_op3_no_bwd(bias, &grad.contiguous()?, &BiasGeluBackward)?;
        let rows = x.elem_count() / bias.elem_count();
        Ok((Some(packed.narrow(0, 0, rows)?.reshape(x.shape())?), Some(packed.get(rows)?)))
    }
}

fn slice_mut<'a>(storage: &'a mut CpuStorage, layout: &Layout, what: &str) -> candle_core::Result<&'a mut [f32]> {
    match (storage, layout.contiguous_offsets()) {
        (CpuStorage::F32(values), Some((start, end))) => Ok(&mut values[start..end]),
        _ => candle_core::bail!("{what} needs a contiguous f32 tensor"),
    }
}

struct BiasGeluInPlace;

impl InplaceOp2 for BiasGeluInPlace {
    fn name(&self) -> &'static str {
        "bias-gelu-erf-in-place"
    }

    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout, bs: &CpuStorage, bl: &Layout) -> candle_core::Result<()> {
        let bias = slice(bs, bl, self.name())?;
        if last_dim(l) != bias.len() {
            candle_core::bail!("{}: a bias of {} for rows of {:?}", self.name(), bias.len(), l.shape());
        }
        let x = slice_mut(s, l, self.name())?;
        let gelu = bias_gelu_rows_fn();
        rows_mut(x, bias.len(), |_, rows| gelu(rows, bias));
        Ok(())
    }
}

/// `y ← LayerNorm(y + shift + residual)` with `[shift; weight; bias]` stacked as `[3, width]`.
struct AddLayerNorm {
    eps: f32,
}

impl InplaceOp3 for AddLayerNorm {
    fn name(&self) -> &'static str {
        "add-layer-norm-in-place"
    }

    fn cpu_fwd(
        &self,
        s: &mut CpuStorage,
        l: &Layout,
        rs: &CpuStorage,
        rl: &Layout,
        ps: &CpuStorage,
        pl: &Layout,
    ) -> candle_core::Result<()> {
        let (residual, params) = (slice(rs, rl, self.name())?, slice(ps, pl, self.name())?);
        let width = params.len() / 3;
        if last_dim(l) != width || rl.shape() != l.shape() {
            candle_core::bail!("{}: {:?} + {:?}, norm of {width}", self.name(), l.shape(), rl.shape());
        }
        let (shift, rest) = params.split_at(width);
        let (weight, bias) = rest.split_at(width);
        let y = slice_mut(s, l, self.name())?;
        let add_norm = add_norm_rows_fn();
        rows_mut(y, width, |first, rows| {
            add_norm(rows, &residual[first * width..first * width + rows.len()], shift, weight, bias, self.eps)
        });
        Ok(())
    }
}

struct BiasGeluBackward;

impl CustomOp3 for BiasGeluBackward {
    fn name(&self) -> &'static str {
        "bias-gelu-erf-backward"
    }

    fn cpu_fwd(
        &self,
        s: &CpuStorage,
        l: &Layout,
        bs: &CpuStorage,
        bl: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (input, bias, grad) = (slice(s, l, self.name())?, slice(bs, bl, self.name())?, slice(gs, gl, self.name())?);
        let width = bias.len();
        let n = input.len() / width;
        let mut output = vec![0f32; input.len() + width];
        let (dx, _) = output.split_at_mut(input.len());
        let inv_sqrt_2pi = 0.5 * std::f32::consts::FRAC_2_SQRT_PI * std::f32::consts::FRAC_1_SQRT_2;
        rows(input, width, dx, |first, inp, out| {
            let grad = &grad[first * width..first * width + inp.len()];
            for ((row_in, row_out), row_g) in inp.chunks(width).zip(out.chunks_mut(width)).zip(grad.chunks(width)) {
                for (((o, &v), &b), &g) in row_out.iter_mut().zip(row_in).zip(bias).zip(row_g) {
                    let y = v + b;
                    let cdf = 0.5 * (1.0 + erf(y * std::f32::consts::FRAC_1_SQRT_2));
                    *o = g * (cdf + y * inv_sqrt_2pi * exp(-0.5 * y * y));
                }
            }
        });
        let (dx, db) = output.split_at_mut(input.len());
        for row in dx.chunks(width) {
            for (d, v) in db.iter_mut().zip(row) {
                *d += v;
            }
        }
        Ok((CpuStorage::F32(output), Shape::from((n + 1, width))))
    }
}

struct Softmax;

impl CustomOp1 for Softmax {
    fn name(&self) -> &'static str {
        "softmax-last-dim"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let input = slice(s, l, self.name())?;
        let width = last_dim(l);
        let mut output = vec![0f32; input.len()];
        let row_softmax = softmax_row_fn();
        rows(input, width, &mut output, |_, inp, out| {
            for (row_in, row_out) in inp.chunks(width).zip(out.chunks_mut(width)) {
                row_softmax(row_in, row_out);
            }
        });
        Ok((CpuStorage::F32(output), l.shape().clone()))
    }

    fn bwd(&self, _: &Tensor, probs: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(probs.apply_op2_no_bwd(&grad.contiguous()?, &SoftmaxBackward)?))
    }
}

struct CausalSoftmax {
    first: usize,
}

impl CustomOp1 for CausalSoftmax {
    fn name(&self) -> &'static str {
        "causal-softmax"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let input = slice(s, l, self.name())?;
        let (width, height) = (last_dim(l), l.shape().dims().iter().rev().nth(1).copied().unwrap_or(1));
        let mut output = vec![0f32; input.len()];
        let row_softmax = softmax_row_fn();
        rows(input, width, &mut output, |first_row, inp, out| {
            for (i, (row_in, row_out)) in inp.chunks(width).zip(out.chunks_mut(width)).enumerate() {
                let read = (self.first + (first_row + i) % height + 1).min(width);
                row_softmax(&row_in[..read], &mut row_out[..read]);
            }
        });
        Ok((CpuStorage::F32(output), l.shape().clone()))
    }
}

struct BandSoftmax {
    band: Band,
    heads: usize,
    rows: usize,
}

impl CustomOp1 for BandSoftmax {
    fn name(&self) -> &'static str {
        "band-softmax"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let input = slice(s, l, self.name())?;
        let width = last_dim(l);
        let mut output = vec![0f32; input.len()];
        let row_softmax = softmax_row_fn();
        rows(input, width, &mut output, |first_row, inp, out| {
            for (i, (row_in, row_out)) in inp.chunks(width).zip(out.chunks_mut(width)).enumerate() {
                let row = first_row + i;
                let read = self.band.columns(row / (self.heads * self.rows), row % self.rows, width);
                row_softmax(&row_in[read.clone()], &mut row_out[read]);
            }
        });
        Ok((CpuStorage::F32(output), l.shape().clone()))
    }

    /// Softmax's: the keys a row does not read have probability 0, and so gradient 0.
    fn bwd(&self, _: &Tensor, probs: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(probs.apply_op2_no_bwd(&grad.contiguous()?, &SoftmaxBackward)?))
    }
}

/// A gated activation over rows `[gate | up]`, by its row kernel, and its gradient's.
#[derive(Clone, Copy)]
struct Gate {
    row: fn(&[f32], &mut [f32]),
    /// `[dgate | dup]` of a row `[gate | up]` and its output's gradient.
    grad_row: fn(&[f32], &[f32], &mut [f32]),
}

impl Gate {
    fn silu() -> Gate {
        Gate { row: silu_gate_row_fn(), grad_row: silu_gate_grad_row_fn() }
    }

    fn gelu() -> Gate {
        Gate { row: gelu_gate_row_fn(), grad_row: gelu_gate_grad_row_fn() }
    }
}

impl CustomOp1 for Gate {
    fn name(&self) -> &'static str {
        "gate"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let input = slice(s, l, self.name())?;
        let width = last_dim(l);
        let mut dims = l.shape().dims().to_vec();
        *dims.last_mut().expect("a last dimension") = width / 2;
        let mut output = vec![0f32; input.len() / 2];
        rows_mut(&mut output, width / 2, |first, out| {
            for (row_out, row_in) in out.chunks_mut(width / 2).zip(input[first * width..].chunks(width)) {
                (self.row)(row_in, row_out);
            }
        });
        Ok((CpuStorage::F32(output), Shape::from(dims)))
    }

    fn bwd(&self, x: &Tensor, _: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(x.apply_op2_no_bwd(&grad.contiguous()?, &GateBackward(*self))?))
    }
}

/// `Gate`'s gradient with respect to its input, `[dgate | dup]` a row.
struct GateBackward(Gate);

impl CustomOp2 for GateBackward {
    fn name(&self) -> &'static str {
        "gate-backward"
    }

    fn cpu_fwd(
        &self,
        s: &CpuStorage,
        l: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (input, grad) = (slice(s, l, self.name())?, slice(gs, gl, self.name())?);
        let width = last_dim(l);
        if grad.len() * 2 != input.len() {
            candle_core::bail!("gate-backward: a gradient of {} values for an input of {:?}", grad.len(), l.shape());
        }
        let mut output = vec![0f32; input.len()];
        rows_mut(&mut output, width, |first, out| {
            let rows = input[first * width..].chunks(width).zip(grad[first * width / 2..].chunks(width / 2));
            for (row_out, (row_in, row_grad)) in out.chunks_mut(width).zip(rows) {
                (self.0.grad_row)(row_in, row_grad, row_out);
            }
        });
        Ok((CpuStorage::F32(output), l.shape().clone()))
    }
}

/// `pub(super) fn $name() -> fn(args) -> ret`: `$body` (an `#[inline(always)]` function) compiled for
/// AVX-512 or AVX2 and FMA when the CPU has them, else for the crate's baseline (SSE2), where its passes
/// vectorize a quarter as wide.
macro_rules! vectorized {
    ($(#[$doc:meta])* $name:ident = $body:ident($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        $(#[$doc])*
        pub(super) fn $name() -> fn($($ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma") {
                #[target_feature(enable = "avx512f,fma")]
                fn avx512($($arg: $ty),*) -> $ret {
                    $body($($arg),*)
                }
                // SAFETY: the features were just detected.
                return |$($arg),*| unsafe { avx512($($arg),*) };
            }
            #[cfg(target_arch = "x86_64")]
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) -> $ret {
                    $body($($arg),*)
                }
                // SAFETY: the features were just detected.
                return |$($arg),*| unsafe { avx2($($arg),*) };
            }
            $body
        }
    };
}

pub(super) use vectorized;

vectorized!(
    /// The softmax of one row.
    softmax_row_fn = softmax_row(row: &[f32], out: &mut [f32]) -> ()
);
vectorized!(
    /// Attention's softmax of one row of scores with its additive mask, in place and not normalized: the sum
    /// it returns divides the row's context instead (`head_dim` values, not `len`).
    masked_exp_row_fn = masked_exp_row(row: &mut [f32], mask: &[f32]) -> f32
);
vectorized!(
    /// `out = silu(gate) ⊙ up` for one row `[gate | up]`.
    silu_gate_row_fn = silu_gate_row(row: &[f32], out: &mut [f32]) -> ()
);
vectorized!(
    /// `out = gelu(gate) ⊙ up` for one row `[gate | up]`.
    gelu_gate_row_fn = gelu_gate_row(row: &[f32], out: &mut [f32]) -> ()
);
vectorized!(
    /// `silu_gate_row`'s gradient: `[dgate | dup]` of a row `[gate | up]` and its output's gradient.
    silu_gate_grad_row_fn = silu_gate_grad_row(row: &[f32], grad: &[f32], out: &mut [f32]) -> ()
);
vectorized!(
    /// `gelu_gate_row`'s gradient, as `silu_gate_grad_row`'s.
    gelu_gate_grad_row_fn = gelu_gate_grad_row(row: &[f32], grad: &[f32], out: &mut [f32]) -> ()
);
vectorized!(
    /// Softmax's backward pass for one row, in place: `grad ← probs ⊙ (grad − Σ grad ⊙ probs)`.
    softmax_grad_row_fn = softmax_grad_row(probs: &[f32], grad: &mut [f32]) -> ()
);
vectorized!(
    /// The exact GELU of `x + bias` in place, for whole rows of `bias`'s width.
    bias_gelu_rows_fn = bias_gelu_rows(x: &mut [f32], bias: &[f32]) -> ()
);
vectorized!(
    /// `x ← LayerNorm(x + shift + residual)` in place, for whole rows of the weight's width.
    add_norm_rows_fn =
        add_norm_rows(x: &mut [f32], residual: &[f32], shift: &[f32], weight: &[f32], bias: &[f32], eps: f32) -> ()
);

#[inline(always)]
fn softmax_grad_row(probs: &[f32], grad: &mut [f32]) {
    const LANES: usize = 32;
    let mut acc = [0f32; LANES];
    let (p_chunks, g_chunks) = (probs.chunks_exact(LANES), grad.chunks_exact(LANES));
    let rest: f32 = p_chunks.remainder().iter().zip(g_chunks.remainder()).map(|(p, g)| p * g).sum();
    for (p, g) in p_chunks.zip(g_chunks) {
        for ((a, p), g) in acc.iter_mut().zip(p).zip(g) {
            *a += p * g;
        }
    }
    let dot = acc.iter().sum::<f32>() + rest;
    grad.iter_mut().zip(probs).for_each(|(g, p)| *g = p * (*g - dot));
}

#[inline(always)]
fn masked_exp_row(row: &mut [f32], mask: &[f32]) -> f32 {
    row.iter_mut().zip(mask).for_each(|(s, m)| *s += m);
    let max = lanes(row, f32::NEG_INFINITY, max);
    row.iter_mut().for_each(|s| *s = exp(*s - max));
    lanes(row, 0.0, |a, b| a + b)
}

/// The exact GELU of `x + bias` in place, for whole rows of `bias`'s width; inlined into callers compiled for
/// wider vectors (`bias_gelu_rows_fn`, the packed products' last step).
#[inline(always)]
pub(super) fn bias_gelu_rows(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_mut(bias.len()) {
        for (v, &b) in row.iter_mut().zip(bias) {
            let y = *v + b;
            *v = 0.5 * y * (1.0 + erf(y * std::f32::consts::FRAC_1_SQRT_2));
        }
    }
}

#[inline(always)]
fn add_norm_rows(x: &mut [f32], residual: &[f32], shift: &[f32], weight: &[f32], bias: &[f32], eps: f32) {
    let width = weight.len();
    for (row, res) in x.chunks_mut(width).zip(residual.chunks(width)) {
        row.iter_mut().zip(res).zip(shift).for_each(|((v, r), s)| *v += r + s);
        let mean = lanes(row, 0.0, |a, b| a + b) / width as f32;
        let mut squares = [0f32; 8];
        let chunks = row.chunks_exact(8);
        let rest: f32 = chunks.remainder().iter().map(|v| (v - mean) * (v - mean)).sum();
        for chunk in chunks {
            for (s, v) in squares.iter_mut().zip(chunk) {
                *s += (v - mean) * (v - mean);
            }
        }
        let rstd = 1.0 / ((squares.iter().sum::<f32>() + rest) / width as f32 + eps).sqrt();
        for ((v, &w), &b) in row.iter_mut().zip(weight).zip(bias) {
            *v = (*v - mean) * rstd * w + b;
        }
    }
}

#[inline(always)]
fn silu_gate_row(row: &[f32], out: &mut [f32]) {
    let (gate, up) = row.split_at(out.len());
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + exp(-g)) * u;
    }
}

#[inline(always)]
fn gelu_gate_row(row: &[f32], out: &mut [f32]) {
    let (gate, up) = row.split_at(out.len());
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = 0.5 * g * (1.0 + erf(g * std::f32::consts::FRAC_1_SQRT_2)) * u;
    }
}

#[inline(always)]
fn silu_gate_grad_row(row: &[f32], grad: &[f32], out: &mut [f32]) {
    let ((gate, up), (d_gate, d_up)) = (row.split_at(grad.len()), out.split_at_mut(grad.len()));
    for ((((dg, du), &g), &u), &dy) in d_gate.iter_mut().zip(d_up).zip(gate).zip(up).zip(grad) {
        let sigmoid = 1.0 / (1.0 + exp(-g));
        *dg = dy * u * sigmoid * (1.0 + g * (1.0 - sigmoid));
        *du = dy * g * sigmoid;
    }
}

#[inline(always)]
fn gelu_gate_grad_row(row: &[f32], grad: &[f32], out: &mut [f32]) {
    let ((gate, up), (d_gate, d_up)) = (row.split_at(grad.len()), out.split_at_mut(grad.len()));
    let inv_sqrt_2pi = 0.5 * std::f32::consts::FRAC_2_SQRT_PI * std::f32::consts::FRAC_1_SQRT_2;
    for ((((dg, du), &g), &u), &dy) in d_gate.iter_mut().zip(d_up).zip(gate).zip(up).zip(grad) {
        let cdf = 0.5 * (1.0 + erf(g * std::f32::consts::FRAC_1_SQRT_2));
        *dg = dy * u * (cdf + g * inv_sqrt_2pi * exp(-0.5 * g * g));
        *du = dy * g * cdf;
    }
}

/// `out = softmax(row)` in passes without branches or ordered reductions, so that they vectorize.
#[inline(always)]
fn softmax_row(row: &[f32], out: &mut [f32]) {
    let max = lanes(row, f32::NEG_INFINITY, max);
    for (o, &v) in out.iter_mut().zip(row) {
        *o = exp(v - max);
    }
    let scale = 1.0 / lanes(out, 0.0, |a, b| a + b);
    out.iter_mut().for_each(|o| *o *= scale);
}

/// A reduction over 32 independent lanes: a float reduction in one running total would not vectorize, and in
/// one vector it would wait on its own latency every step (two to four vectors keep the units busy).
#[inline(always)]
fn lanes(x: &[f32], init: f32, f: impl Fn(f32, f32) -> f32) -> f32 {
    const LANES: usize = 32;
    let mut acc = [init; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder().iter().fold(init, |a, &v| f(a, v));
    for chunk in chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a = f(*a, v);
        }
    }
    acc.into_iter().fold(rest, f)
}

/// The larger of two floats as one `max` instruction (`f32::max` also orders NaN, three instructions a lane).
#[inline(always)]
fn max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// e^x without branches (Cephes' `expf`: x = n·ln 2 + r, a degree-6 polynomial in r, 2^n from the exponent
/// bits; relative error about 1e-7), so that softmax rows vectorize: libm's scalar `expf` took 9 % of an
/// inference pass. Inputs below −87.3 give about 1e-38 rather than 0.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // Adding 1.5 · 2^23 rounds to the nearest integer without a branch or an SSE4 instruction, and leaves that
    // integer in the low bits (floats in [2^23, 2^24) are one apart): no float-to-int conversion, which `as`
    // would do one lane at a time (it saturates) and which NaN would make undefined unchecked.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.3, 88.7);
    let shifted = x * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 1.666_666_5e-1)
        * r
        + 0.5;
    let e = p * r * r + r + 1.0;
    let n = shifted.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    e * f32::from_bits((n.wrapping_add(127) as u32) << 23)
}

/// dx = y ⊙ (g − Σ g ⊙ y), per row.
pub(super) struct SoftmaxBackward;

impl CustomOp2 for SoftmaxBackward {
    fn name(&self) -> &'static str {
        "softmax-last-dim-backward"
    }

    fn cpu_fwd(
        &self,
        s: &CpuStorage,
        l: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (probs, grad) = (slice(s, l, self.name())?, slice(gs, gl, self.name())?);
        let width = last_dim(l);
        let mut output = grad.to_vec();
        let grad_row = softmax_grad_row_fn();
        rows_mut(&mut output, width, |first, out| {
            for (g, y) in out.chunks_mut(width).zip(probs[first * width..].chunks(width)) {
                grad_row(y, g);
            }
        });
        Ok((CpuStorage::F32(output), l.shape().clone()))
    }
}

struct LayerNorm {
    eps: f32,
}

/// A row's mean and 1 / standard deviation.
fn moments(row: &[f32], eps: f32) -> (f32, f32) {
    let n = row.len() as f32;
    let mean = row.iter().sum::<f32>() / n;
    let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
    (mean, 1.0 / (var + eps).sqrt())
}

impl CustomOp3 for LayerNorm {
    fn name(&self) -> &'static str {
        "layer-norm"
    }

    fn cpu_fwd(
        &self,
        s: &CpuStorage,
        l: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
        bs: &CpuStorage,
        bl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (input, weight, bias) =
            (slice(s, l, self.name())?, slice(ws, wl, self.name())?, slice(bs, bl, self.name())?);
        let width = weight.len();
        if last_dim(l) != width || bias.len() != width {
            candle_core::bail!("layer-norm: weight {} and bias {} for rows of {:?}", width, bias.len(), l.shape());
        }
        let mut output = vec![0f32; input.len()];
        rows(input, width, &mut output, |_, inp, out| {
            for (row_in, row_out) in inp.chunks(width).zip(out.chunks_mut(width)) {
                let (mean, rstd) = moments(row_in, self.eps);
                for (((o, &v), &w), &b) in row_out.iter_mut().zip(row_in).zip(weight).zip(bias) {
                    *o = (v - mean) * rstd * w + b;
                }
            }
        });
        Ok((CpuStorage::F32(output), l.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        weight: &Tensor,
        _: &Tensor,
        _: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let packed = x.apply_op3_no_bwd(weight, &grad.contiguous()?, &LayerNormBackward { eps: self.eps })?;
        let rows = x.elem_count() / weight.elem_count();
        let dx = packed.narrow(0, 0, rows)?.reshape(x.shape())?;
        Ok((Some(dx), Some(packed.get(rows)?), Some(packed.get(rows + 1)?)))
    }
}

/// dx = rstd · (g⊙w − mean(g⊙w) − x̂ · mean(g⊙w⊙x̂)) per row, then the weight's Σ g⊙x̂ and the bias's Σ g over
/// rows as two more rows.
struct LayerNormBackward {
    eps: f32,
}

impl CustomOp3 for LayerNormBackward {
    fn name(&self) -> &'static str {
        "layer-norm-backward"
    }

    fn cpu_fwd(
        &self,
        s: &CpuStorage,
        l: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (input, weight, grad) =
            (slice(s, l, self.name())?, slice(ws, wl, self.name())?, slice(gs, gl, self.name())?);
        let width = weight.len();
        let n = input.len() / width;
        let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
        let per_chunk = n.div_ceil(threads).max(1);
        let mut output = vec![0f32; input.len() + 2 * width];
        let (dx, sums) = output.split_at_mut(input.len());
        // Each thread sums its rows' weight and bias gradients apart; the partial sums are added after.
        let partials: Vec<Vec<f32>> = std::thread::scope(|scope| {
            let handles: Vec<_> = input
                .chunks(per_chunk * width)
                .zip(dx.chunks_mut(per_chunk * width))
                .zip(grad.chunks(per_chunk * width))
                .map(|((inp, out), g)| {
                    scope.spawn(move || {
                        let mut partial = vec![0f32; 2 * width];
                        let mut gw = vec![0f32; width];
                        for ((x, o), g) in inp.chunks(width).zip(out.chunks_mut(width)).zip(g.chunks(width)) {
                            let (mean, rstd) = moments(x, self.eps);
                            let (mut mean_gw, mut mean_gw_xhat) = (0.0, 0.0);
                            for (i, ((&x, &g), &w)) in x.iter().zip(g).zip(weight).enumerate() {
                                let xhat = (x - mean) * rstd;
                                gw[i] = g * w;
                                mean_gw += gw[i];
                                mean_gw_xhat += gw[i] * xhat;
                                partial[i] += g * xhat;
                                partial[width + i] += g;
                            }
                            let (mean_gw, mean_gw_xhat) = (mean_gw / width as f32, mean_gw_xhat / width as f32);
                            for (i, (o, &x)) in o.iter_mut().zip(x).enumerate() {
                                let xhat = (x - mean) * rstd;
                                *o = rstd * (gw[i] - mean_gw - xhat * mean_gw_xhat);
                            }
                        }
                        partial
                    })
                })
                .collect();
            joined(handles)
        })?;
        for partial in partials {
            for (s, p) in sums.iter_mut().zip(partial) {
                *s += p;
            }
        }
        Ok((CpuStorage::F32(output), Shape::from((n + 2, width))))
    }
}

/// The partial results of scoped workers, or an error when one panicked (its part of the sums would be missing).
fn joined<T>(handles: Vec<std::thread::ScopedJoinHandle<'_, T>>) -> candle_core::Result<Vec<T>> {
    handles
        .into_iter()
        .map(|h| h.join().map_err(|_| candle_core::Error::Msg("a layer-norm-backward worker panicked".into())))
        .collect()
}

#[cfg(test)]
pub(super) mod tests {
    #[test]
    fn a_panicked_worker_is_an_error_not_a_missing_part() {
        let joined = std::thread::scope(|scope| {
            let handles = (0..3)
                .map(|i| {
                    scope.spawn(move || {
                        assert!(i != 1, "worker {i} fails");
                        vec![i as f32]
                    })
                })
                .collect();
            super::joined(handles)
        });
        assert!(joined.is_err());
        let fine = std::thread::scope(|scope| super::joined((0..3).map(|i| scope.spawn(move || i)).collect()));
        assert_eq!(fine.unwrap(), [0, 1, 2]);
    }

    #[test]
    fn the_band_softmax_reads_each_querys_window_of_real_keys_as_the_composite_does() {
        // Two sequences of 9 and 5 real positions, queries 2.. and keys 1.., a window of 2.
        let scores = random(&[2, 3, 4, 8], 9, 2.0);
        let lengths = [9, 5];
        let band = Band { first_query: 2, first_key: 1, window: Some(2), lengths: lengths.to_vec() };
        let fused = band_softmax(&scores, &band).unwrap();
        let plain = band_softmax(&scores.to_dtype(DType::F64).unwrap(), &band).unwrap().to_dtype(DType::F32).unwrap();
        let rows = fused.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let read = |row: &[f32]| row.iter().map(|p| (*p > 0.0) as u8).collect::<Vec<_>>();
        // Query 2 reads keys 1..=4 (columns 0..4); the second sequence's query 5 reads keys 3 and 4 only.
        assert_eq!(read(&rows[..8]), [1, 1, 1, 1, 0, 0, 0, 0]);
        assert_eq!(read(&rows[(12 + 3) * 8..(12 + 4) * 8]), [0, 0, 1, 1, 0, 0, 0, 0]);
        // Where the composite's finite mask spreads a keyless row over its columns, the kernel writes zeros.
        let empty = Band { first_query: 8, first_key: 0, window: Some(1), lengths: vec![9, 5] };
        let zeros = band_softmax(&random(&[2, 1, 1, 4], 3, 1.0), &empty).unwrap();
        assert_eq!(zeros.flatten_all().unwrap().to_vec1::<f32>().unwrap(), [0.0; 8]);
        let real = |t: &Tensor| t.narrow(0, 0, 1).unwrap();
        assert!(max_diff(&real(&fused), &real(&plain)) < 1e-6, "{}", max_diff(&real(&fused), &real(&plain)));
        let sums = fused.sum(D::Minus1).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(sums.iter().all(|s| (s - 1.0).abs() < 1e-5), "{sums:?}");
        // Every row here reads a key: values and gradients as a differentiable softmax's (in f64) under the band.
        let (b, _, r, c) = scores.dims4().unwrap();
        let mask: Vec<f64> = (0..b * r * c)
            .map(|i| if band.columns(i / (r * c), i / c % r, c).contains(&(i % c)) { 0.0 } else { -1e30 })
            .collect();
        let mask = Tensor::from_vec(mask, (b, 1, r, c), &Device::Cpu).unwrap();
        let plain = |x: &Tensor| {
            let masked = x.to_dtype(DType::F64).unwrap().broadcast_add(&mask).unwrap();
            candle_nn::ops::softmax(&masked, D::Minus1).unwrap().to_dtype(DType::F32).unwrap()
        };
        compare(&[scores], |t| band_softmax(&t[0], &band).unwrap(), |t| plain(&t[0]), 1e-5);
    }

    #[test]
    fn causal_softmax_and_the_gates_equal_candles_composites() {
        let scores = random(&[2, 3, 4, 9], 7, 2.0);
        // Queries from position 5 on, keys from 0: row r reads 6 + r keys.
        let fused = causal_softmax(&scores, 5).unwrap();
        let plain = causal_softmax(&scores.to_dtype(DType::F64).unwrap(), 5).unwrap().to_dtype(DType::F32).unwrap();
        assert!(max_diff(&fused, &plain) < 2e-6, "{}", max_diff(&fused, &plain));
        let last_row = fused.narrow(2, 3, 1).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(last_row.chunks(9).all(|row| row[..].iter().all(|p| *p > 0.0)), "the last row reads every key");
        let first_row = fused.narrow(2, 0, 1).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(first_row.chunks(9).all(|row| row[6..].iter().all(|p| *p == 0.0)), "nothing after position 5");
        let x = random(&[3, 2, 10], 8, 3.0);
        for gate in [silu_gate, gelu_gate] {
            let fused = gate(&x).unwrap();
            let plain = gate(&x.to_dtype(DType::F64).unwrap()).unwrap().to_dtype(DType::F32).unwrap();
            assert_eq!(fused.dims(), [3, 2, 5]);
            assert!(max_diff(&fused, &plain) < 1e-5, "{}", max_diff(&fused, &plain));
        }
    }

    #[test]
    fn the_branch_free_exp_is_within_a_few_ulps() {
        let mut worst = 0f64;
        for i in 0..=200_000 {
            let x = -87.0 + 175.0 * i as f32 / 200_000.0;
            let (got, want) = (super::exp(x) as f64, (x as f64).exp());
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(worst < 3e-7, "relative error {worst}");
        assert!(super::exp(f32::MIN) < 1e-37 && super::exp(f32::NEG_INFINITY) < 1e-37);
    }

    use super::*;
    use candle_core::{Device, Var};

    pub(in crate::model::cpu) fn random(shape: &[usize], seed: u64, scale: f64) -> Tensor {
        let mut rng = crate::rng::Rng::new(seed);
        let n = shape.iter().product();
        let values: Vec<f32> = (0..n).map(|_| (rng.normal() * scale) as f32).collect();
        Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
    }

    pub(in crate::model::cpu) fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
    }

    /// Values and gradients of `fused` and `plain` on the same variables, under a random linear loss.
    pub(in crate::model::cpu) fn compare(
        inputs: &[Tensor],
        fused: impl Fn(&[Tensor]) -> Tensor,
        plain: impl Fn(&[Tensor]) -> Tensor,
        tolerance: f32,
    ) {
        let vars: Vec<Var> = inputs.iter().map(|t| Var::from_tensor(t).unwrap()).collect();
        let tensors: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
        let (a, b) = (fused(&tensors), plain(&tensors));
        assert!(max_diff(&a, &b) < tolerance, "values differ by {}", max_diff(&a, &b));
        let weights = random(a.dims(), 99, 1.0);
        let ga = (&a * &weights).unwrap().sum_all().unwrap().backward().unwrap();
        let gb = (&b * &weights).unwrap().sum_all().unwrap().backward().unwrap();
        for (i, v) in vars.iter().enumerate() {
            let (x, y) = (ga.get(v.as_tensor()).unwrap(), gb.get(v.as_tensor()).unwrap());
            let scale = y.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap().max(1.0);
            assert!(max_diff(x, y) / scale < tolerance, "gradient {i} differs by {}", max_diff(x, y));
        }
    }

    #[test]
    fn fused_bias_gelu_matches_candles_exact_one_with_gradients() {
        let x = random(&[3, 50, 64], 1, 3.0);
        let bias = random(&[64], 2, 1.0);
        compare(
            &[x, bias],
            |t| t[0].apply_op2(&t[1], BiasGelu).unwrap(),
            |t| t[0].broadcast_add(&t[1]).unwrap().gelu_erf().unwrap(),
            2e-5,
        );
    }

    #[test]
    fn the_gates_match_candles_composites_with_gradients() {
        // Rows of 37 values a half: past the vectorized passes' lanes and not a multiple of them.
        let x = random(&[3, 4, 2 * 37], 9, 3.0);
        let plain = |gate: fn(&Tensor) -> candle_core::Result<Tensor>, x: &Tensor| {
            gate(&x.to_dtype(DType::F64).unwrap()).unwrap().to_dtype(DType::F32).unwrap()
        };
        for gate in [silu_gate, gelu_gate] {
            compare(std::slice::from_ref(&x), |t| gate(&t[0]).unwrap(), |t| plain(gate, &t[0]), 2e-5);
        }
    }

    #[test]
    fn fused_softmax_matches_the_composite_one_with_gradients() {
        let x = random(&[2, 3, 40, 40], 3, 4.0);
        compare(
            &[x],
            |t| t[0].apply_op1(Softmax).unwrap(),
            |t| candle_nn::ops::softmax(&t[0], D::Minus1).unwrap(),
            1e-5,
        );
    }

    #[test]
    fn fused_layer_norm_matches_the_composite_one_with_gradients() {
        let x = (random(&[4, 30, 48], 4, 2.0) + 0.5).unwrap();
        let (w, b) = ((random(&[48], 5, 0.3) + 1.0).unwrap(), random(&[48], 6, 0.3));
        compare(
            &[x, w, b],
            |t| t[0].apply_op3(&t[1], &t[2], LayerNorm { eps: 1e-12 }).unwrap(),
            |t| candle_nn::ops::layer_norm_slow(&t[0], &t[1], &t[2], 1e-12).unwrap(),
            1e-4,
        );
    }

    #[test]
    fn in_place_inference_kernels_match_the_plain_chains() {
        // Widths that are not a multiple of the 8 lanes exercise the remainders.
        let (y, residual) = ((random(&[3, 21, 52], 7, 2.0) + 0.5).unwrap(), random(&[3, 21, 52], 8, 1.0));
        let norm = candle_nn::LayerNorm::new((random(&[52], 9, 0.3) + 1.0).unwrap(), random(&[52], 10, 0.3), 1e-12);
        let shift = random(&[52], 13, 1.0);
        let sum = (y.broadcast_add(&shift).unwrap() + &residual).unwrap();
        let want = candle_nn::ops::layer_norm_slow(&sum, norm.weight(), norm.bias().unwrap(), 1e-12).unwrap();
        let got = add_layer_norm_in_place(y.copy().unwrap(), &shift, &residual, &norm, 1e-12).unwrap();
        assert!(max_diff(&got, &want) < 1e-5, "add + LayerNorm differs by {}", max_diff(&got, &want));

        let (x, bias) = (random(&[2, 33, 70], 11, 3.0), random(&[70], 12, 1.0));
        let want = x.broadcast_add(&bias).unwrap().gelu_erf().unwrap();
        let got = bias_gelu_in_place(x.copy().unwrap(), &bias).unwrap();
        assert!(max_diff(&got, &want) < 2e-5, "bias + GELU differs by {}", max_diff(&got, &want));
    }
}
