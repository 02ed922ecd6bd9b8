# Sourced by cobert-folds.sh and cobert-squad.sh: Co-BERT's variants on one frozen first round, and the
# results kept in the repository (experiments/results/cobert) so that a run resumes on a fresh machine.
VARIANTS="full no-calibration no-groupwise no-average other-heads"
other_heads() { [ "$1" = random ] && echo backbone || echo random; }

# train_variants DIR HEADS TRAIN_COMMAND...: trains into DIR/co-VARIANT the full model and each ablation with
# heads HEADS (backbone|random), and the full model with the other heads; TRAIN_COMMAND is a whole
# `longrank ... train --method cobert` command without --out and --heads. Trained variants are skipped.
train_variants() {
  local dir=$1 heads=$2 v h out
  shift 2
  for v in $VARIANTS; do
    h="$heads"
    local flags=()
    case "$v" in
      other-heads) h="$(other_heads "$heads")" ;;
      full) ;;
      *) flags=("--$v") ;;
    esac
    out="$dir/co-$v"
    # A run is finished when its summary is written (its model directory appears at the first dev gain).
    if [ ! -s "$out/summary.json" ]; then
      # Every variant reads the same first round: its cached features are copied, not recomputed.
      if [ -s "$dir/co-full/cobert/features-dev.jsonl" ] && [ ! -e "$out/cobert/features-dev.jsonl" ]; then
        mkdir -p "$out/cobert" && cp "$dir"/co-full/cobert/features-*.jsonl "$out/cobert/"
      fi
      "$@" --out "$out" "${flags[@]}" --heads "$h"
    fi
    # A finished run's last checkpoint (weights and optimizer state, to resume from) only takes disk space.
    rm -rf "$out/cobert/state"
  done
}

# keep FROM TO NAME...: FROM's named files gzipped into TO, then TO/complete (a run kept there is not trained again).
keep() {
  local from=$1 to=$2 n
  shift 2
  mkdir -p "$to"
  for n in "$@"; do gzip -9cn "$from/$n" > "$to/$n.gz"; done
  touch "$to/complete"
}

# restore FROM TO: every FROM/*.gz unpacked into TO, each written beside and renamed.
restore() {
  local x n
  for x in "$1"/*.gz; do
    n="$(basename "$x" .gz)"
    [ -s "$2/$n" ] || { gunzip -c "$x" > "$2/$n.part" && mv "$2/$n.part" "$2/$n"; }
  done
}
