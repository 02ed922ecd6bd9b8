//! The encoder's matrix products: where the CPU has AVX-512, kernels built into the binary (`packed`'s for
//! linear layers, the `gemm` crate's for the rest), faster here than either library; elsewhere, through a
//! CBLAS-shaped `sgemm`, a library loaded at run time when one is installed (Intel's MKL on Intel CPUs,
//! `libmkl_rt`, e.g. from PyPI's `mkl`; else OpenBLAS, Debian's `libopenblas0`), and otherwise the `gemm`
//! crate's kernels, so nothing is needed to build or run. Each product is a one-threaded call on rows cut by a
//! sequence's length alone (the packed linear layers: on any rows, each row's sum its own).
//! `LONGRANK_BLAS=off` leaves all of it to candle's own ops; `LONGRANK_BLAS=builtin` takes the built-in kernels
//! even where a library is installed, `LONGRANK_BLAS=gemm` the `gemm` crate's alone (what a CPU without AVX-512
//! gets, on any CPU); `LONGRANK_BLAS=/path/to/lib` picks the library (OpenBLAS or MKL). BENCHMARKS.md has their
//! speeds.
//!
//! One file each: `library` (loading a CBLAS and trying it), `threads` (work split over rayon's pool),
//! `linear` (linear layers in inference, `BlasLinear`, and in training, `matmul_t` with its backward pass),
//! `attention` (attention as one op, inference and training); here, which kernels compute and the products
//! they share.

mod attention;
mod library;
mod linear;
mod threads;

pub use attention::{attention, Heads, Rotary};
pub use linear::{matmul_t, BlasLinear};
pub(super) use threads::{split, written, Shared};

use std::sync::OnceLock;

use candle_core::{CpuStorage, DType, Layout, Tensor};

use super::packed;
use library::{Sgemm, NO_TRANS, ROW_MAJOR, TRANS};

/// What computes the products.
enum Kernels {
    /// A CBLAS loaded at run time: its `cblas_sgemm`, its file name as loaded, and the library kept loaded for
    /// `sgemm`'s sake.
    Library { sgemm: Sgemm, name: String, _library: libloading::Library },
    /// Built into the binary: with `packed`, our micro-kernel on weights packed at load (`packed.rs`, where
    /// the CPU has AVX-512) for linear layers; the `gemm` crate's for the rest, and for everything without.
    Builtin { packed: bool },
}

struct Blas {
    kernels: Kernels,
    /// Threads that share each product, every one calling a one-threaded `sgemm` on its part: OpenBLAS's
    /// own threads spin and yield between calls, and contend with candle's pool (a profile showed 17 % of
    /// the time in the scheduler that way).
    threads: usize,
}

/// One operand of a product: row-major data, transposed or not.
#[derive(Clone, Copy)]
struct Operand {
    data: *const f32,
    transposed: bool,
}

impl Operand {
    /// The data; through a method, so that closures capture the whole (`Sync`) operand, as `Shared::ptr`.
    fn data(&self) -> *const f32 {
        self.data
    }
}

impl Blas {
    /// `C = op(A) · op(B)`, row-major, op(A) m × k, op(B) k × n: the rows of `C` split over the threads, each
    /// running a one-threaded `sgemm` on its rows.
    ///
    /// # Safety
    /// The pointers must hold matrices of those shapes (A: m × k, or k × m transposed; B: k × n, or n × k).
    unsafe fn product(&self, (m, n, k): (usize, usize, usize), a: Operand, b: Operand, c: *mut f32) {
        // SAFETY: the pointers hold the shapes (the caller's contract); each thread writes its own rows of C.
        unsafe {
            let c = Shared(c);
            split(m, self.threads, |rows| self.rows(rows, (m, n, k), a, b, c.ptr()))
        }
    }

    /// Rows `rows` of `C = op(A) · op(B)` as one one-threaded `sgemm`.
    ///
    /// # Safety
    /// As `product`'s.
    unsafe fn rows(
        &self,
        rows: std::ops::Range<usize>,
        (m, n, k): (usize, usize, usize),
        a: Operand,
        b: Operand,
        c: *mut f32,
    ) {
        // SAFETY: rows `rows` lie inside op(A) and C, whose shapes the caller's contract promises.
        unsafe {
            // Rows of op(A): rows of A, or columns of a transposed A (leading dimension m).
            let (a_part, lda) =
                if a.transposed { (a.data.add(rows.start), m) } else { (a.data.add(rows.start * k), k) };
            let ldb = if b.transposed { k } else { n };
            self.block(
                (rows.len(), n, k),
                (a_part, lda, a.transposed),
                (b.data, ldb, b.transposed),
                (c.add(rows.start * n), n),
            )
        }
    }
}

