//! The encoder's matrix products: where the CPU has AVX-512, kernels built into the binary (`packed`'s for
//! linear layers, the `gemm` crate's for the rest), faster here than either library; elsewhere, through a
//! CBLAS-shaped `sgemm`, a library loaded at run time when one is installed (Intel's MKL on Intel CPUs,
//! `libmkl_rt`, e.g. from PyPI's `mkl`; else OpenBLAS, Debian's `libopenblas0`), and otherwise the `gemm`
//! crate's kernels, so nothing is needed to build or run. Linear layers in inference (`BlasLinear`) and in
//! training (`matmul_t`, with its backward pass), and inference attention as one op (`attention`), each
//! product a one-threaded call on rows cut by a sequence's length alone (the packed linear layers: on any
//! rows, each row's sum its own). `LONGRANK_BLAS=off` leaves all of it
//! to candle's own ops; `LONGRANK_BLAS=builtin` takes the built-in kernels even where a library is installed,
//! `LONGRANK_BLAS=gemm` the `gemm` crate's alone (what a CPU without AVX-512 gets, on any CPU);
//! `LONGRANK_BLAS=/path/to/lib` picks the library (OpenBLAS or MKL). A library is tried on one small product
//! when loaded and passed over if it fails (an MKL missing one of its parts would otherwise end the process on
//! the first product). BENCHMARKS.md has their speeds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Shape, Tensor};

use super::packed::{self, Packed};

/// CBLAS's `sgemm`: C = α·op(A)·op(B) + β·C.
type Sgemm = unsafe extern "C" fn(
    layout: i32,
    trans_a: i32,
    trans_b: i32,
    m: i32,
    n: i32,
    k: i32,
    alpha: f32,
    a: *const f32,
    lda: i32,
    b: *const f32,
    ldb: i32,
    beta: f32,
    c: *mut f32,
    ldc: i32,
);

const ROW_MAJOR: i32 = 101;
const NO_TRANS: i32 = 111;
const TRANS: i32 = 112;

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
        let c = Shared(c);
        split(m, self.threads, |rows| self.rows(rows, (m, n, k), a, b, c.ptr()))
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
        // Rows of op(A): rows of A, or columns of a transposed A (leading dimension m).
        let (a_part, lda) = if a.transposed { (a.data.add(rows.start), m) } else { (a.data.add(rows.start * k), k) };
        let ldb = if b.transposed { k } else { n };
        self.block(
            (rows.len(), n, k),
            (a_part, lda, a.transposed),
            (b.data, ldb, b.transposed),
            (c.add(rows.start * n), n),
        )
    }
}

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

/// Runs `work` over `0..count` split into contiguous ranges, one per thread of rayon's pool (candle's own):
/// its workers are woken, where threads spawned per call cost a spawn, a join and fresh stack pages each time.
pub(super) fn split(count: usize, threads: usize, work: impl Fn(std::ops::Range<usize>) + Sync) {
    let threads = threads.clamp(1, count.max(1));
    if threads == 1 {
        return work(0..count);
    }
    let chunk = count.div_ceil(threads);
    rayon::scope(|scope| {
        for t in 1..threads {
            let work = &work;
            scope.spawn(move |_| work((t * chunk).min(count)..((t + 1) * chunk).min(count)));
        }
        work(0..chunk.min(count));
    });
}

/// An output shared by the threads of `split`, each writing its own rows.
#[derive(Clone, Copy)]
pub(super) struct Shared(pub(super) *mut f32);

