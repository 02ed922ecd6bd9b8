#!/usr/bin/env bash
# Compiles the `cuda` feature without a GPU: CUDA 13.0's compiler, runtime headers, CCCL and the libraries
# candle links (cuBLAS, cuBLASLt, cuRAND, NVRTC, the runtime) from PyPI (Debian has no CUDA toolkit here; 13.0
# matches the GPU machines' driver), then `cargo check --features cuda`, or with `build` the release binary. The driver
# library (libcuda.so.1) comes with the GPU's driver, never from PyPI: the link uses a stub of its entry points,
# as the CUDA toolkit's own `lib64/stubs` does, and the binary loads the real one at run time.
# Slow (candle's kernels are compiled to PTX), so it is not part of the default CI run.
#   bash scripts/check-cuda.sh            # check
#   bash scripts/check-cuda.sh build      # build the release binary with CUDA instead
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${CUDA_VENV:-$HOME/.cache/longrank-cuda-venv}"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
# Every piece pinned to 13.0 (cuRAND 10.4.0 is 13.0's), or pip pulls newer ones that this nvcc cannot use.
"$venv/bin/pip" install --quiet "nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-runtime==13.0.*" \
    "nvidia-cuda-cccl==13.0.*" "nvidia-cuda-crt==13.0.*" "nvidia-nvvm==13.0.*" "nvidia-cublas==13.0.*" \
    "nvidia-curand==10.4.0.*" "nvidia-cuda-nvrtc==13.0.*"
cuda="$("$venv/bin/python" -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13"))')"
export CUDA_ROOT="$cuda" CUDA_PATH="$cuda" CUDA_HOME="$cuda"
export PATH="$cuda/bin:$cuda/nvvm/bin:$PATH"
# No GPU to ask: build for Hopper (the H100/H200 machines).
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/longrank-cuda-target}"

# What the linker's `-lNAME` finds: the wheels' libraries under their unversioned names, and the driver stub.
link="$CARGO_TARGET_DIR/cuda-link"
mkdir -p "$link"
for lib in cublas.so.13 cublasLt.so.13 curand.so.10 nvrtc.so.13 cudart.so.13; do
    ln -sf "$cuda/lib/lib$lib" "$link/lib${lib%.so.*}.so"
done
cudarc="$(cargo metadata --format-version 1 --features cuda 2>/dev/null | "$venv/bin/python" -c \
    'import json, sys; print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"] == "cudarc"))')"
grep -ohE 'load::<_F>\("cu[A-Za-z0-9_]+"\)' "$(dirname "$cudarc")/src/driver/sys/mod.rs" \
    | sed -E 's/.*"(cu[A-Za-z0-9_]+)".*/int \1(void) { return 999; }/' | sort -u >"$link/cuda-stub.c"
cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$link/libcuda.so" "$link/cuda-stub.c"
export LIBRARY_PATH="$link:$cuda/lib:${LIBRARY_PATH:-}" LD_LIBRARY_PATH="$cuda/lib:${LD_LIBRARY_PATH:-}"

nvcc --version | tail -2
if [ "${1:-check}" = build ]; then
    cargo build --release --features cuda
else
    cargo check --release --features cuda --all-targets
fi
