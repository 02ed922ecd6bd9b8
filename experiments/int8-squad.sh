#!/usr/bin/env bash
# The int8 path's ranking cost (speed issue): MaxP with a SQuAD-trained MiniLM cross-encoder, fp32 against
# `quantize = "int8"`, on the first 60 of the BeST experiment's test questions (depth 5), then MRR@10 and
# nDCG@10 with a paired t-test. Needs experiments/best-squad.sh's index, test topics and FirstP model.
# usage: experiments/int8-squad.sh [BEST_WORK_DIR=/tmp/longrank-best] [WORK_DIR=/tmp/longrank-int8]
set -euo pipefail
cd "$(dirname "$0")/.."
BEST="${1:-/tmp/longrank-best}"
WORK="${2:-/tmp/longrank-int8}"
SHARED="$(realpath "${LONGRANK_SHARED:-../shared}")"
BIN="${BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/longrank-target}/release/longrank}"
export RUST_LOG=warn
mkdir -p "$WORK"
head -60 "$BEST/test-topics.tsv" > "$WORK/topics.tsv"
cp experiments/best-squad.toml "$WORK/fp32.toml"
sed 's/^max_query_tokens = 32$/max_query_tokens = 32\nquantize = "int8"/' experiments/best-squad.toml > "$WORK/int8.toml"
for p in fp32 int8; do
  [ -s "$WORK/$p.run" ] && continue
  /usr/bin/time -f "$p: %e s" "$BIN" --config "$WORK/$p.toml" --data-dir "$BEST/data" --model "$BEST/firstp/firstp/model" \
    batch --collection squad --topics "$WORK/topics.tsv" --pipeline maxp -k 5 --depth 5 --out "$WORK/$p.run"
done
"$BIN" compare -M 10 -m recip_rank -m ndcg_cut.10 "$WORK/fp32.run" "$WORK/int8.run" \
  "$SHARED/data/squad-v1.1-dev-articles/qrels.txt"
