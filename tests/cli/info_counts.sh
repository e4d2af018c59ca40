#!/usr/bin/env bash
# llmtrain info: the parameter counts of the paper configs equal those derived in
# docs/spec/runs.md section 2 from the module definitions (Transformer 400M: 411.3M total,
# 308.3M non-embedding; 1.3B: 1439.1M, 1233.2M), here to the parameter.
# Usage: info_counts.sh path/to/llmtrain
set -euo pipefail
llmtrain=$1
expect() {  # config total non_embedding
  out=$("$llmtrain" info --config "$1")
  echo "$out" | grep -qx "total params: $2" || { echo "FAIL $1: expected total $2"; echo "$out"; exit 1; }
  echo "$out" | grep -qx "non-embedding params: $3" || { echo "FAIL $1: expected non-embedding $3"; echo "$out"; exit 1; }
  echo "ok $1: $2 ($3 non-embedding)"
}
# 400M: 24 * (4*1024^2 + 3*1024*2816 + 2*1024) + 1024 = 308,331,520; + 2 * 50257 * 1024
expect configs/mdn-paper/400m/transformer.json 411257856 308331520
# 1.3B: 24 * (4*2048^2 + 3*2048*5632 + 2*2048) + 2048 = 1,233,225,728; + 2 * 50257 * 2048
expect configs/mdn-paper/1.3b/transformer.json 1439078400 1233225728
