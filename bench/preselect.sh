#!/usr/bin/env bash
# What a preselection costs on `/search` maxp at depth 10 over squad-v1.1-dev-articles (issue 37 items 1 and 3),
# in one run: the MiniLM bi-encoder with every segment's embedding stored (`longrank embed`), under the default
# preselection (`[model.preselect]`: the bm25 selector's two best segments per candidate) against reading every
# segment, 1 and 8 clients; then the same backbone as a cross-encoder (a zero head: the speed of any MiniLM-L6
# cross-encoder) at the shipped defaults (max_length 256) and at the old max_length 512, 1 and 8 clients, without
# a system BLAS (the builtin kernels such a machine gets, and candle's own products) and with OpenBLAS.
# usage: bench/preselect.sh [WORK_DIR=/tmp/longrank-preselect-cost]   (BIN: the binary; MODEL: the MiniLM;
#        PARTS=ce for the cross-encoder's runs alone)
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${1:-/tmp/longrank-preselect-cost}"
SHARED="$(realpath "${LONGRANK_SHARED:-../shared}")"
MODEL="${MODEL:-${LONGRANK_MINILM:?set MODEL or LONGRANK_MINILM to the MiniLM directory}}"
BIN="${BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/longrank-target}/release/longrank}"
SECONDS_PER_RUN="${SECONDS_PER_RUN:-15}"
export RUST_LOG=warn
mkdir -p "$WORK"
D="$SHARED/data/squad-v1.1-dev-articles"
awk 'NR % 10 == 1' "$D/topics.tsv" > "$WORK/topics.sample.tsv"
[ -d "$WORK/data/collections/squad" ] || "$BIN" --data-dir "$WORK/data" index --collection squad "$D/docs.jsonl" > /dev/null
"$BIN" --data-dir "$WORK/data" --model "$MODEL" embed --collection squad > /dev/null 2>&1
search() { # model clients [preselect JSON]
  local extra=()
  [ $# -ge 3 ] && extra=(--preselect "$3")
  LONGRANK_MODEL_CACHE_ENTRIES=1 LONGRANK_SERVER_REQUEST_TIMEOUT_MS=600000 "$BIN" --data-dir "$WORK/data" \
    --model "$1" bench search --collection squad --topics "$WORK/topics.sample.tsv" --pipeline maxp --depth 10 \
    --clients "$2" --seconds "$SECONDS_PER_RUN" "${extra[@]}" 2>&1 | grep "RESULT longrank-http collection"
}
for clients in 1 8; do
  [ "${PARTS:-all}" = ce ] && break
  echo "== bi-encoder, $clients clients, the default preselection"
  search "$MODEL" "$clients"
  echo "== bi-encoder, $clients clients, every segment"
  search "$MODEL" "$clients" '{"selector": "none"}'
done
CE="$WORK/minilm-cross-encoder"
bash bench/minilm-cross-encoder.sh "$MODEL" "$CE"
for blas in builtin off libopenblas.so.0; do
  for clients in 1 8; do
    for max_length in 256 512; do
      echo "== cross-encoder, $clients clients, the default preselection, LONGRANK_BLAS=$blas, max_length $max_length"
      LONGRANK_BLAS=$blas LONGRANK_MODEL_MAX_LENGTH=$max_length SECONDS_PER_RUN=$((SECONDS_PER_RUN * 2)) \
        search "$CE" "$clients"
    done
  done
done
