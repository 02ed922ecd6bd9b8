//! The built-in kernels' linear layers where the CPU has AVX-512: `x · Wᵀ` with `W` packed once at load into
//! the micro-kernel's layout. `gemm` repacks its right-hand side on every call, one call per sequence and
//! product, which took 18 % of an encoder's time at 128 tokens (BENCHMARKS.md). Each output is its row's
//! dot product summed over the inputs in order, one fused multiply-add at a time, so its bits depend on
//! that row alone: neither the rows beside it, nor the call's size, nor the thread.

/// Output columns per panel: two AVX-512 vectors.
const PANEL: usize = 32;
/// Rows per tile: 24 accumulators, two weight vectors and a broadcast fit AVX-512's 32 registers.
const TILE_ROWS: usize = 12;
/// Inputs per pass over the panels: a panel's slice (`DEPTH × PANEL` values, 24 KiB) stays in L1 while
/// every tile of rows passes over it. Cutting the sum there changes no bits: the next pass reloads the
/// partial sums and goes on with the same order of operations.
const DEPTH: usize = 192;

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

    /// `c = x · Wᵀ` for `rows` rows of `x` (`inputs` values each, contiguous) into `c` (`outputs` each).
    ///
    /// # Safety
    /// `x` must hold `rows × inputs` values and `c` room for `rows × outputs`.
    pub(super) unsafe fn rows(&self, x: *const f32, rows: usize, c: *mut f32) {
        #[cfg(target_arch = "x86_64")]
        avx512::product(self, x, rows, c);
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("packed only where AVX-512 is, {x:?} {rows} {c:?}");
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

    use super::{Packed, DEPTH, PANEL, TILE_ROWS};

    /// Where a tile reads and writes: `a` its rows' inputs for the pass, packed (input by input, the tile's
    /// rows contiguous), `b` the panel's slice for the pass, `c` its outputs (rows `ldc` apart), `columns`
    /// the panel's real outputs (fewer than `PANEL` in a last panel).
    #[derive(Clone, Copy)]
    struct Tile {
        a: *const f32,
        b: *const f32,
        /// Weights to bring into the cache meanwhile (the next panel's slice in the panel's last tile).
        next: *const f32,
        c: *mut f32,
        ldc: usize,
        columns: usize,
    }

    thread_local! {
        /// A pass's inputs packed tile by tile: rows × DEPTH values at most.
        static INPUTS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn product(w: &Packed, x: *const f32, rows: usize, c: *mut f32) {
        let (n, k) = (w.outputs, w.inputs);
        INPUTS.with_borrow_mut(|inputs| {
            for start in (0..k).step_by(DEPTH) {
                let depth = DEPTH.min(k - start);
                // Each tile's rows, input by input: one pointer walks them, where rows `k` apart would take
                // an address computation per row and input.
                // Grown once per thread, then overwritten: no pass clearing it.
                if inputs.len() < rows * depth {
                    inputs.resize(rows * depth, 0.0);
                }
                for (tile, packed) in inputs[..rows * depth].chunks_mut(TILE_ROWS * depth).enumerate() {
                    let take = packed.len() / depth;
                    for r in 0..take {
                        let row = std::slice::from_raw_parts(x.add((tile * TILE_ROWS + r) * k + start), depth);
                        for (i, v) in row.iter().enumerate() {
                            *packed.get_unchecked_mut(i * take + r) = *v;
                        }
                    }
                }
                let slice = |p: usize| w.panels.as_ptr().add((p * k + start) * PANEL);
                let panels = n.div_ceil(PANEL);
                for p in 0..panels {
                    let b = slice(p);
                    let next = if p + 1 < panels { slice(p + 1) } else { b };
                    let mut tile = Tile {
                        a: inputs.as_ptr(),
                        b,
                        next: b,
                        c: c.add(p * PANEL),
                        ldc: n,
                        columns: PANEL.min(n - p * PANEL),
                    };
                    let mut left = rows;
                    while left > 0 {
                        let take = left.min(TILE_ROWS);
                        if left == take {
                            tile.next = next;
                        }
                        tile_of(take, tile, depth, start == 0);
                        tile.a = tile.a.add(take * depth);
                        tile.c = tile.c.add(take * n);
                        left -= take;
                    }
                }
            }
        })
    }

    /// `tile::<rows>`, the row count known at compile time so that the accumulators stay in registers.
    #[inline(always)]
    unsafe fn tile_of(rows: usize, t: Tile, depth: usize, first: bool) {
        match rows {
            12 => tile::<12>(t, depth, first),
            11 => tile::<11>(t, depth, first),
            10 => tile::<10>(t, depth, first),
            9 => tile::<9>(t, depth, first),
            8 => tile::<8>(t, depth, first),
            7 => tile::<7>(t, depth, first),
            6 => tile::<6>(t, depth, first),
            5 => tile::<5>(t, depth, first),
            4 => tile::<4>(t, depth, first),
            3 => tile::<3>(t, depth, first),
            2 => tile::<2>(t, depth, first),
            _ => tile::<1>(t, depth, first),
        }
    }

    /// `R` rows by one panel over `depth` inputs, added to the partial sums in `c` unless `first`.
    #[inline(always)]
    unsafe fn tile<const R: usize>(t: Tile, depth: usize, first: bool) {
        const { assert!(R <= TILE_ROWS) };
        let mask = |v: usize| ((1u32 << t.columns.saturating_sub(16 * v).min(16)) - 1) as __mmask16;
        let masks = [mask(0), mask(1)];
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        if !first {
            for (r, acc) in acc.iter_mut().enumerate() {
                for (v, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm512_maskz_loadu_ps(masks[v], t.c.add(r * t.ldc + 16 * v));
                }
            }
        }
        for i in 0..depth {
            let b = [_mm512_loadu_ps(t.b.add(i * PANEL)), _mm512_loadu_ps(t.b.add(i * PANEL + 16))];
            _mm_prefetch::<_MM_HINT_T0>(t.next.add(i * PANEL) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(t.next.add(i * PANEL + 16) as *const i8);
            for (r, acc) in acc.iter_mut().enumerate() {
                let a = _mm512_set1_ps(*t.a.add(i * R + r));
                acc[0] = _mm512_fmadd_ps(a, b[0], acc[0]);
                acc[1] = _mm512_fmadd_ps(a, b[1], acc[1]);
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (v, acc) in acc.iter().enumerate() {
                _mm512_mask_storeu_ps(t.c.add(r * t.ldc + 16 * v), masks[v], *acc);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a plain in-order sum of fused multiply-adds: every tile size, a last panel part full, and
    /// inputs over several passes; each row's bits the same computed alone.
    #[test]
    fn packed_products_are_each_rows_own_in_order_sum() {
        let (outputs, inputs, rows) = (70, 2 * DEPTH + 5, 2 * TILE_ROWS + 7);
        let value = |i: usize, salt: usize| (((i * 7919 + salt) % 2003) as f32 - 1001.0) / 997.0;
        let weight: Vec<f32> = (0..outputs * inputs).map(|i| value(i, 1)).collect();
        let Some(packed) = Packed::new(&weight, outputs, inputs) else { return };
        assert_eq!(packed.unpacked(), weight);
        let x: Vec<f32> = (0..rows * inputs).map(|i| value(i, 2)).collect();
        let mut c = vec![f32::NAN; rows * outputs];
        // SAFETY: the buffers hold the shapes.
        unsafe { packed.rows(x.as_ptr(), rows, c.as_mut_ptr()) };
        for r in 0..rows {
            let row = &x[r * inputs..(r + 1) * inputs];
            let want: Vec<u32> = weight
                .chunks_exact(inputs)
                .map(|w| row.iter().zip(w).fold(0f32, |sum, (a, b)| a.mul_add(*b, sum)).to_bits())
                .collect();
            let got: Vec<u32> = c[r * outputs..(r + 1) * outputs].iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "row {r}");
            let mut alone = vec![0f32; outputs];
            // SAFETY: one row and room for its outputs.
            unsafe { packed.rows(row.as_ptr(), 1, alone.as_mut_ptr()) };
            assert_eq!(alone.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want, "row {r} alone");
        }
    }
}
