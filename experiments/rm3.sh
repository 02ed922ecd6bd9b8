#!/usr/bin/env bash
# BM25 vs BM25+RM3 (Anserini's defaults) on small shared collections: MAP, nDCG@20, P@20 with paired t-tests.
# usage: experiments/rm3.sh [WORK_DIR=/tmp/longrank-rm3]     (results are printed; EXPERIMENTS.md quotes them)
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${1:-/tmp/longrank-rm3}"
SHARED="$(realpath "${LONGRANK_SHARED:-../shared}")"
BIN="${CARGO_TARGET_DIR:-$HOME/.cache/longrank-target}/release/longrank"
export RUST_LOG=warn
mkdir -p "$WORK"
for c in cranfield medline cisi time; do
  d="$SHARED/data/$c"
  "$BIN" --data-dir "$WORK/data" index --replace --collection "$c" "$d/docs.jsonl" > /dev/null
  for p in bm25 bm25+rm3; do
    "$BIN" --data-dir "$WORK/data" batch --collection "$c" --topics "$d/topics.tsv" --pipeline "$p" -k 1000 \
      --out "$WORK/$c.$p.run" > /dev/null
  done
  echo "== $c (A = bm25, B = bm25+rm3)"
  "$BIN" compare -m map -m ndcg_cut.20 -m P.20 "$WORK/$c.bm25.run" "$WORK/$c.bm25+rm3.run" "$d/qrels.txt"
done
