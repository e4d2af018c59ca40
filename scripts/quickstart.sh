#!/usr/bin/env bash
# From a fresh clone: install what is missing, build, and train the default tiny Transformer
# (configs/tiny/transformer.json) on the bundled FineWeb-Edu text, on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
llmt_install_missing
llmt_install_node_tools
llmt_build llmtrain
run="runs/tiny-transformer-$(date +%Y%m%d-%H%M%S)"
./build/llmtrain train --config configs/tiny/transformer.json --out "$run" "$@"
first=$(grep -m1 '"val_loss"' "$run/metrics.jsonl" | sed -E 's/.*"val_loss":([^,}]*).*/\1/')
last=$(grep '"val_loss"' "$run/metrics.jsonl" | tail -1 | sed -E 's/.*"val_loss":([^,}]*).*/\1/')
printf 'validation loss: first evaluation %.3f, last %.3f (run directory: %s)\n' "$first" "$last" "$run"
