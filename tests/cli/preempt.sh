#!/usr/bin/env bash
# Preemption (docs/PREEMPTION.md): SIGUSR1 or SIGTERM makes a training run finish its step,
# write a checkpoint at that step and exit 75 (SIGINT: 130); resuming then gives per-step losses, gradient
# norms and validation losses identical to an uninterrupted run. A second signal ends the
# run at once with 128 + a signal number; the same signal twice at once counts as one.
# Usage: preempt.sh path/to/llmtrain   (run from the repository root)
set -euo pipefail
llmtrain=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(--config tests/configs/kill_resume.json --set "data.cache_dir=$tmp/cache" --set train.tokens=6400
        --set checkpoint.interval_steps=1000)

"$llmtrain" train "${common[@]}" --out "$tmp/straight" > "$tmp/straight.log" 2>&1

# Waits until metrics.jsonl of run $1 has at least $2 lines.
wait_lines() { until [ -f "$1/metrics.jsonl" ] && [ "$(wc -l < "$1/metrics.jsonl")" -ge "$2" ]; do sleep 0.05; done; }

preempts=0
for sig in USR1 TERM; do
  "$llmtrain" train "${common[@]}" --out "$tmp/preempted" --resume >> "$tmp/preempted.log" 2>&1 &
  pid=$!
  wait_lines "$tmp/preempted" $((10 + 15 * preempts))
  kill -$sig $pid
  rc=0; wait $pid || rc=$?
  [ $rc -eq 75 ] || { echo "FAIL: SIGUSR1/TERM exit code $rc, expected 75"; tail "$tmp/preempted.log"; exit 1; }
  last=$(tail -1 "$tmp/preempted/metrics.jsonl" | jq .step)
  # the checkpoint is at the last step written (checkpoint.interval_steps would never write one here)
  [ -f "$(printf '%s/preempted/checkpoints/step_%08d/state.json' "$tmp" "$last")" ] || {
    echo "FAIL: no checkpoint at step $last after SIG$sig"; ls "$tmp/preempted/checkpoints"; exit 1; }
  preempts=$((preempts + 1))
done
# Ctrl-C (SIGINT): the same stop with a checkpoint, exit 130. (set -m: a background job of a script would
# otherwise start with SIGINT ignored, which the trainer leaves so.)
set -m
"$llmtrain" train "${common[@]}" --out "$tmp/preempted" --resume >> "$tmp/preempted.log" 2>&1 &
pid=$!
set +m
wait_lines "$tmp/preempted" $((10 + 15 * preempts))
kill -INT $pid
rc=0; wait $pid || rc=$?
[ $rc -eq 130 ] || { echo "FAIL: SIGINT exit code $rc, expected 130"; tail "$tmp/preempted.log"; exit 1; }
last=$(tail -1 "$tmp/preempted/metrics.jsonl" | jq .step)
[ -f "$(printf '%s/preempted/checkpoints/step_%08d/state.json' "$tmp" "$last")" ] || {
  echo "FAIL: no checkpoint at step $last after SIGINT"; ls "$tmp/preempted/checkpoints"; exit 1; }
grep -q "interrupted (Ctrl-C): stopped after step $last" "$tmp/preempted.log" || {
  echo "FAIL: no 'interrupted (Ctrl-C)' line after SIGINT"; tail "$tmp/preempted.log"; exit 1; }
preempts=$((preempts + 1))
"$llmtrain" train "${common[@]}" --out "$tmp/preempted" --resume >> "$tmp/preempted.log" 2>&1

strip() { sed -E 's/,"tokens_per_s":[^,}]*//' "$1"; }
if ! diff <(strip "$tmp/straight/metrics.jsonl") <(strip "$tmp/preempted/metrics.jsonl") > "$tmp/diff.txt"; then
  echo "FAIL: metrics differ after preemption:"; head -20 "$tmp/diff.txt"; exit 1
fi
[ "$(grep -c '"loss"' "$tmp/preempted/metrics.jsonl")" -eq 50 ] || { echo "FAIL: expected 50 steps"; exit 1; }

# A second signal: the run ends at once with 128 + the number of the signal handled second
# (pending signals are delivered in either order), before it finishes its step: no checkpoint.
"$llmtrain" train --config configs/tiny/transformer.json --set "data.cache_dir=$tmp/cache" --set eval.at_start=false \
    --out "$tmp/twice" > "$tmp/twice.log" 2>&1 &
pid=$!
until grep -q "training tokens" "$tmp/twice.log"; do sleep 0.05; done
kill -USR1 $pid; kill -TERM $pid
rc=0; wait $pid || rc=$?
[ $rc -eq 138 ] || [ $rc -eq 143 ] || { echo "FAIL: two signals: exit code $rc, expected 138 or 143"; tail "$tmp/twice.log"; exit 1; }
[ ! -d "$tmp/twice/checkpoints" ] || { echo "FAIL: two signals: a checkpoint was written"; exit 1; }
# The same signal twice at once (timeout(1) and Slurm signal the process and its process group): one request,
# so the run still writes its checkpoint and exits 75.
"$llmtrain" train "${common[@]}" --out "$tmp/dup" > "$tmp/dup.log" 2>&1 &
pid=$!
wait_lines "$tmp/dup" 10
kill -TERM $pid; kill -TERM $pid
dup_rc=0; wait $pid || dup_rc=$?
[ $dup_rc -eq 75 ] || { echo "FAIL: SIGTERM twice at once: exit code $dup_rc, expected 75"; tail "$tmp/dup.log"; exit 1; }
last=$(tail -1 "$tmp/dup/metrics.jsonl" | jq .step)
[ -f "$(printf '%s/dup/checkpoints/step_%08d/state.json' "$tmp" "$last")" ] || {
  echo "FAIL: SIGTERM twice at once: no checkpoint at step $last"; exit 1; }

echo "preempt: $preempts preemptions (exit 75, SIGINT 130) resumed to metrics identical to the uninterrupted run; second signal exits $rc; the same signal twice at once: one checkpoint, exit 75"
