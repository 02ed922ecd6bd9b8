#!/usr/bin/env bash
# Cross-encoder pairs/s of each model family at its base size, beside PyTorch (the peer of ../shared/bench) on
# the same random-weight model and inputs, in one run (the machine is noisy: compare figures from the same run
# only). The models are made here by transformers with the base shapes (XLM-R base, ModernBERT-base,
# DeBERTa-v3-base; random weights) over the small tokenizers of tests/fixtures/models: a vocabulary's size
# changes nothing of the arithmetic of a pass.
# usage: bench/families.sh [WORK_DIR=/tmp/longrank-families] [LENGTHS=128,256] [BATCH=8]
# Needs: a release build, and a venv with torch and transformers ($PEERS_VENV, default WORK_DIR/peers).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${1:-/tmp/longrank-families}"
LENGTHS="${2:-128,256}"
BATCH="${3:-8}"
SHARED="$(realpath "${LONGRANK_SHARED:-../shared}")"
BIN="$(realpath "${CARGO_TARGET_DIR:-$HOME/.cache/longrank-target}/release/longrank")"
VENV="${PEERS_VENV:-$WORK/peers}"
FIXTURES="$(realpath tests/fixtures/models)"
export RUST_LOG=warn TORCH_THREADS=2
mkdir -p "$WORK"
[ -x "$VENV/bin/python" ] || { python3 -m venv "$VENV" && "$VENV/bin/pip" install -q torch transformers; }

"$VENV/bin/python" - "$WORK" "$FIXTURES" <<'PY'
import os, shutil, sys
import torch, transformers
work, fixtures = sys.argv[1:3]
base = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
shapes = {
    "xlm-roberta": (transformers.XLMRobertaConfig, transformers.XLMRobertaForSequenceClassification,
                    dict(base, max_position_embeddings=514, type_vocab_size=1)),
    "modernbert-mean": (transformers.ModernBertConfig, transformers.ModernBertForSequenceClassification,
                        dict(hidden_size=768, num_hidden_layers=22, num_attention_heads=12, intermediate_size=1152,
                             max_position_embeddings=8192, classifier_pooling="mean")),
    # For `longrank bench train` (BENCHMARKS.md, "Training every BERT-shaped family").
    "electra": (transformers.ElectraConfig, transformers.ElectraForSequenceClassification,
                dict(base, embedding_size=768, max_position_embeddings=512)),
    "deberta-v3": (transformers.DebertaV2Config, transformers.DebertaV2ForSequenceClassification,
                   dict(base, max_position_embeddings=512, relative_attention=True, position_buckets=256,
                        max_relative_positions=-1, pos_att_type=["p2c", "c2p"], position_biased_input=False,
                        type_vocab_size=0, norm_rel_ebd="layer_norm", share_att_key=True, pooler_hidden_size=768)),
}
for name, (config_class, model_class, shape) in shapes.items():
    out = os.path.join(work, name)
    if os.path.exists(os.path.join(out, "model.safetensors")):
        continue
    # The fixture's vocabulary and special ids, the base shape.
    small = config_class.from_pretrained(os.path.join(fixtures, name)).to_dict()
    ids = ["vocab_size", "pad_token_id", "bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id"]
    config = config_class(**{k: small[k] for k in ids if small.get(k) is not None}, **shape, num_labels=1)
    torch.manual_seed(0)
    model = model_class(config).eval()
    model.save_pretrained(out, safe_serialization=True)
    for file in ["tokenizer.json", "tokenizer_config.json"]:
        if os.path.exists(os.path.join(fixtures, name, file)):
            shutil.copy(os.path.join(fixtures, name, file), out)
    print("made", name, sum(p.numel() for p in model.parameters()) // 10**6, "M parameters")
PY

# transformers has no scaled_dot_product_attention for DeBERTa: its own (eager) attention there.
for family in xlm-roberta:sdpa modernbert-mean:sdpa deberta-v3:eager; do
  name="${family%:*}"
  echo "== $name: longrank"
  "$BIN" bench model --dir "$WORK/$name" --lengths "$LENGTHS" --batches "$BATCH" --warmup 1 --reps 3
  echo "== $name: PyTorch"
  (cd "$SHARED/bench" && MODEL_DIR="$WORK/$name" "$VENV/bin/python" peers_torch.py infer "$LENGTHS" "$BATCH" 1 3 "${family#*:}")
done
