"""GFLOP/s of one-threaded `cblas_sgemm` on the MiniLM encoder's products at L=128, batch 8 (512 rows a thread),
for each OpenBLAS named on the command line, in alternating rounds (BENCHMARKS.md, the speed issue).

usage: python sgemm_probe.py NAME=LIBRARY[:PREFIX] ... [--rounds 3]
  e.g. debian=libopenblas.so.0  new=/path/scipy_openblas32/lib/libscipy_openblas.so:scipy_  mkl=/path/libmkl_rt.so.3
"""
import argparse
import ctypes
import time

import numpy as np

# (rows, outputs, inputs): QKV, attention output, feed-forward in, feed-forward out, then attention's
# scores (len × len × head_dim) and context (len × head_dim × len) products of one head.
SHAPES = [(512, 1152, 384), (512, 384, 384), (512, 1536, 384), (512, 384, 1536), (128, 128, 32), (128, 32, 128)]
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


def gflops(sgemm, m, n, k):
    a = np.random.rand(m, k).astype(np.float32)
    w = np.random.rand(n, k).astype(np.float32)
    c = np.zeros((m, n), np.float32)
    p = ctypes.c_void_p
    args = (ROW_MAJOR, NO_TRANS, TRANS, m, n, k, ctypes.c_float(1.0), p(a.ctypes.data), k, p(w.ctypes.data), k,
            ctypes.c_float(0.0), p(c.ctypes.data), n)
    reps = max(3, int(2e9 / (2 * m * n * k)))
    for _ in range(2):
        sgemm(*args)
    start = time.perf_counter()
    for _ in range(reps):
        sgemm(*args)
    return 2 * m * n * k * reps / (time.perf_counter() - start) / 1e9


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("libraries", nargs="+")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    libs = {}
    for spec in args.libraries:
        name, _, path = spec.partition("=")
        path, _, prefix = path.partition(":")
        lib = ctypes.CDLL(path)
        # OpenBLAS, or MKL (`MKL_THREADING_LAYER=SEQUENTIAL` keeps it one-threaded as well).
        threads = getattr(lib, prefix + "openblas_set_num_threads", None) or lib.MKL_Set_Num_Threads
        threads(1)
        libs[name] = getattr(lib, prefix + "cblas_sgemm")
    print("round library " + " ".join(f"{m}x{n}x{k}" for m, n, k in SHAPES))
    for r in range(args.rounds):
        for name, sgemm in libs.items():
            print(r, name, " ".join(f"{gflops(sgemm, *s):.1f}" for s in SHAPES), flush=True)


if __name__ == "__main__":
    main()
