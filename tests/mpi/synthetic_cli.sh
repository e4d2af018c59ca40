#!/usr/bin/env bash
# A synthetic task under `mpirun -np 2` (CTest label mpi): the ranks share the example stream and the evaluation
# batches; the step losses (means over the answers of the global batch) and the accuracies agree with one process.
# Usage: synthetic_cli.sh path/to/llmtrain path/to/mpiexec   (run from the repository root)
set -euo pipefail
llmtrain=$1 mpiexec=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
common=(--config tests/configs/mqar_tiny.json --set train.micro_batch=2)

"$mpiexec" -np 2 --oversubscribe "$llmtrain" train "${common[@]}" --out "$tmp/dp" > "$tmp/dp.log" 2>&1 ||
  { cat "$tmp/dp.log"; fail "mpirun -np 2 llmtrain train exited with an error"; }
grep -q 'data parallel: 2 ranks' "$tmp/dp.log" || { cat "$tmp/dp.log"; fail "not data parallel"; }
"$llmtrain" train "${common[@]}" --out "$tmp/single" > "$tmp/single.log" 2>&1 || { cat "$tmp/single.log"; exit 1; }
# Step losses to 1e-6; at step 0 (the same initial weights) the evaluation agrees exactly in accuracy.
paste <(jq -r 'select(.loss) | .loss' "$tmp/single/metrics.jsonl") <(jq -r 'select(.loss) | .loss' "$tmp/dp/metrics.jsonl") |
  awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-6 * $1) { print "FAIL: step " NR ": " $1 " vs " $2; bad = 1 } }
       END { exit bad }'
[ "$(jq -c 'select(.step == 0) | [.val_acc, .val_example_acc, (.eval_points | map(.acc))]' "$tmp/single/metrics.jsonl")" = \
  "$(jq -c 'select(.step == 0) | [.val_acc, .val_example_acc, (.eval_points | map(.acc))]' "$tmp/dp/metrics.jsonl")" ] ||
  fail "step-0 accuracies differ between 1 and 2 ranks"
paste <(jq -r 'select(.val_loss) | .val_loss' "$tmp/single/metrics.jsonl") <(jq -r 'select(.val_loss) | .val_loss' "$tmp/dp/metrics.jsonl") |
  awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-6 * $1) { print "FAIL: evaluation " NR ": " $1 " vs " $2; bad = 1 } }
       END { exit bad }'
echo "ok: synthetic task on 2 ranks"
