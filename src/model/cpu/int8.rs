//! int8 linear layers for inference on CPUs with AVX-512 VNNI: the weights quantized once per output row
//! (symmetric, one scale each), each activation row quantized on the fly (symmetric, one scale, stored as
//! unsigned bytes offset by 128 because `vpdpbusd` multiplies unsigned by signed bytes), products accumulated
//! in 32-bit integers four at a time, then `y = s_x · s_w · (acc − 128 · Σ w)`. This is onnxruntime's
//! dynamic quantization of a MatMul; candle's Q8_0 (blocks of 32 with a scale each) needs a float scale per
//! block inside the inner loop and ran slower than our float path.

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};

use super::blas::{split, written, Shared};

/// Output columns per packed tile: one 512-bit register of 32-bit accumulators.
const TILE: usize = 16;
/// Rows per micro-kernel call: 8 rows × 2 tiles keep 16 accumulators in registers.
const ROWS: usize = 8;

/// A linear layer's product `x · Wᵀ` with int8 weights (the encoder adds each bias in a later pass).
pub struct Int8Linear {
    /// Per tile of 16 outputs, per group of 4 inputs, the 16 × 4 weights (output-major): what one `vpdpbusd`
    /// multiplies against one broadcast group of 4 activations.
    packed: Vec<i8>,
    /// Per output: its scale, and 128 · Σ of its quantized weights (the offset of the unsigned activations).
    scales: Vec<f32>,
    offsets: Vec<i32>,
    outputs: usize,
    inputs: usize,
}

/// Whether this CPU runs the int8 kernel.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

impl Int8Linear {
    /// From float `weight` (`[outputs, inputs]`).
    pub fn new(weight: &Tensor) -> candle_core::Result<Int8Linear> {
        let (outputs, inputs) = weight.dims2()?;
        let w: Vec<f32> = weight.flatten_all()?.to_vec1()?;
        let groups = inputs.div_ceil(4);
        let tiles = outputs.div_ceil(TILE);
        let mut packed = vec![0i8; tiles * groups * TILE * 4];
        let (mut scales, mut offsets) = (vec![0f32; outputs], vec![0i32; outputs]);
        for (o, row) in w.chunks(inputs).enumerate() {
            let max = row.iter().fold(0f32, |m, v| m.max(v.abs()));
            let scale = if max > 0.0 { max / 127.0 } else { 1.0 };
            let (tile, lane) = (o / TILE, o % TILE);
            let mut sum = 0i32;
            for (i, v) in row.iter().enumerate() {
                let q = (v / scale).round().clamp(-127.0, 127.0) as i8;
                sum += q as i32;
                packed[((tile * groups + i / 4) * TILE + lane) * 4 + i % 4] = q;
            }
            scales[o] = scale;
            offsets[o] = 128 * sum;
        }
        Ok(Int8Linear { packed, scales, offsets, outputs, inputs })
    }

    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        x.contiguous()?.apply_op1_no_bwd(self)
    }

    /// Activation rows as unsigned bytes (value + 128, each row padded to whole groups of 4 with the
    /// zero point) and their scales; rows padded to a multiple of `ROWS`.
    fn quantize_rows(&self, x: &[f32], rows: usize) -> (Vec<u8>, Vec<f32>) {
        let stride = self.inputs.div_ceil(4) * 4;
        let padded = rows.div_ceil(ROWS) * ROWS;
        let mut bytes = vec![128u8; padded * stride];
        let mut scales = vec![0f32; padded];
        let quantize = quantize_row_fn();
        for ((row, out), scale) in x.chunks(self.inputs).zip(bytes.chunks_mut(stride)).zip(&mut scales) {
            *scale = quantize(row, &mut out[..self.inputs]);
        }
        (bytes, scales)
    }
}