impl Shared {
    /// The pointer; through a method, so that closures capture the whole (`Sync`) wrapper, not its field.
    pub(super) fn ptr(&self) -> *mut f32 {
        self.0
    }
}
// SAFETY: the threads write disjoint parts of an output, and only read operands.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}
unsafe impl Send for Operand {}
unsafe impl Sync for Operand {}

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
            "" if intel_cpu() => ["libmkl_rt.so.3", "libmkl_rt.so.2"].into_iter().chain(openblas).collect(),
            "" => openblas.to_vec(),
            path => vec![path],
        };
        let threads = candle_core::utils::get_num_threads();
        let loaded = names.into_iter().find_map(|name| {
            // SAFETY: loading the library runs OpenBLAS's initializers only; the symbols have the CBLAS and
            // OpenBLAS signatures declared here.
            unsafe {
                let library = libloading::Library::new(name).ok()?;
                let sgemm = *library.get::<Sgemm>(b"cblas_sgemm\0").ok()?;
                // One-threaded calls: OpenBLAS's thread count, MKL's sequential layer (before any other MKL call).
                if let Ok(set) = library.get::<unsafe extern "C" fn(i32)>(b"openblas_set_num_threads\0") {
                    set(1);
                }
                if let Ok(set) = library.get::<unsafe extern "C" fn(i32) -> i32>(b"MKL_Set_Threading_Layer\0") {
                    set(MKL_THREADING_SEQUENTIAL);
                }
                if !trial_product(&library, sgemm) {
                    tracing::warn!(
                        "{name} loaded but could not multiply (an MKL without all its libraries beside it?); \
                         passed over"
                    );
                    return None;
                }
                tracing::info!("linear layers through {name}");
                Some(Blas { kernels: Kernels::Library { sgemm, name: name.to_string(), _library: library }, threads })
            }
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

/// MKL's handler of fatal errors (`mkl_set_exit_handler`): called instead of `exit`, after which the failed
/// call returns without computing.
type MklExitHandler = unsafe extern "C" fn(handler: Option<extern "C" fn(why: i32)>) -> i32;

static MKL_FATAL: AtomicBool = AtomicBool::new(false);

extern "C" fn mkl_fatal(_why: i32) {
    MKL_FATAL.store(true, Ordering::SeqCst);
}

/// Multiplies two 2×2 matrices through a freshly loaded library. MKL loads its parts (interface, threading
/// layer, CPU kernels) on the first product and exits the process when one is missing; its exit handler is
/// caught for that one product, so an incomplete MKL is passed over instead of ending the server.
///
/// SAFETY: `sgemm` is `library`'s `cblas_sgemm`.
unsafe fn trial_product(library: &libloading::Library, sgemm: Sgemm) -> bool {
    let on_exit = library.get::<MklExitHandler>(b"MKL_Set_Exit_Handler\0").ok();
    MKL_FATAL.store(false, Ordering::SeqCst);
    if let Some(set) = &on_exit {
        set(Some(mkl_fatal));
    }
    let (a, b, mut c) = ([1f32, 2.0, 3.0, 4.0], [5f32, 6.0, 7.0, 8.0], [0f32; 4]);
    sgemm(ROW_MAJOR, NO_TRANS, NO_TRANS, 2, 2, 2, 1.0, a.as_ptr(), 2, b.as_ptr(), 2, 0.0, c.as_mut_ptr(), 2);
    let works = !MKL_FATAL.load(Ordering::SeqCst) && c == [19.0, 22.0, 43.0, 50.0];
    // A working MKL's later fatal errors exit as it documents: a product that silently did nothing would be
    // worse. A failed one is not called again, not even to reset its handler (that call fails and exits too).
    if let Some(set) = on_exit.filter(|_| works) {
        set(None);
    }
    works
}

/// `mkl_service.h`'s `MKL_THREADING_SEQUENTIAL`.
const MKL_THREADING_SEQUENTIAL: i32 = 1;

/// Whether the CPU's vendor string is Intel's.
fn intel_cpu() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let id = std::arch::x86_64::__cpuid(0);
        [id.ebx, id.edx, id.ecx].map(u32::to_le_bytes).concat() == b"GenuineIntel"
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether linear layers on `weight`'s device and dtype can go through BLAS.
pub fn available_for(weight: &Tensor) -> bool {
    weight.device().is_cpu() && weight.dtype() == DType::F32 && blas().is_some()
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
                    let gelu = super::kernels::bias_gelu_rows_fn();
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
    /// One-threaded `C = op(A) · op(B)` on matrices inside larger buffers (rows `ld*` apart), op(A) m × k,
    /// op(B) k × n: the callers split whole blocks over the threads.
    ///
    /// # Safety
    /// The pointers must hold matrices of those shapes and leading dimensions.
    #[allow(clippy::too_many_arguments)]
    unsafe fn block(
        &self,
        (m, n, k): (usize, usize, usize),
        (a, lda, ta): (*const f32, usize, bool),
        (b, ldb, tb): (*const f32, usize, bool),
        (c, ldc): (*mut f32, usize),
    ) {
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
                0.0,
                c,
                ldc as i32,
            ),
            Kernels::Builtin { .. } => {
                // (row stride, column stride) of op(X), X row-major with rows `ld` apart.
                let strides = |ld: usize, t: bool| if t { (1, ld as isize) } else { (ld as isize, 1) };
                let ((a_rs, a_cs), (b_rs, b_cs)) = (strides(lda, ta), strides(ldb, tb));
                // dst = 0·dst + 1·lhs·rhs (gemm's alpha scales the output's old values, its beta the product),
                // on this thread.
                gemm::gemm(
                    m,
                    n,
                    k,
                    c,
                    1,
                    ldc as isize,
                    false,
                    a,
                    a_cs,
                    a_rs,
                    b,
                    b_cs,
                    b_rs,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                )
            }
        }
    }

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
        let (l, d, w) = (head.len, head.d, head.width);
        self.block((head.queries, l, d), (head.q, w, false), (head.k, w, true), (scores.as_mut_ptr(), l));
        for (row, sum) in scores[..head.queries * l].chunks_exact_mut(l).zip(sums) {
            *sum = masked_exp_row(row, mask);
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
        let masked_exp_row = super::kernels::masked_exp_row_fn();
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
            (super::kernels::softmax_grad_row_fn(), super::kernels::masked_exp_row_fn());
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

/// `len` values that `write` fills whole through the pointer: `sgemm` with β = 0 overwrites its output, so
/// zeroing the buffer first would be a wasted pass.
pub(super) fn written(len: usize, write: impl FnOnce(*mut f32)) -> Vec<f32> {
    let mut v = Vec::with_capacity(len);
    write(v.as_mut_ptr());
    // SAFETY: `write` initialized all `len` values.
    unsafe { v.set_len(len) };
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, IndexOp, Module};

    #[test]
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    fn the_cpu_vendor_is_read_as_the_kernel_reads_it() {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        let vendor = cpuinfo.lines().find_map(|l| l.strip_prefix("vendor_id")).unwrap();
        assert_eq!(intel_cpu(), vendor.trim_start_matches([' ', '\t', ':']) == "GenuineIntel", "{vendor}");
    }

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
                    super::super::kernels::bias_gelu_rows(&mut want, &bias);
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
