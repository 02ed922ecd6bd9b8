#!/usr/bin/env bash
# The device run's one command (from the repository's root, the pack carried): bash .gpu-pack/device.sh
# Rehearsal on this machine: bash DIR/device.sh --device cpu --model-dir TINY --quick (tests/it/gpu.rs).
# Writes under $OUT (else DIR/out): summary.json (rewritten after each part), device.log, server.log, ldd.txt.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$here/out}"
mkdir -p "$out"
# The CUDA libraries the binary needs (libcublas.so.13, libcublasLt.so.13, libcurand.so.10, libnvrtc.so.13,
# libcudart.so.13) are those of the GPU machine's PyTorch: its python3 is /opt/torch/.venv/bin/python3
# (Python 3.12; device notes, KINDS.md), and its CUDA 13 wheels put them in nvidia/cu13/lib, as the same wheels
# do here (pip's nvidia-cublas 13.x: nvidia/cu13/lib/libcublas.so.13). The driver's libcuda.so.1 is in
# /usr/local/nvidia.
# Where the first is missing, the wheels' folder is asked of python3, then searched for.
libs=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
if [ ! -e "$libs/libcublas.so.13" ]; then
    libs="$(${PYTHON:-python3} -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "lib"))' 2>/dev/null)"
    if [ ! -e "$libs/libcublas.so.13" ]; then
        found="$(find / -xdev -name libcublas.so.13 2>/dev/null | head -1)"
        libs="${found%/*}"
    fi
fi
for driver in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do
    [ -e "$driver/libcuda.so.1" ] && libs="$libs:$driver"
done
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PYTHONUNBUFFERED=1
# The binary travels compressed (pack.sh).
if [ ! -x "$here/longrank" ]; then
    "${PYTHON:-python3}" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
        "$here/longrank.xz" "$here/longrank" && chmod +x "$here/longrank"
fi
{ echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; ldd "$here/longrank"; } >"$out/ldd.txt" 2>&1
exec "${PYTHON:-python3}" "$here/device.py" --pack "$here" --out "$out" "$@"
