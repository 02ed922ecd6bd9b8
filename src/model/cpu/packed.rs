//! The built-in kernels' linear layers where the CPU has AVX-512: `x · Wᵀ` with `W` packed once at load into
//! the micro-kernel's layout. `gemm` repacks its right-hand side on every call, one call per sequence and
//! product, which took 18 % of an encoder's time at 128 tokens (BENCHMARKS.md). Each output is its row's
//! dot product summed over the inputs in order, one fused multiply-add at a time, so its bits depend on
//! that row alone: neither the rows beside it, nor the call's size, nor the thread. That is what lets one
//! call take rows of many sequences (and the rows of a batch be split over the threads however it comes).

/// Output columns per panel: three AVX-512 vectors.
const PANEL: usize = 48;
/// Rows per tile: 24 accumulators, three weight vectors and a broadcast fit AVX-512's 32 registers. A tile
/// reads its rows where they are (eight pointers), so the inputs are never copied into another layout.
const TILE_ROWS: usize = 8;
/// Rows per block: every panel passes over a block's rows before the next block, so a panel (`inputs × 48`
/// weights, 72 to 288 KiB) is read from memory once a block and from L2 for the block's other tiles, and
/// the block's inputs (up to 576 KiB) stay in L2 meanwhile. 96 measured a few % faster than 48, 144 or 192.
const BLOCK_ROWS: usize = 96;
/// How many inputs ahead a tile asks for its panel's weights: the hardware alone does not keep up with three
/// vectors a step, and a panel's first tile reads it from L3 (16 ahead left that latency exposed: 32 took a
/// whole pass 9 % faster at 128 tokens; 48 and 64 were no better; BENCHMARKS.md).
const PREFETCH: usize = 32;

/// A weight `[outputs, inputs]` in panels of `PANEL` outputs: panel p holds, for each input, its `PANEL`
/// weights contiguous (zeros past the last output).
pub(super) struct Packed {
    panels: Vec<f32>,
    outputs: usize,
    inputs: usize,
}

impl Packed {
    /// The weight packed, or `None` where the CPU lacks AVX-512.
    pub(super) fn new(weight: &[f32], outputs: usize, inputs: usize) -> Option<Packed> {
        if !available() || weight.len() != outputs * inputs {
            return None;
        }
        let mut panels = vec![0f32; outputs.div_ceil(PANEL) * inputs * PANEL];
        for (o, row) in weight.chunks_exact(inputs).enumerate() {
            let panel = &mut panels[o / PANEL * inputs * PANEL..];
            for (i, w) in row.iter().enumerate() {
                panel[i * PANEL + o % PANEL] = *w;
            }
        }
        Some(Packed { panels, outputs, inputs })
    }

    /// The weight `[outputs, inputs]` row-major again.
    pub(super) fn unpacked(&self) -> Vec<f32> {
        let (n, k) = (self.outputs, self.inputs);
        (0..n * k).map(|at| self.panels[at / k / PANEL * k * PANEL + at % k * PANEL + at / k % PANEL]).collect()
    }

    /// `c[r] = x[r] · Wᵀ` for each row index `r` of `rows`, or with `gelu_bias` the exact GELU of
    /// `x[r] · Wᵀ + bias`: rows of `x` hold `inputs` values, rows of `c` `outputs`. The outputs of the whole
    /// panels before output `from` are zeros instead (outputs nobody reads).
    ///
    /// # Safety
    /// `x` and `c` must hold every row named, `inputs` and `outputs` values apart.
    pub(super) unsafe fn rows(
        &self,
        x: *const f32,
        rows: &[usize],
        c: *mut f32,
        gelu_bias: Option<&[f32]>,
        from: usize,
    ) {
        // SAFETY: `x` and `c` hold every row named (the caller's contract); the product runs where `available()` made
        // the weights packed.
        unsafe {
            let skipped = from.min(self.outputs) / PANEL * PANEL;
            for row in rows {
                std::ptr::write_bytes(c.add(row * self.outputs), 0, skipped);
            }
            #[cfg(target_arch = "x86_64")]
            avx512::product(self, x, rows, c, gelu_bias, skipped / PANEL);
            #[cfg(not(target_arch = "x86_64"))]
            unreachable!("packed only where AVX-512 is, {x:?} {rows:?} {c:?} {gelu_bias:?}");
        }
    }
}

