//! A CBLAS loaded at run time (Intel's MKL, OpenBLAS): its `cblas_sgemm` made one-threaded and tried on one
//! small product first, since an MKL missing one of its parts ends the process on its first product; and the
//! CPU's vendor, which picks MKL or OpenBLAS by default.

use std::sync::atomic::{AtomicBool, Ordering};

/// CBLAS's `sgemm`: C = α·op(A)·op(B) + β·C.
pub(super) type Sgemm = unsafe extern "C" fn(
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

pub(super) const ROW_MAJOR: i32 = 101;
pub(super) const NO_TRANS: i32 = 111;
pub(super) const TRANS: i32 = 112;

/// The library `name` (a file name the loader finds, or a path) with its `cblas_sgemm`, one-threaded; `None`
/// where it does not load, lacks the symbol or fails the trial product.
pub(super) fn load(name: &str) -> Option<(Sgemm, libloading::Library)> {
    // SAFETY: loading the library runs OpenBLAS's initializers only; the symbols have the CBLAS and OpenBLAS
    // signatures declared here.
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
                "{name} loaded but could not multiply (an MKL without all its libraries beside it?); passed over"
            );
            return None;
        }
        Some((sgemm, library))
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
    // SAFETY: `sgemm` is `library`'s `cblas_sgemm` (the caller's contract); the handler's symbol has the declared
    // signature; the operands are 2×2.
    unsafe {
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
}

/// `mkl_service.h`'s `MKL_THREADING_SEQUENTIAL`.
const MKL_THREADING_SEQUENTIAL: i32 = 1;

/// Whether the CPU's vendor string is Intel's.
pub(super) fn intel_cpu() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let id = std::arch::x86_64::__cpuid(0);
        [id.ebx, id.edx, id.ecx].map(u32::to_le_bytes).concat() == b"GenuineIntel"
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    fn the_cpu_vendor_is_read_as_the_kernel_reads_it() {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        let vendor = cpuinfo.lines().find_map(|l| l.strip_prefix("vendor_id")).unwrap();
        assert_eq!(intel_cpu(), vendor.trim_start_matches([' ', '\t', ':']) == "GenuineIntel", "{vendor}");
    }
}
