#!/usr/bin/env bash
# The default segment length (issue 37, items 1 and 2): `model.max_length` 512 (what shipped) against 256, every
# other setting as config.toml ships it (maxp reading each candidate's two best segments by BM25, 64 query word
# pieces, sentences packed up to max_length - 64 - 3), for maxp and firstp. Scorers: the BeST recipe's all-segments cross-encoder
# (experiments/ce-env.sh trains it when missing) and the MiniLM bi-encoder. Collections: SQuAD articles (every
# EVERY-th question of fold 4), Time, Medline and Cranfield; depth 10. MRR@10 and nDCG@10, paired t-tests of
# 256 against 512 (`longrank compare`). Every run resumes: rerun the script after an interruption.
# usage: experiments/segment-length.sh [WORK_DIR=/tmp/longrank-preselect-ce]   (MODEL: the MiniLM directory)
WORK_DEFAULT=/tmp/longrank-preselect-ce
. "$(dirname "$0")/ce-env.sh"
# The shipped configuration, with every cross-encoder output kept on disk (reruns read them) and the bi-encoder.
SHIPPED="$WORK/shipped.toml"
{
  sed 's/^store_scores = false$/store_scores = true/' config.toml
  printf 'minilm = "%s"\n' "$MODEL"
} > "$SHIPPED"
S=(--config "$SHIPPED" --data-dir "$WORK/data")
for c in medline cranfield; do
  [ -d "$WORK/data/collections/$c" ] || "$BIN" "${S[@]}" index --collection "$c" "$SHARED/data/$c/docs.jsonl" > /dev/null
  cat "$SHARED/data/$c/topics.tsv" > "$WORK/$c-topics.tsv"
  QRELS[$c]="$SHARED/data/$c/qrels.txt"
done
declare -A SCORERS=([ce]="$CE" [bi]=minilm)
# maxp as shipped (each candidate's two best segments by BM25), and firstp (the first segment), whose segment
# the length changes too.
for pipeline in maxp firstp; do
  suffix=""
  [ "$pipeline" = maxp ] || suffix="-$pipeline"
  for c in squad time medline cranfield; do
    for scorer in ce bi; do
      for len in 512 256; do
        out="$WORK/$c-len$len-$scorer$suffix.run"
        [ -s "$out" ] && continue
        echo "== $c $scorer $pipeline max_length $len"
        LONGRANK_MODEL_MAX_LENGTH=$len "$BIN" "${S[@]}" --model "${SCORERS[$scorer]}" batch --collection "$c" \
          --topics "$WORK/$c-topics.tsv" --pipeline "$pipeline" -k 10 --depth 10 \
          --preselect '{"selector": "bm25", "per_doc": 2}' --out "$out" 2>&1 | grep "model pairs"
      done
    done
  done
  for scorer in ce bi; do
    for c in squad time medline cranfield; do
      echo "== $c $scorer $pipeline: A = max_length 512 (shipped), B = 256"
      "$BIN" compare -M 10 -m recip_rank -m ndcg_cut.10 "$WORK/$c-len512-$scorer$suffix.run" \
        "$WORK/$c-len256-$scorer$suffix.run" "${QRELS[$c]}"
    done
  done
done
