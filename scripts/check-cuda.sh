#!/usr/bin/env bash
# Compiles the `cuda` feature without a GPU: CUDA 13.0's compiler, runtime headers and CCCL from PyPI (Debian
# has no CUDA toolkit here; 13.0 matches the GPU machines' driver), then `cargo check --features cuda`.
# Slow (candle's kernels are compiled to PTX), so it is not part of the default CI run.
#   bash scripts/check-cuda.sh            # check
#   bash scripts/check-cuda.sh build      # build the release binary with CUDA instead
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${CUDA_VENV:-$HOME/.cache/longrank-cuda-venv}"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
# Every piece pinned to 13.0, or pip pulls a newer crt/nvvm that this nvcc cannot use.
"$venv/bin/pip" install --quiet "nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-runtime==13.0.*" \
    "nvidia-cuda-cccl==13.0.*" "nvidia-cuda-crt==13.0.*" "nvidia-nvvm==13.0.*"
cuda="$("$venv/bin/python" -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13"))')"
export CUDA_ROOT="$cuda" CUDA_PATH="$cuda" CUDA_HOME="$cuda"
export PATH="$cuda/bin:$cuda/nvvm/bin:$PATH"
export LIBRARY_PATH="$cuda/lib:${LIBRARY_PATH:-}" LD_LIBRARY_PATH="$cuda/lib:${LD_LIBRARY_PATH:-}"
# No GPU to ask: build for Hopper (the H100/H200 machines).
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/longrank-cuda-target}"
nvcc --version | tail -2
if [ "${1:-check}" = build ]; then
    cargo build --release --features cuda
else
    cargo check --release --features cuda --all-targets
fi