impl CustomOp1 for Int8Linear {
    fn name(&self) -> &'static str {
        "int8-linear"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (CpuStorage::F32(data), Some((start, end))) = (storage, layout.contiguous_offsets()) else {
            candle_core::bail!("int8-linear takes contiguous f32 inputs")
        };
        let mut dims = layout.shape().dims().to_vec();
        if dims.last() != Some(&self.inputs) {
            candle_core::bail!("int8-linear: input {dims:?}, weight [{}, {}]", self.outputs, self.inputs);
        }
        if !available() {
            candle_core::bail!("int8-linear needs AVX-512 VNNI");
        }
        let x = &data[start..end];
        let (rows, n, k) = (x.len() / self.inputs, self.outputs, self.inputs);
        let out = written(rows * n, |y| {
            let y = Shared(y);
            // Each thread quantizes its own rows, then multiplies them.
            split(rows.div_ceil(ROWS), candle_core::utils::get_num_threads(), |blocks| {
                let mine = blocks.start * ROWS..(blocks.end * ROWS).min(rows);
                let (bytes, scales) = self.quantize_rows(&x[mine.start * k..mine.end * k], mine.len());
                for block in 0..blocks.len() {
                    // SAFETY: VNNI was detected; the block's rows are inside the padded activations and its
                    // output rows (the real ones only) are this thread's.
                    unsafe { self.block(&bytes, &scales, block, mine.len(), y.ptr().add(mine.start * n)) };
                }
            });
        });
        dims.pop();
        dims.push(n);
        Ok((CpuStorage::F32(out), Shape::from(dims)))
    }
}

#[cfg(target_arch = "x86_64")]
impl Int8Linear {
    /// Rows `block · ROWS ..` (at most `rows`) of the output, every tile.
    #[target_feature(enable = "avx512f,avx512vnni")]
    unsafe fn block(&self, bytes: &[u8], row_scales: &[f32], block: usize, rows: usize, y: *mut f32) {
        // SAFETY: called where `available()` (AVX-512 VNNI); `bytes` holds `rows` quantized rows and `y` room for
        // their outputs (the caller's contract).
        unsafe {
            use std::arch::x86_64::*;
            let groups = self.inputs.div_ceil(4);
            let stride = groups * 4;
            let first = block * ROWS;
            let real = (rows - first).min(ROWS);
            let x = bytes[first * stride..].as_ptr();
            let tiles = self.outputs.div_ceil(TILE);
            let tile_bytes = groups * TILE * 4;
            let mut tile = 0;
            while tile < tiles {
                let pair = (tiles - tile).min(2);
                let w0 = self.packed[tile * tile_bytes..].as_ptr();
                let w1 = if pair == 2 { self.packed[(tile + 1) * tile_bytes..].as_ptr() } else { w0 };
                let mut acc = [[_mm512_setzero_si512(); 2]; ROWS];
                for g in 0..groups {
                    let b0 = _mm512_loadu_si512(w0.add(g * TILE * 4) as *const _);
                    let b1 = _mm512_loadu_si512(w1.add(g * TILE * 4) as *const _);
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let a = _mm512_set1_epi32((x.add(r * stride + g * 4) as *const i32).read_unaligned());
                        acc[0] = _mm512_dpbusd_epi32(acc[0], a, b0);
                        acc[1] = _mm512_dpbusd_epi32(acc[1], a, b1);
                    }
                }
                for t in 0..pair {
                    let column = (tile + t) * TILE;
                    let width = (self.outputs - column).min(TILE);
                    let mask: __mmask16 = if width == TILE { !0 } else { (1u16 << width) - 1 };
                    let w_scale = _mm512_maskz_loadu_ps(mask, self.scales[column..].as_ptr());
                    let offset = _mm512_maskz_loadu_epi32(mask, self.offsets[column..].as_ptr());
                    for (r, acc) in acc.iter().enumerate().take(real) {
                        let value = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[t], offset));
                        let scale = _mm512_mul_ps(w_scale, _mm512_set1_ps(row_scales[first + r]));
                        let out = _mm512_mul_ps(value, scale);
                        _mm512_mask_storeu_ps(y.add((first + r) * self.outputs + column), mask, out);
                    }
                }
                tile += pair;
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
impl Int8Linear {
    unsafe fn block(&self, _: &[u8], _: &[f32], _: usize, _: usize, _: *mut f32) {
        unreachable!("int8-linear runs only where `available()`")
    }
}

super::kernels::vectorized!(
    /// Quantizes one row into `out` (value / scale + 128, rounded), returning the scale.
    quantize_row_fn = quantize_row(row: &[f32], out: &mut [u8]) -> f32
);

#[inline(always)]
fn quantize_row(row: &[f32], out: &mut [u8]) -> f32 {
    // Adding 1.5 · 2^23 rounds to an integer whose low byte is then the value's two's complement: no
    // float-to-int conversion (a saturating `as` would not vectorize).
    const ROUND: f32 = 12_582_912.0;
    let max = row.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = if max > 0.0 { max / 127.0 } else { 1.0 };
    let inverse = 1.0 / scale;
    for (o, v) in out.iter_mut().zip(row) {
        *o = ((v * inverse + ROUND).to_bits() as u8).wrapping_add(128);
    }
    scale
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Module};

