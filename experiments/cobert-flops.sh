#!/usr/bin/env bash
# Co-BERT's cost against MaxP's on the same candidates, per collection (the Co-BERT issue's item 7): FLOPs per
# topic of `maxp`, of `cobert` with one backbone (trained frozen: the second round reuses the first round's
# passes) and of `cobert` with its own backbone (trained end to end: one more pass per candidate over its best
# passage). FLOPs depend on the shapes and the word pieces only, so the models are a MiniLM cross-encoder with
# Co-BERT heads (MODEL: a Co-BERT checkpoint; its `first-round/` copy stands for an own backbone).
# usage: experiments/cobert-flops.sh MODEL [WORK_DIR=/tmp/longrank-cobert-flops] [TOPICS=10] [DEPTH=20]
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="$(realpath "$1")"
WORK="${2:-/tmp/longrank-cobert-flops}"
TOPICS="${3:-10}"
DEPTH="${4:-20}"
SHARED="$(realpath "${LONGRANK_SHARED:-../shared}")"
BIN="${BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/longrank-target}/release/longrank}"
export RUST_LOG=warn
mkdir -p "$WORK/own"
for f in "$MODEL"/*; do [ -f "$f" ] && ln -sf "$f" "$WORK/own/"; done
mkdir -p "$WORK/own/first-round"
for f in config.json model.safetensors tokenizer.json; do ln -sf "$MODEL/$f" "$WORK/own/first-round/$f"; done
L=(--config experiments/best-squad.toml --data-dir "$WORK/data")
printf 'collection\tmaxp\tcobert (one backbone)\tcobert (own backbone)\n'
for c in cranfield medline time squad-v1.1-dev-articles; do
  name="${c%%-*}"
  [ -d "$WORK/data/collections/$name" ] || "$BIN" "${L[@]}" index --collection "$name" "$SHARED/data/$c/docs.jsonl" > /dev/null
  head -"$TOPICS" "$SHARED/data/$c/topics.tsv" > "$WORK/$name.topics"
  flops() { # pipeline model
    "$BIN" "${L[@]}" --model "$2" batch --collection "$name" --topics "$WORK/$name.topics" --pipeline "$1" \
      -k "$DEPTH" --depth "$DEPTH" --out "$WORK/$name.$1.run" 2>&1 >/dev/null | sed -n 's/^model FLOPs: \([^ ]*\) per topic.*/\1/p'
  }
  printf '%s\t%s\t%s\t%s\n' "$name" "$(flops maxp "$MODEL")" "$(flops cobert "$MODEL")" "$(flops cobert "$WORK/own")"
done
