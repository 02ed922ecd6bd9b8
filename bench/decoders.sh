#!/usr/bin/env bash
# Decoder rerankers' pairs/s and peak memory at Qwen3-Reranker-0.6B's shape (28 layers, 1,024 wide, 16 query and 8
# key-value heads of 128, feed-forward 3,072, a 151,669-token vocabulary; random weights), longrank beside PyTorch
# on the same model and inputs, in one run, one process per (system, length) so that each peak RSS is its own.
# PyTorch runs the model card's code path (Qwen3ForCausalLM: the full vocabulary's logits at every position, the
# last read) and the converted sequence classifier (one score row: the least PyTorch computes). One pair per pass,
# as longrank computes each input on the CPU. The tokenizer is the test fixture's: a vocabulary's tokens change
# nothing of the arithmetic.
# usage: bench/decoders.sh [WORK_DIR=/tmp/longrank-decoders] [LENGTHS=256,512,1024,4096] [DTYPES=f32]
# Needs: a release build, and a venv with torch and transformers ($PEERS_VENV, default WORK_DIR/peers).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${1:-/tmp/longrank-decoders}"
LENGTHS="${2:-256,512,1024,4096}"
DTYPES="${3:-f32}"
BIN="$(realpath "${CARGO_TARGET_DIR:-$HOME/.cache/longrank-target}/release/longrank")"
VENV="${PEERS_VENV:-$WORK/peers}"
FIXTURE="$(realpath tests/fixtures/models/qwen3-reranker)"
# The directory's name tells longrank the recipe, as a hub id would.
MODEL="$WORK/qwen3-reranker-0.6b-shape"
export RUST_LOG=warn TORCH_THREADS=2
mkdir -p "$WORK"
[ -x "$VENV/bin/python" ] || { python3 -m venv "$VENV" && "$VENV/bin/pip" install -q torch transformers; }

"$VENV/bin/python" - "$MODEL" "$FIXTURE" <<'PY'
import os, shutil, sys
import torch, transformers
out, fixture = sys.argv[1:3]
if not os.path.exists(os.path.join(out, "model.safetensors")):
    config = transformers.Qwen3Config(
        vocab_size=151669, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rope_theta=1e6, rms_norm_eps=1e-6,
        tie_word_embeddings=True, pad_token_id=0)
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(config).eval().save_pretrained(out, safe_serialization=True)
    for file in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]:
        shutil.copy(os.path.join(fixture, file), out)
    print("made", out)
PY

peer() {  # peer LENGTH DTYPE CLASS
  "$VENV/bin/python" - "$MODEL" "$1" "$2" "$3" <<'PY'
import resource, statistics, sys, time
import torch, transformers
model_dir, length, dtype, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
torch.set_num_threads(2)
torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
cls = {"causal": transformers.AutoModelForCausalLM, "seq-cls": transformers.AutoModelForSequenceClassification}[kind]
model = cls.from_pretrained(model_dir, torch_dtype=torch_dtype, attn_implementation="sdpa").eval()
ids = torch.randint(10, 600, (1, length))
reps = 3 if length <= 1024 else 1
with torch.inference_mode():
    model(input_ids=ids)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        logits = model(input_ids=ids).logits
        score = logits[:, -1, 5] - logits[:, -1, 6] if kind == "causal" else logits[:, -1]
        times.append(time.perf_counter() - t)
med = statistics.median(times)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"RESULT system=torch-{kind} len={length} batch=1 batch_s med={med:.4f} pairs_per_s_med={1 / med:.3f} "
      f"rss_mb={rss:.0f} dtype={dtype}", flush=True)
PY
}

for dtype in ${DTYPES//,/ }; do
  for length in ${LENGTHS//,/ }; do
    reps=3; [ "$length" -gt 1024 ] && reps=1
    "$BIN" bench model --dir "$MODEL" --dtype "$dtype" --lengths "$length" --batches 1 --warmup 1 --reps "$reps" \
      | grep RESULT
    peer "$length" "$dtype" causal
    peer "$length" "$dtype" seq-cls
  done
done