    #[test]
    fn int8_linear_is_the_float_product_within_quantization_error() {
        if !available() {
            // CI sets the variable on CPUs with AVX-512 VNNI (from /proc/cpuinfo): there, the kernel must run.
            assert!(std::env::var_os("LONGRANK_EXPECT_INT8").is_none(), "the int8 kernel was expected to run");
            return;
        }
        let device = Device::Cpu;
        let mut rng = crate::rng::Rng::new(5);
        let mut normal = |n: usize, sd: f64| -> Vec<f32> { (0..n).map(|_| (rng.normal() * sd) as f32).collect() };
        // Widths off the 4-input groups and 16-output tiles, and rows off the 8-row blocks.
        for (outputs, inputs, rows) in [(37, 30, 11), (384, 384, 16), (48, 1536, 3)] {
            let (w, xs) = (normal(outputs * inputs, 0.1), normal(rows * inputs, 1.0));
            let weight = Tensor::from_vec(w.clone(), (outputs, inputs), &device).unwrap();
            let x = Tensor::from_vec(xs.clone(), (rows, inputs), &device).unwrap();
            let want = candle_nn::Linear::new(weight.clone(), None).forward(&x).unwrap().to_vec2::<f32>().unwrap();
            let got = Int8Linear::new(&weight).unwrap().forward(&x).unwrap().to_vec2::<f32>().unwrap();
            assert_eq!((got.len(), got[0].len()), (rows, outputs));
            // Each factor is off by at most half its row's step (max |row| / 127): each output by at most
            // Σ |w| · step_x / 2 + |x| · step_w / 2 + step_x · step_w / 4, and a little float rounding.
            let step = |row: &[f32]| row.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            for (r, x_row) in xs.chunks(inputs).enumerate() {
                for (o, w_row) in w.chunks(inputs).enumerate() {
                    let (sx, sw) = (step(x_row), step(w_row));
                    let bound: f32 =
                        x_row.iter().zip(w_row).map(|(x, w)| w.abs() * sx / 2.0 + x.abs() * sw / 2.0).sum();
                    let bound = bound + inputs as f32 * sx * sw / 4.0 + 1e-4 * want[r][o].abs() + 1e-5;
                    let err = (got[r][o] - want[r][o]).abs();
                    assert!(err <= bound, "{outputs}×{inputs}, row {r} output {o}: error {err}, bound {bound}");
                }
            }
        }
    }

    #[test]
    fn quantized_rows_round_to_the_nearest_step() {
        let row = [0.0f32, 1.0, -1.0, 0.5, -0.26, 0.004];
        let mut out = [0u8; 6];
        let scale = quantize_row(&row, &mut out);
        assert!((scale - 1.0 / 127.0).abs() < 1e-9);
        assert_eq!(out, [128, 255, 1, 128 + 64, 128 - 33, 129]);
    }
}
