# shellcheck shell=bash
# Sourced by the cross-encoder preselection experiments (preselect-ce.sh, selector-ce.sh) after they set
# WORK_DEFAULT: the BeST recipe's all-segments cross-encoder (CE, trained when missing), the SQuAD and Time
# collections and topics (every EVERY-th question of fold 4), the configuration (stored scores, and the named
# bi-encoders minilm and learned), and run/compare helpers.
. "$(dirname "$0")/squad-env.sh"
EVERY="${EVERY:-10}"
T="$SHARED/data/time"
# Batch runs keep every cross-encoder output on disk; the server has neither that nor a cache (cold queries).
CONFIG="$WORK/config.toml" SERVE_CONFIG="$WORK/serve.toml"
config() { # model settings added to the recipe's
  sed "/^\[model\]$/a $1" experiments/best-squad.toml
  printf '\n[model.named]\nminilm = "%s"\nlearned = "%s"\n' "$MODEL" "$WORK/selector/selector/model"
}
config "store_scores = true" > "$CONFIG"
{ config "cache_entries = 0"; printf '\n[server]\nrequest_timeout_ms = 300000\n'; } > "$SERVE_CONFIG"
L=(--config "$CONFIG" --data-dir "$WORK/data")
[ -d "$WORK/data/collections/squad" ] || "$BIN" "${L[@]}" index --collection squad "$D/docs.jsonl" > /dev/null
[ -d "$WORK/data/collections/time" ] || "$BIN" "${L[@]}" index --collection time "$T/docs.jsonl" > /dev/null
. experiments/squad-train.sh
[ -s "$WORK/allp/summary.json" ] ||
  /usr/bin/time -f "train allp: %e s" "$BIN" "${L[@]}" "${SQUAD_TRAIN[@]}" --method allp --out "$WORK/allp"
CE="$WORK/allp/allp/model"
awk -F'\t' 'NR == FNR { if ($2 == 4) fold4[$1] = 1; next } ($1 in fold4)' "$D/folds.tsv" "$D/topics.tsv" \
  | awk -v n="$EVERY" '(NR - 1) % n == 0' > "$WORK/squad-topics.tsv"
cp "$T/topics.tsv" "$WORK/time-topics.tsv"
declare -A QRELS=([squad]="$D/qrels.txt" [time]="$T/qrels.txt")
run() { # collection scorer (a directory, or minilm) name preselect
  local c=$1 scorer=$2 name=$3 preselect=$4
  [ -s "$WORK/$c-$name.run" ] && return
  echo "== $c $name: $preselect"
  "$BIN" "${L[@]}" --model "$scorer" batch --collection "$c" --topics "$WORK/$c-topics.tsv" --pipeline maxp \
    -k 10 --depth 10 --preselect "$preselect" --out "$WORK/$c-$name.run" 2>&1 | grep "model pairs"
}
compare() { # collection A B
  echo "== $1: A = $2, B = $3"
  "$BIN" compare -M 10 -m recip_rank -m ndcg_cut.10 "$WORK/$1-$2.run" "$WORK/$1-$3.run" "${QRELS[$1]}"
}
