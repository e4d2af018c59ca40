#!/usr/bin/env bash
# train.recompute end to end: `llmtrain train` with per-block recomputation logs the same
# per-step losses, gradient norms and validation losses as the run that keeps every block's
# activations (Model::plan; tests/recompute_test.cpp checks the gradients bit for bit), and
# `llmtrain bench` reports the smaller activation memory.
# Usage: recompute.sh path/to/llmtrain   (run from the repository root)
set -euo pipefail
llmtrain=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(--config tests/configs/kill_resume.json --set "data.cache_dir=$tmp/cache" --set train.tokens=2560
        --set model.n_layers=3 --set eval.interval_steps=10)

"$llmtrain" train "${common[@]}" --out "$tmp/kept" > "$tmp/kept.log" 2>&1
"$llmtrain" train "${common[@]}" --set train.recompute=true --out "$tmp/recomputed" > "$tmp/recomputed.log" 2>&1
losses() { jq -c '[.step, .loss, .grad_norm, .val_loss]' "$1/metrics.jsonl"; }
[ "$(losses "$tmp/kept" | wc -l)" -ge 20 ] || { echo "FAIL: too few metrics lines"; cat "$tmp/kept.log"; exit 1; }
diff <(losses "$tmp/kept") <(losses "$tmp/recomputed") || { echo "FAIL: recompute changed the run"; exit 1; }

saved() { "$llmtrain" bench --config tests/configs/kill_resume.json --set model.n_layers=3 --steps 1 --warmup 0 "$@" |
          sed -n 's/.*saved by the blocks \([0-9.]*\).*/\1/p'; }
off=$(saved) on=$(saved --set train.recompute=true)
echo "saved activations (MiB): $off kept, $on with recompute"
awk -v a="$off" -v b="$on" 'BEGIN { exit !(b < a) }' || { echo "FAIL: recompute did not shrink the saved activations"; exit 1; }
echo "PASS"
