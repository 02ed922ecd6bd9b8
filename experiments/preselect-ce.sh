#!/usr/bin/env bash
# Preselection in front of a cross-encoder (the cost-aware MaxP issue's table). The cross-encoder: the BeST
# recipe's all-segments model (experiments/squad-train.sh with --method allp, θ⁽⁰⁾; each BeST iteration after it
# takes about an hour on 2 cores) at the recipe's lengths (best-squad.toml). SQuAD articles: every EVERY-th
# question of fold 4 (which training never sees); Time: its 83 topics; depth 10. Full MaxP scores every pair
# once (--store-scores) and each cell (selector bm25 or the MiniLM bi-encoder over the cross-encoder's own
# segments, s = 1, 2, 4, 8) reads those pairs. Then paired t-tests against full MaxP, segment selection on
# SQuAD's gold articles (P@1, best recall), Time with the bi-encoder as the scorer, and `/search` p50/p99 over
# HTTP with the caches off, full MaxP in the same run. Every step resumes: rerun it after an interruption.
# usage: experiments/preselect-ce.sh [WORK_DIR=/tmp/longrank-preselect-ce]   (MODEL: the MiniLM directory)
WORK_DEFAULT=/tmp/longrank-preselect-ce
. "$(dirname "$0")/ce-env.sh"
HTTP_SECONDS="${HTTP_SECONDS:-30}"
for c in squad time; do
  [ -e "$WORK/$c.embedded" ] && continue
  "$BIN" "${L[@]}" --model "$CE" embed --collection "$c" --name minilm --for default > /dev/null
  touch "$WORK/$c.embedded"
done
CELLS=()
for selector in bm25 bi-encoder:minilm; do
  for s in 1 2 4 8; do CELLS+=("${selector%%:*}-$s {\"selector\": \"$selector\", \"per_doc\": $s}"); done
done
for c in squad time; do
  run "$c" "$CE" full '{"selector": "none"}'
  for cell in "${CELLS[@]}"; do run "$c" "$CE" "${cell%% *}" "${cell#* }"; done
  for cell in "${CELLS[@]}"; do compare "$c" full "${cell%% *}"; done
done
# Time with the bi-encoder as the scorer (SQuAD's is experiments/preselect-squad.sh): the bm25 selector only.
run time minilm bi-full '{"selector": "none"}'
for s in 1 2 4 8; do
  run time minilm "bi-bm25-$s" "{\"selector\": \"bm25\", \"per_doc\": $s}"
  compare time bi-full "bi-bm25-$s"
done
echo "== segment selection on SQuAD's gold articles: P@1 of the model's best among those read, and how often"
echo "   they include the best of every segment (best_recall)"
for cell in 'none {"selector": "none"}' "${CELLS[@]}"; do
  echo "-- ${cell%% *}"
  "$BIN" "${L[@]}" --model "$CE" eval-segments --collection squad --topics "$WORK/squad-topics.tsv" \
    --passages "$D/passages.bytes.tsv" --preselect "${cell#* }" 2> /dev/null
done
echo "== /search over HTTP, one client, caches off: maxp at depth 10 on SQuAD, $HTTP_SECONDS s per setting"
echo "   (full MaxP four times as long)"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$BIN" --config "$SERVE_CONFIG" --data-dir "$WORK/data" --model "$CE" serve --addr "127.0.0.1:$PORT" \
  > "$WORK/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2> /dev/null' EXIT
until curl -fs "http://127.0.0.1:$PORT/health" > /dev/null; do sleep 0.5; done
for cell in 'none {"selector": "none"}' "${CELLS[@]}"; do
  seconds=$HTTP_SECONDS
  [ "${cell%% *}" = none ] && seconds=$((4 * HTTP_SECONDS))
  "$BIN" bench search --url "http://127.0.0.1:$PORT" --collection squad --topics "$WORK/squad-topics.tsv" \
    --pipeline maxp --depth 10 --http-k 10 --clients 1 --seconds "$seconds" --preselect "${cell#* }" \
    | grep RESULT
done
