#!/usr/bin/env bash
# llmtrain sweep (docs/SWEEPS.md): a 2 x 2 grid of tiny parity runs in which one point fails on purpose
# (train.seq_len 8 is too short for examples of max_length 20): results.csv lists 3 finished points with their
# losses and speed and 1 failed point with its error; a re-run skips the finished points; --emit-slurm writes the
# launch scripts and the array script without running anything.
# Usage: sweep.sh path/to/llmtrain   (run from the repository root)
set -euo pipefail
llmtrain=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
grid=(--base tests/configs/parity_tiny.json --grid train.seq_len=32,8 --grid data.synthetic.max_length=6,20)

if "$llmtrain" sweep "${grid[@]}" --out "$tmp/s" > "$tmp/run1.log" 2>&1; then fail "a sweep with a failed point exits 0"; fi
csv=$tmp/s/results.csv
[ "$(head -1 "$csv")" = "point,train.seq_len,data.synthetic.max_length,status,final_val_loss,best_val_loss,tokens_per_s,final_val_acc,error" ] \
  || { cat "$csv"; fail "header"; }
[ "$(grep -c ',finished,' "$csv")" = 3 ] || { cat "$csv"; fail "expected 3 finished points"; }
grep -q '^train.seq_len=8__data.synthetic.max_length=20,8,20,failed,.*train.seq_len >= 21' "$csv" || { cat "$csv"; fail "failed point"; }
# Finished rows carry numbers: final <= best is impossible to violate only if best is the minimum.
awk -F, '$4 == "finished" { if ($5 == "" || $6 == "" || $7 == "" || $8 == "" || $6 > $5 + 1e-12) exit 1 }' "$csv" \
  || { cat "$csv"; fail "finished rows need final/best val_loss, tokens/s and accuracy"; }
[ "$(grep -c '| finished |' "$tmp/s/results.md")" = 3 ] || fail "results.md"
[ "$(grep -c 'running' "$tmp/run1.log")" = 4 ] || fail "first sweep runs 4 points"

# Re-run: the three finished points are skipped, the failed one runs (and fails) again.
"$llmtrain" sweep "${grid[@]}" --out "$tmp/s" > "$tmp/run2.log" 2>&1 || true
[ "$(grep -c 'finished before, skipped' "$tmp/run2.log")" = 3 ] || { cat "$tmp/run2.log"; fail "re-run skips 3"; }
[ "$(grep -c 'running' "$tmp/run2.log")" = 1 ] || fail "re-run runs the failed point only"
[ "$(grep -c ',finished,' "$csv")" = 3 ] || fail "re-run results"

# --emit-slurm: scripts only.
"$llmtrain" sweep "${grid[@]}" --out "$tmp/e" --emit-slurm > "$tmp/emit.log" 2>&1
[ "$(ls "$tmp"/e/*/launch.sh | wc -l)" = 4 ] || fail "4 launch scripts"
grep -q '^#SBATCH --array=0-3$' "$tmp/e/sweep.slurm" || fail "array script"
[ -z "$(find "$tmp/e" -name metrics.jsonl)" ] || fail "--emit-slurm ran something"
[ "$(grep -c ',pending,' "$tmp/e/results.csv")" = 4 ] || fail "pending rows"
# One launch script, run by hand (as a Slurm task would), finishes its point; --collect picks it up.
bash "$tmp/e/train.seq_len=32__data.synthetic.max_length=6/launch.sh"
"$llmtrain" sweep "${grid[@]}" --out "$tmp/e" --collect > "$tmp/collect.log" 2>&1 || true
[ "$(grep -c ',finished,' "$tmp/e/results.csv")" = 1 ] || { cat "$tmp/e/results.csv"; fail "--collect"; }

# A sweep file lists override sets.
echo '{"points": [{"train.lr": 0.002}, {"train.lr": 0.005, "train.seed": 3}]}' > "$tmp/points.json"
"$llmtrain" sweep --base tests/configs/parity_tiny.json --points "$tmp/points.json" --out "$tmp/f" > "$tmp/file.log" 2>&1 \
  || { cat "$tmp/file.log"; fail "sweep file"; }
[ "$(grep -c ',finished,' "$tmp/f/results.csv")" = 2 ] || fail "sweep file results"
grep -q '^train.lr=0.005__train.seed=3,0.005,3,finished' "$tmp/f/results.csv" || { cat "$tmp/f/results.csv"; fail "sweep file row"; }
echo "ok: sweep"
