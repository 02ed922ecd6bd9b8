#!/usr/bin/env bash
# The MiniLM backbone as a cross-encoder: its files linked into DIR and a zero Linear(384, 1) head beside them.
# Its scores mean nothing; its speed is any MiniLM-L6 cross-encoder's. usage: bench/minilm-cross-encoder.sh MODEL DIR
set -euo pipefail
mkdir -p "$2"
for f in config.json tokenizer.json model.safetensors; do ln -sf "$1/$f" "$2/$f"; done
python3 - "$2/head.safetensors" <<'PY'
import json, struct, sys
header = {"classifier.weight": {"dtype": "F32", "shape": [1, 384], "data_offsets": [0, 1536]},
          "classifier.bias": {"dtype": "F32", "shape": [1], "data_offsets": [1536, 1540]}}
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + b"\0" * 1540)
PY