// SAFETY: the threads only read operands.
unsafe impl Send for Operand {}
unsafe impl Sync for Operand {}

/// The kernels that compute the products, chosen once (`LONGRANK_BLAS`, the CPU, the libraries installed);
/// `None` with `LONGRANK_BLAS=off`.
fn blas() -> Option<&'static Blas> {
    static BLAS: OnceLock<Option<Blas>> = OnceLock::new();
    BLAS.get_or_init(|| {
        let choice = std::env::var("LONGRANK_BLAS").unwrap_or_default();
        let openblas = ["libopenblas.so.0", "libopenblas.so"];
        let names: Vec<&str> = match choice.as_str() {
            "off" => return None,
            "builtin" | "gemm" => vec![],
            // Where the built-in kernels are AVX-512's they outrun MKL and OpenBLAS (BENCHMARKS.md: 1.07-1.18x
            // MKL, 1.24-1.34x OpenBLAS): no library by default.
            "" if packed::available() => vec![],
            // MKL takes slower paths on other vendors' CPUs.
            "" if library::intel_cpu() => ["libmkl_rt.so.3", "libmkl_rt.so.2"].into_iter().chain(openblas).collect(),
            "" => openblas.to_vec(),
            path => vec![path],
        };
        let threads = candle_core::utils::get_num_threads();
        let loaded = names.into_iter().find_map(|name| {
            let (sgemm, library) = library::load(name)?;
            tracing::info!("linear layers through {name}");
            Some(Blas { kernels: Kernels::Library { sgemm, name: name.to_string(), _library: library }, threads })
        });
        if loaded.is_none() && !matches!(choice.as_str(), "" | "builtin" | "gemm") {
            tracing::warn!("LONGRANK_BLAS={choice} could not be loaded: the built-in kernels compute instead");
        }
        Some(loaded.unwrap_or_else(|| {
            tracing::info!("linear layers through the built-in kernels");
            // `gemm`: what a CPU without AVX-512 computes, on any CPU (CI runs the model layer's tests so).
            Blas { kernels: Kernels::Builtin { packed: choice != "gemm" && packed::available() }, threads }
        }))
    })
    .as_ref()
}

/// How the encoder's products run on the CPU: `mkl` or `openblas` (the library loaded), `builtin` (linear
/// layers through `packed`'s AVX-512 kernels, library `avx512`, the rest and CPUs without AVX-512 through the
/// `gemm` crate's) or `candle` (its own ops, `LONGRANK_BLAS=off`), and on how many threads. Results differ in
/// their last bits between them.
pub fn gemm_path() -> (&'static str, &'static str, usize) {
    match blas() {
        Some(Blas { kernels: Kernels::Library { name, .. }, threads }) => {
            (if name.contains("mkl") { "mkl" } else { "openblas" }, name, *threads)
        }
        Some(Blas { kernels: Kernels::Builtin { packed }, threads }) => {
            ("builtin", if *packed { "avx512" } else { "gemm" }, *threads)
        }
        None => ("candle", "", candle_core::utils::get_num_threads()),
    }
}

/// Whether linear layers on `weight`'s device and dtype can go through BLAS.
pub fn available_for(weight: &Tensor) -> bool {
    weight.device().is_cpu() && weight.dtype() == DType::F32 && blas().is_some()
}

impl Blas {
    /// One-threaded `C = op(A) · op(B)` on matrices inside larger buffers (rows `ld*` apart), op(A) m × k,
    /// op(B) k × n: the callers split whole blocks over the threads.
    ///
    /// # Safety
    /// The pointers must hold matrices of those shapes and leading dimensions.
    unsafe fn block(
        &self,
        shape: (usize, usize, usize),
        a: (*const f32, usize, bool),
        b: (*const f32, usize, bool),
        c: (*mut f32, usize),
    ) {
        // SAFETY: the caller's contract, which is `block_into`'s.
        unsafe { self.block_into(shape, a, b, c, false) }
    }

