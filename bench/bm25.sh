#!/usr/bin/env bash
# First-stage benchmark: longrank next to the tantivy-py and bm25s peers of ../shared/bench, on the same
# input, in one run (the machine is noisy: compare figures from the same run only).
# usage: bench/bm25.sh [WORK_DIR=/tmp/longrank-bench] [SYNTH_DOCS=1000000]
# Needs: a release build, python3; creates a venv for the peers (pip install tantivy bm25s PyStemmer).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${1:-/tmp/longrank-bench}"
SYNTH_DOCS="${2:-1000000}"
SHARED="$(realpath "${LONGRANK_SHARED:-../shared}")"
BIN="${CARGO_TARGET_DIR:-$HOME/.cache/longrank-target}/release/longrank"
export RUST_LOG=warn
mkdir -p "$WORK"
[ -x "$WORK/peers/bin/python" ] || { python3 -m venv "$WORK/peers" && "$WORK/peers/bin/pip" install -q tantivy bm25s PyStemmer; }
[ -f "$WORK/synth/docs.jsonl" ] || python3 "$SHARED/bench/synth_collection.py" "$WORK/synth" "$SYNTH_DOCS" 42

bench_collection() { # name docs topics peers
  local name=$1 docs=$2 topics=$3 peers=$4
  rm -rf "$WORK/data-$name"
  echo "== $name: longrank index"
  "$BIN" --data-dir "$WORK/data-$name" index --collection "$name" "$docs"
  echo "== $name: longrank search"
  "$BIN" --data-dir "$WORK/data-$name" bench search --collection "$name" --topics "$topics" -k 1000 --clients 1,8,32 --seconds 10
  echo "== $name: peers ($peers)"
  (cd "$WORK" && "$WORK/peers/bin/python" "$SHARED/bench/bm25_peers.py" "$docs" "$topics" 1000 "$peers" "$WORK/peer-index-$name")
}

bench_collection cranfield "$SHARED/data/cranfield/docs.jsonl" "$SHARED/data/cranfield/topics.tsv" tantivy,bm25s
bench_collection synth "$WORK/synth/docs.jsonl" "$WORK/synth/topics.tsv" tantivy