/// Whether the CPU has AVX-512 (what the kernels need).
pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{Packed, BLOCK_ROWS, PANEL, PREFETCH, TILE_ROWS};

    /// Where a tile reads and writes: `x` and `c` the whole inputs and outputs (rows `k` and `n` apart),
    /// `panel` the panel's weights, `columns` its real outputs (fewer than `PANEL` in a last panel), and the
    /// bias of the GELU to apply to them, if any.
    #[derive(Clone, Copy)]
    struct Tile<'a> {
        x: *const f32,
        k: usize,
        panel: *const f32,
        c: *mut f32,
        n: usize,
        columns: usize,
        gelu_bias: Option<&'a [f32]>,
    }

    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn product(
        w: &Packed,
        x: *const f32,
        rows: &[usize],
        c: *mut f32,
        gelu_bias: Option<&[f32]>,
        first_panel: usize,
    ) {
        // SAFETY: the caller's contract (`Packed::rows`): `x` and `c` hold every row named; AVX-512 is enabled for
        // this function.
        unsafe {
            let (n, k) = (w.outputs, w.inputs);
            for block in rows.chunks(BLOCK_ROWS) {
                for p in first_panel..n.div_ceil(PANEL) {
                    let columns = PANEL.min(n - p * PANEL);
                    let tile = Tile {
                        x,
                        k,
                        panel: w.panels.as_ptr().add(p * k * PANEL),
                        c: c.add(p * PANEL),
                        n,
                        columns,
                        gelu_bias: gelu_bias.map(|b| &b[p * PANEL..p * PANEL + columns]),
                    };
                    for rows in block.chunks(TILE_ROWS) {
                        tile_of(tile, rows);
                    }
                }
            }
        }
    }

    /// `tile::<rows>`, the row count known at compile time so that the accumulators stay in registers.
    #[inline(always)]
    unsafe fn tile_of(t: Tile, rows: &[usize]) {
        // SAFETY: as `tile`'s: the caller's tile and rows lie inside its buffers.
        unsafe {
            match rows.len() {
                8 => tile::<8>(t, rows),
                7 => tile::<7>(t, rows),
                6 => tile::<6>(t, rows),
                5 => tile::<5>(t, rows),
                4 => tile::<4>(t, rows),
                3 => tile::<3>(t, rows),
                2 => tile::<2>(t, rows),
                _ => tile::<1>(t, rows),
            }
        }
    }

    /// `R` rows by one panel over every input, from zero: each output one in-order chain of fused
    /// multiply-adds.
    #[inline(always)]
    unsafe fn tile<const R: usize>(t: Tile, rows: &[usize]) {
        // SAFETY: `t`'s pointers hold every row of `rows` and the panel's outputs (the caller's contract); AVX-512 is
        // enabled in the functions that inline this one.
        unsafe {
            const { assert!(R <= TILE_ROWS) };
            let mask = |v: usize| ((1u32 << t.columns.saturating_sub(16 * v).min(16)) - 1) as __mmask16;
            let masks = [mask(0), mask(1), mask(2)];
            let inputs: [*const f32; R] = std::array::from_fn(|r| t.x.add(rows[r] * t.k));
            let mut acc = [[_mm512_setzero_ps(); 3]; R];
            // The outputs' lines asked for, to be written, while the sums run: their stores waited on memory.
            for row in rows {
                let out = t.c.add(row * t.n);
                for v in 0..3 {
                    _mm_prefetch::<_MM_HINT_ET0>(out.wrapping_add(16 * v) as *const i8);
                }
            }
            for i in 0..t.k {
                let w = t.panel.add(i * PANEL);
                // Past the panel's end this asks for the next panel's first weights, or for an address that a
                // prefetch does not fault on (hence `wrapping_add`).
                for v in 0..3 {
                    _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(PREFETCH * PANEL + 16 * v) as *const i8);
                }
                let b = [_mm512_loadu_ps(w), _mm512_loadu_ps(w.add(16)), _mm512_loadu_ps(w.add(32))];
                for (acc, input) in acc.iter_mut().zip(inputs) {
                    let a = _mm512_set1_ps(*input.add(i));
                    for (acc, b) in acc.iter_mut().zip(b) {
                        *acc = _mm512_fmadd_ps(a, b, *acc);
                    }
                }
            }
            for (acc, row) in acc.iter().zip(rows) {
                let out = t.c.add(row * t.n);
                for (v, acc) in acc.iter().enumerate() {
                    _mm512_mask_storeu_ps(out.add(16 * v), masks[v], *acc);
                }
                if let Some(bias) = t.gelu_bias {
                    crate::model::cpu::kernels::bias_gelu_rows(std::slice::from_raw_parts_mut(out, t.columns), bias);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a plain in-order sum of fused multiply-adds: every tile size, blocks and a last panel part
    /// full, rows named out of order and with gaps; each row's bits the same computed alone.
    #[test]
    fn packed_products_are_each_rows_own_in_order_sum() {
        let (outputs, inputs) = (2 * PANEL + 22, 405);
        // Distinct rows, out of order, six left out.
        let rows: Vec<usize> = (0..BLOCK_ROWS + 3 * TILE_ROWS + 5).map(|r| r * 53 % 131).collect();
        let count = rows.iter().max().unwrap() + 1;
        let value = |i: usize, salt: usize| (((i * 7919 + salt) % 2003) as f32 - 1001.0) / 997.0;
        let weight: Vec<f32> = (0..outputs * inputs).map(|i| value(i, 1)).collect();
        let Some(packed) = Packed::new(&weight, outputs, inputs) else {
            // CI sets the variable on CPUs with AVX-512 (from /proc/cpuinfo): there, the kernel must run.
            assert!(std::env::var_os("LONGRANK_EXPECT_AVX512").is_none(), "the packed kernel was expected to run");
            return;
        };
        assert_eq!(packed.unpacked(), weight);
        let x: Vec<f32> = (0..count * inputs).map(|i| value(i, 2)).collect();
        let mut c = vec![f32::NAN; count * outputs];
        // SAFETY: the buffers hold every row named.
        unsafe { packed.rows(x.as_ptr(), &rows, c.as_mut_ptr(), None, 0) };
        for r in 0..count {
            let got: Vec<u32> = c[r * outputs..(r + 1) * outputs].iter().map(|v| v.to_bits()).collect();
            if !rows.contains(&r) {
                assert!(got.iter().all(|v| f32::from_bits(*v).is_nan()), "row {r} not named, not written");
                continue;
            }
            let row = &x[r * inputs..(r + 1) * inputs];
            let want: Vec<u32> = weight
                .chunks_exact(inputs)
                .map(|w| row.iter().zip(w).fold(0f32, |sum, (a, b)| a.mul_add(*b, sum)).to_bits())
                .collect();
            assert_eq!(got, want, "row {r}");
            let mut alone = vec![0f32; outputs];
            // SAFETY: one row and room for its outputs.
            unsafe { packed.rows(row.as_ptr(), &[0], alone.as_mut_ptr(), None, 0) };
            assert_eq!(alone.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want, "row {r} alone");
        }
        // With a GELU's bias: each output the exact GELU of that sum plus its bias, as the row kernel gives it.
        let bias: Vec<f32> = (0..outputs).map(|o| value(o, 3)).collect();
        let mut gelu = vec![f32::NAN; count * outputs];
        // SAFETY: as above.
        unsafe { packed.rows(x.as_ptr(), &rows, gelu.as_mut_ptr(), Some(&bias), 0) };
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for &r in &rows {
            let mut want = c[r * outputs..(r + 1) * outputs].to_vec();
            crate::model::cpu::kernels::bias_gelu_rows(&mut want, &bias);
            assert_eq!(bits(&gelu[r * outputs..(r + 1) * outputs]), bits(&want), "row {r} with the GELU");
        }
        // From an output inside the second panel: the first panel's outputs zeros, the rest as before.
        let mut from = vec![f32::NAN; count * outputs];
        // SAFETY: as above.
        unsafe { packed.rows(x.as_ptr(), &rows, from.as_mut_ptr(), None, PANEL + 5) };
        for &r in &rows {
            let (got, want) = (&from[r * outputs..(r + 1) * outputs], &c[r * outputs..(r + 1) * outputs]);
            assert!(got[..PANEL].iter().all(|v| v.to_bits() == 0), "row {r}: a panel before `from` is zeros");
            assert_eq!(bits(&got[PANEL..]), bits(&want[PANEL..]), "row {r} from the second panel");
        }
    }
}
