#!/usr/bin/env bash
# Whether MaxP's default preselection should change (issue 56, item 1): the shipped default (each candidate's two
# best segments by BM25) against keeping the first segment too, against three per candidate, and against every
# segment, on every collection here, the MiniLM bi-encoder (all-MiniLM-L6-v2) as the scorer, BM25 depth 10 (as
# the preselection experiments before). SQuAD articles: fold 4's questions; PolicyQA: its fold 4 too; the others:
# every topic. Paired t-tests of each variant against the default (`longrank compare`); then, where a gold passage
# is known (SQuAD, PolicyQA: PolicyQA is no document-ranking test, its template questions fit every policy), how
# often the segment the model ranks first among those read overlaps it (`longrank eval-segments`). Every step
# resumes.
# usage: experiments/preselect-default.sh [WORK_DIR=/tmp/longrank-preselect-default]   (MODEL: the MiniLM)
WORK_DEFAULT=/tmp/longrank-preselect-default
. "$(dirname "$0")/squad-env.sh"
DATA="$SHARED/data"
COLLECTIONS=(squad-v1.1-dev-articles policyqa time cranfield cisi medline cacm lisa npl adi)
CELLS=(
  'default {"selector": "bm25", "per_doc": 2}'
  'first {"selector": "bm25", "per_doc": 2, "keep_first": true}'
  'three {"selector": "bm25", "per_doc": 3}'
  'full {"selector": "none"}'
)
for c in "${COLLECTIONS[@]}"; do
  topics="$DATA/$c/topics.tsv"
  if [ -e "$DATA/$c/folds.tsv" ]; then
    awk -F'\t' 'NR == FNR { if ($2 == 4) fold4[$1] = 1; next } ($1 in fold4)' "$DATA/$c/folds.tsv" "$topics" \
      > "$WORK/$c.topics.tsv"
    topics="$WORK/$c.topics.tsv"
  fi
  if [ ! -e "$WORK/$c.embedded" ]; then
    "$BIN" --data-dir "$WORK/data" index --replace --collection "$c" "$DATA/$c/docs.jsonl" > /dev/null
    "$BIN" --data-dir "$WORK/data" --model "$MODEL" embed --collection "$c" > /dev/null
    touch "$WORK/$c.embedded"
  fi
  for cell in "${CELLS[@]}"; do
    name="${cell%% *}"
    [ -s "$WORK/$c.$name.run" ] && continue
    "$BIN" --data-dir "$WORK/data" --model "$MODEL" batch --collection "$c" --topics "$topics" --pipeline maxp \
      -k 10 --depth 10 --preselect "${cell#* }" --out "$WORK/$c.$name.run" 2>&1 | grep "model pairs" \
      | sed "s/^/$c $name: /" || true
  done
  for name in first three full; do
    echo "== $c: A = default, B = $name"
    "$BIN" compare -M 10 -m recip_rank -m ndcg_cut.10 "$WORK/$c.default.run" "$WORK/$c.$name.run" "$DATA/$c/qrels.txt"
  done
done
for c in squad-v1.1-dev-articles policyqa; do
  for cell in "${CELLS[@]}"; do
    name="${cell%% *}"
    [ -s "$WORK/$c.$name.segments" ] || "$BIN" --data-dir "$WORK/data" --model "$MODEL" eval-segments --collection "$c" \
      --topics "$WORK/$c.topics.tsv" --passages "$DATA/$c/passages.bytes.tsv" --preselect "${cell#* }" \
      > "$WORK/$c.$name.segments" 2> /dev/null
    echo "== $c $name: $(tr '\n' ' ' < "$WORK/$c.$name.segments")"
  done
done
