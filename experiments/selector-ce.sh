#!/usr/bin/env bash
# A learned preselection (the cost-aware MaxP issue's item 5): the MiniLM bi-encoder distilled from the
# cross-encoder's segment scores (`longrank train --method selector`: TRAIN_QUERIES questions of folds 0-2, 50
# of fold 3 for dev), against the zero-cost selectors (bm25, the MiniLM as it ships) at s = 1, 2: segment
# selection on SQuAD's gold articles (P@1, best recall) and MRR@10/nDCG@10 at depth 10 with paired t-tests,
# on preselect-ce.sh's questions with its cross-encoder (shared WORK_DIR: trained here when missing).
# Every step resumes: rerun it after an interruption.
# usage: experiments/selector-ce.sh [WORK_DIR=/tmp/longrank-preselect-ce]   (MODEL: the MiniLM directory)
WORK_DEFAULT=/tmp/longrank-preselect-ce
. "$(dirname "$0")/ce-env.sh"
TRAIN_QUERIES="${TRAIN_QUERIES:-150}"
[ -s "$WORK/selector/summary.json" ] || /usr/bin/time -f "train selector: %e s" "$BIN" "${L[@]}" --model "$CE" \
  train --collection squad --topics "$D/topics.tsv" --qrels "$D/qrels.txt" --folds "$D/folds.tsv" \
  --train-folds 0,1,2 --dev-fold 3 --init "$MODEL" --method selector --out "$WORK/selector" \
  --train-queries "$TRAIN_QUERIES" --dev-queries 50 --steps 300 --batch 4 --negatives 7 --lr 5e-5 \
  --eval-every 50 --seed 42
grep -h '"dev"' "$WORK/selector/selector/log.jsonl"
CELLS=()
for selector in bm25 bi-encoder:minilm bi-encoder:learned; do
  for s in 1 2; do CELLS+=("${selector#*:}-$s {\"selector\": \"$selector\", \"per_doc\": $s}"); done
done
echo "== segment selection on SQuAD's gold articles: P@1 of the model's best among those read, and how often"
echo "   they include the best of every segment (best_recall)"
for cell in "${CELLS[@]}"; do
  echo "-- ${cell%% *}"
  "$BIN" "${L[@]}" --model "$CE" eval-segments --collection squad --topics "$WORK/squad-topics.tsv" \
    --passages "$D/passages.bytes.tsv" --preselect "${cell#* }" 2> /dev/null
done
for cell in "${CELLS[@]}"; do run squad "$CE" "${cell%% *}" "${cell#* }"; done
for s in 1 2; do
  compare squad "bm25-$s" "learned-$s"
  compare squad "minilm-$s" "learned-$s"
done