    /// As `block`, and with `accumulate` `C += op(A) · op(B)` (C's old values read).
    ///
    /// # Safety
    /// As `block`'s.
    unsafe fn block_into(
        &self,
        (m, n, k): (usize, usize, usize),
        (a, lda, ta): (*const f32, usize, bool),
        (b, ldb, tb): (*const f32, usize, bool),
        (c, ldc): (*mut f32, usize),
        accumulate: bool,
    ) {
        // SAFETY: the pointers hold matrices of those shapes and leading dimensions (the caller's contract).
        unsafe {
            let trans = |t: bool| if t { TRANS } else { NO_TRANS };
            match &self.kernels {
                Kernels::Library { sgemm, .. } => sgemm(
                    ROW_MAJOR,
                    trans(ta),
                    trans(tb),
                    m as i32,
                    n as i32,
                    k as i32,
                    1.0,
                    a,
                    lda as i32,
                    b,
                    ldb as i32,
                    if accumulate { 1.0 } else { 0.0 },
                    c,
                    ldc as i32,
                ),
                Kernels::Builtin { .. } => {
                    // (row stride, column stride) of op(X), X row-major with rows `ld` apart.
                    let strides = |ld: usize, t: bool| if t { (1, ld as isize) } else { (ld as isize, 1) };
                    let ((a_rs, a_cs), (b_rs, b_cs)) = (strides(lda, ta), strides(ldb, tb));
                    // dst = α·dst + 1·lhs·rhs (gemm's alpha scales the output's old values, read only with
                    // `accumulate`, its beta the product), on this thread.
                    gemm::gemm(
                        m,
                        n,
                        k,
                        c,
                        1,
                        ldc as isize,
                        accumulate,
                        a,
                        a_cs,
                        a_rs,
                        b,
                        b_cs,
                        b_rs,
                        if accumulate { 1.0 } else { 0.0 },
                        1.0,
                        false,
                        false,
                        false,
                        gemm::Parallelism::None,
                    )
                }
            }
        }
    }
}

/// The loaded BLAS and a binary op's two inputs, which must be contiguous f32.
fn operands<'s>(
    op: &str,
    (a, a_layout): (&'s CpuStorage, &Layout),
    (b, b_layout): (&'s CpuStorage, &Layout),
) -> candle_core::Result<(&'static Blas, &'s [f32], &'s [f32])> {
    let Some(blas) = blas() else { candle_core::bail!("BLAS is not loaded") };
    match (a, b, a_layout.contiguous_offsets(), b_layout.contiguous_offsets()) {
        (CpuStorage::F32(a), CpuStorage::F32(b), Some(a_at), Some(b_at)) => {
            Ok((blas, &a[a_at.0..a_at.1], &b[b_at.0..b_at.1]))
        }
        _ => candle_core::bail!("{op} takes contiguous f32 inputs"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `LONGRANK_BLAS=gemm` (CI's fourth pass) really computes through the gemm crate alone.
    #[test]
    fn the_gemm_choice_is_the_path_taken() {
        if std::env::var("LONGRANK_BLAS").as_deref() == Ok("gemm") {
            assert_eq!(gemm_path().0, "builtin");
            assert_eq!(gemm_path().1, "gemm");
        }
    }

    /// The built-in kernels' products as a library's: every transposition, inside larger buffers (leading
    /// dimensions past the shapes), and equal to a plain sum on small integers (exact in f32).
    #[test]
    fn the_builtin_kernels_multiply_as_cblas_does() {
        let builtin = Blas { kernels: Kernels::Builtin { packed: false }, threads: 1 };
        let (m, n, k, pad) = (5usize, 7usize, 3usize, 2usize);
        let value = |i: usize| ((i * 37) % 11) as f32 - 5.0;
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let (a_rows, a_cols) = if ta { (k, m) } else { (m, k) };
            let (b_rows, b_cols) = if tb { (n, k) } else { (k, n) };
            let (lda, ldb, ldc) = (a_cols + pad, b_cols + pad, n + pad);
            let a: Vec<f32> = (0..a_rows * lda).map(value).collect();
            let b: Vec<f32> = (0..b_rows * ldb).map(|i| value(i + 3)).collect();
            let mut c = vec![f32::NAN; m * ldc];
            // SAFETY: the buffers hold the shapes with those leading dimensions.
            unsafe { builtin.block((m, n, k), (a.as_ptr(), lda, ta), (b.as_ptr(), ldb, tb), (c.as_mut_ptr(), ldc)) };
            let at = |i: usize, p: usize| if ta { a[p * lda + i] } else { a[i * lda + p] };
            let bt = |p: usize, j: usize| if tb { b[j * ldb + p] } else { b[p * ldb + j] };
            for i in 0..m {
                for j in 0..n {
                    let want: f32 = (0..k).map(|p| at(i, p) * bt(p, j)).sum();
                    assert_eq!(c[i * ldc + j], want, "({ta}, {tb}) at ({i}, {j})");
                }
                assert!(c[i * ldc + n..(i + 1) * ldc].iter().all(|v| v.is_nan()), "only the output's columns written");
            }
        }
    }
}
