//! Work on rayon's pool for the products: contiguous ranges per thread (`split`), an output the threads share,
//! each writing its own rows (`Shared`), and buffers a product fills whole (`written`).

/// Runs `work` over `0..count` split into contiguous ranges, one per thread of rayon's pool (candle's own):
/// its workers are woken, where threads spawned per call cost a spawn, a join and fresh stack pages each time.
pub(in crate::model::cpu) fn split(count: usize, threads: usize, work: impl Fn(std::ops::Range<usize>) + Sync) {
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
pub(in crate::model::cpu) struct Shared(pub(in crate::model::cpu) *mut f32);

impl Shared {
    /// The pointer; through a method, so that closures capture the whole (`Sync`) wrapper, not its field.
    pub(in crate::model::cpu) fn ptr(&self) -> *mut f32 {
        self.0
    }
}
// SAFETY: the threads write disjoint parts of an output, and only read operands.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

/// `len` values that `write` fills whole through the pointer: `sgemm` with β = 0 overwrites its output, so
/// zeroing the buffer first would be a wasted pass.
pub(in crate::model::cpu) fn written(len: usize, write: impl FnOnce(*mut f32)) -> Vec<f32> {
    let mut v = Vec::with_capacity(len);
    write(v.as_mut_ptr());
    // SAFETY: `write` initialized all `len` values.
    unsafe { v.set_len(len) };
    v
}
