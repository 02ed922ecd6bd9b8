#!/usr/bin/env bash
# The vector-index crates side by side (bench/ann-crates): usearch (f32 and f16), hnsw_rs and hannoy on segment
# vectors drawn around real MiniLM embeddings, at 10k and 100k segments (and usearch's f16 at 1M).
# usage: bench/ann-crates.sh VECTORS.f32 (a `longrank embed` file, or several concatenated)
# Needs: cargo, a C++ compiler (usearch), about 6 GB of memory at 1M.
set -euo pipefail
cd "$(dirname "$0")/ann-crates"
cargo build --release -q
for n in 10000 100000; do
  for c in usearch16 usearch hnsw_rs hannoy; do ./target/release/anncmp "$1" 384 "$n" 200 "$c"; done
done
./target/release/anncmp "$1" 384 1000000 200 usearch16
