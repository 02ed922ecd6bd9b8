#!/usr/bin/env bash
# Preselection on squad-v1.1-dev-articles: fold 4's questions (1,339; the training recipe never sees them),
# depth 10, the MiniLM bi-encoder as the scorer. Full MaxP against the bm25 selector's best s segments per
# candidate (s = 1, 2, 4, 8): MRR@10 and nDCG@10 with paired t-tests against full MaxP, pairs per query.
# usage: experiments/preselect-squad.sh [WORK_DIR=/tmp/longrank-preselect]   (MODEL: the MiniLM directory)
WORK_DEFAULT=/tmp/longrank-preselect
. "$(dirname "$0")/squad-env.sh"
awk -F'\t' 'NR == FNR { if ($2 == 4) fold4[$1] = 1; next } ($1 in fold4)' "$D/folds.tsv" "$D/topics.tsv" \
  > "$WORK/topics.fold4.tsv"
"$BIN" --data-dir "$WORK/data" index --replace --collection squad "$D/docs.jsonl" > /dev/null
# Every segment embedded once (the runs below only embed queries): the cost compared is pairs, not embeddings.
"$BIN" --data-dir "$WORK/data" --model "$MODEL" embed --collection squad > /dev/null
run() {
  local name=$1 preselect=$2
  [ -s "$WORK/$name.run" ] && return
  echo "== $name: $preselect"
  "$BIN" --data-dir "$WORK/data" --model "$MODEL" batch --collection squad --topics "$WORK/topics.fold4.tsv" \
    --pipeline maxp -k 10 --depth 10 --preselect "$preselect" --out "$WORK/$name.run" 2>&1 | grep "model pairs"
}
run full '{"selector": "none"}'
for s in 1 2 4 8; do
  run "bm25-$s" "{\"selector\": \"bm25\", \"per_doc\": $s}"
  run "bm25-$s-first" "{\"selector\": \"bm25\", \"per_doc\": $s, \"keep_first\": true}"
done
for s in 1 2 4 8; do
  for v in "bm25-$s" "bm25-$s-first"; do
    echo "== A = full MaxP, B = $v"
    "$BIN" compare -M 10 -m recip_rank -m ndcg_cut.10 "$WORK/full.run" "$WORK/$v.run" "$D/qrels.txt"
  done
done
echo "== segment selection on the gold document: P@1 of the model's best among those read, and how often they"
echo "   include the best of every segment (best_recall)"
for preselect in '{"selector": "none"}' '{"selector": "bm25", "per_doc": '{1,2,4,8}'}'; do
  echo "-- $preselect"
  "$BIN" --data-dir "$WORK/data" --model "$MODEL" eval-segments --collection squad --topics "$WORK/topics.fold4.tsv" \
    --passages "$D/passages.bytes.tsv" --preselect "$preselect" 2> /dev/null
done
