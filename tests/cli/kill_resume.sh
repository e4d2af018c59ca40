#!/usr/bin/env bash
# Kill a training run with SIGKILL at random moments, resume it each time, and check that
# its per-step losses, gradient norms and validation losses are bit-identical to those of
# an uninterrupted run (a crash never corrupts the latest checkpoint: docs/CHECKPOINTS.md).
# Usage: kill_resume.sh path/to/llmtrain   (run from the repository root)
set -euo pipefail
llmtrain=$1
config=tests/configs/kill_resume.json
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(--config "$config" --set "data.cache_dir=$tmp/cache")

t0=$(date +%s%N)
"$llmtrain" train "${common[@]}" --out "$tmp/straight" > "$tmp/straight.log" 2>&1
straight_ms=$(( ($(date +%s%N) - t0) / 1000000 ))

# 8 kills at random moments of a run's span (the uninterrupted run's wall time, so a loaded machine stretches
# the moments too); the killing goes on until at least one kill came after a checkpoint existed (the next start
# must resume), at most 60 times; then the run is resumed to its end without a kill. A run that finishes before
# such a kill is started over.
kills=0 late_kills=0 finished=0
for attempt in $(seq 1 60); do
  [ $kills -lt 8 ] || [ $late_kills -eq 0 ] || break
  "$llmtrain" train "${common[@]}" --out "$tmp/killed" --resume >> "$tmp/killed.log" 2>&1 &
  pid=$!
  delay_ms=$(( 100 + RANDOM % (straight_ms > 200 ? straight_ms : 200) ))
  sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
  checkpoints=$(ls "$tmp/killed/checkpoints" 2>/dev/null | grep -c '^step_' || true)
  if kill -9 "$pid" 2>/dev/null; then
    wait "$pid" 2>/dev/null || true
    kills=$((kills + 1))
    [ "$checkpoints" -gt 0 ] && late_kills=$((late_kills + 1))
    continue
  fi
  wait "$pid"  # the run finished by itself (status 0) or failed (set -e stops the test)
  if [ $late_kills -eq 0 ]; then
    # it finished before any kill that forced a resume (a quicker start than the timed run's): start it over
    rm -rf "$tmp/killed" "$tmp/killed.log"
    kills=0
    continue
  fi
  finished=1
  break
done
if [ $finished -eq 0 ]; then
  "$llmtrain" train "${common[@]}" --out "$tmp/killed" --resume >> "$tmp/killed.log" 2>&1 \
    || { echo "FAIL: the resume after $kills kills failed:"; tail -20 "$tmp/killed.log"; exit 1; }
fi

# Everything except the wall-clock throughput must match byte for byte.
strip() { sed -E 's/,"tokens_per_s":[^,}]*//' "$1"; }
if ! diff <(strip "$tmp/straight/metrics.jsonl") <(strip "$tmp/killed/metrics.jsonl") > "$tmp/diff.txt"; then
  echo "FAIL: metrics differ after $kills kills:"; head -20 "$tmp/diff.txt"; exit 1
fi
steps=$(grep -c '"loss"' "$tmp/killed/metrics.jsonl")
resumes=$(grep -c 'resumed from' "$tmp/killed.log" || true)
echo "kill_resume: $kills SIGKILLs, $resumes resumes from a checkpoint, $steps steps identical to the uninterrupted run"
[ "$steps" -eq 300 ] || { echo "FAIL: expected 300 steps, got $steps"; exit 1; }
[ "$kills" -ge 1 ] && [ "$resumes" -ge 1 ] || { echo "FAIL: the run was never killed and resumed"; exit 1; }
