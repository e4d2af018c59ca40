#!/usr/bin/env bash
# llmtrain sweep (docs/SWEEPS.md): a 2 x 2 grid of tiny parity runs in which one point fails on purpose
# (train.seq_len 8 is too short for examples of max_length 20): results.csv lists 3 finished points with their
# losses and speed and 1 failed point with its error; a re-run skips the finished points; --emit-slurm writes the
# launch scripts and the array script without running anything. A re-run with a changed definition (base config,
# --set, a point's overrides) is refused; --emit-slurm refuses points whose config does not load; --set applies to
# every point before its own overrides; the Slurm script forwards SIGUSR1 to the trainer (exit 75, requeue) and
# survives SIGTERM.
# Usage: sweep.sh path/to/llmtrain   (run from the repository root)
set -euo pipefail
llmtrain=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
grid=(--base tests/configs/parity_tiny.json --grid train.seq_len=32,8 --grid data.synthetic.max_length=6,20)

if "$llmtrain" sweep "${grid[@]}" --out "$tmp/s" > "$tmp/run1.log" 2>&1; then fail "a sweep with a failed point exits 0"; fi
csv=$tmp/s/results.csv
[ "$(head -1 "$csv")" = "point,train.seq_len,data.synthetic.max_length,status,final_val_loss,best_val_loss,tokens_per_s,final_val_acc,final_val_scaled_acc,error" ] \
  || { cat "$csv"; fail "header"; }
[ "$(grep -c ',finished,' "$csv")" = 3 ] || { cat "$csv"; fail "expected 3 finished points"; }
grep -q '^train.seq_len=8__data.synthetic.max_length=20,8,20,failed,.*train.seq_len >= 21' "$csv" || { cat "$csv"; fail "failed point"; }
# Finished rows carry numbers: final <= best is impossible to violate only if best is the minimum.
awk -F, '$4 == "finished" { if ($5 == "" || $6 == "" || $7 == "" || $8 == "" || $9 == "" || $6 > $5 + 1e-12) exit 1 }' "$csv" \
  || { cat "$csv"; fail "finished rows need final/best val_loss, tokens/s, accuracy and scaled accuracy"; }
# final_val_scaled_acc is the last val_scaled_acc of the point's metrics.jsonl.
point=$tmp/s/train.seq_len=32__data.synthetic.max_length=6
want=$(grep -o '"val_scaled_acc":[^,}]*' "$point/metrics.jsonl" | tail -1 | cut -d: -f2)
got=$(grep '^train.seq_len=32__data.synthetic.max_length=6,' "$csv" | cut -d, -f9)
python3 -c "import sys; sys.exit(abs(float('$want') - float('$got')) > 1e-5 * max(1, abs(float('$want'))))" \
  || fail "final_val_scaled_acc $got is not the last val_scaled_acc $want"
[ "$(grep -c '| finished |' "$tmp/s/results.md")" = 3 ] || fail "results.md"
[ "$(grep -c 'running' "$tmp/run1.log")" = 4 ] || fail "first sweep runs 4 points"

# Re-run: the three finished points are skipped, the failed one runs (and fails) again.
"$llmtrain" sweep "${grid[@]}" --out "$tmp/s" > "$tmp/run2.log" 2>&1 || true
[ "$(grep -c 'finished before, skipped' "$tmp/run2.log")" = 3 ] || { cat "$tmp/run2.log"; fail "re-run skips 3"; }
[ "$(grep -c 'running' "$tmp/run2.log")" = 1 ] || fail "re-run runs the failed point only"
[ "$(grep -c ',finished,' "$csv")" = 3 ] || fail "re-run results"

# A changed base config is refused (exit 2) before anything runs, naming the point, the key and a new --out.
sed 's/"lr": 1e-2/"lr": 2e-2/' tests/configs/parity_tiny.json > "$tmp/base2.json"
grid2=(--base "$tmp/base2.json" "${grid[@]:2}")
set +e; "$llmtrain" sweep "${grid2[@]}" --out "$tmp/s" > "$tmp/changed.log" 2>&1; rc=$?; set -e
[ "$rc" = 2 ] || { cat "$tmp/changed.log"; fail "a changed base config exits $rc, not 2"; }
grep -q 'point train.seq_len=32__data.synthetic.max_length=6: train.lr: 0.01 -> 0.02' "$tmp/changed.log" \
  || { cat "$tmp/changed.log"; fail "the refusal names the point and the changed key"; }
grep -q 'new --out' "$tmp/changed.log" || fail "the refusal suggests a new --out"
! grep -q 'running' "$tmp/changed.log" || fail "a refused sweep ran a point"
# A grid key that no point can load (misspelt) is refused before anything is written or run, naming the key.
set +e; "$llmtrain" sweep --base tests/configs/parity_tiny.json --grid train.lrr=1e-3,1e-2 --out "$tmp/typo" \
  > "$tmp/typo.log" 2>&1; rc=$?; set -e
[ "$rc" = 2 ] || { cat "$tmp/typo.log"; fail "a sweep whose points all fail to load exits $rc, not 2"; }
grep -q 'did you mean train.lr' "$tmp/typo.log" || { cat "$tmp/typo.log"; fail "the refusal names the key"; }
[ ! -e "$tmp/typo" ] || fail "a refused sweep wrote its directory"
# Same point name, different overrides ("a b" and "a_b" both name the point run_name=_a_b_); a changed --set.
echo '{"points": [{"run_name": "a b"}]}' > "$tmp/p1.json"
echo '{"points": [{"run_name": "a_b"}]}' > "$tmp/p2.json"
base=(--base tests/configs/parity_tiny.json)
"$llmtrain" sweep "${base[@]}" --points "$tmp/p1.json" --out "$tmp/d" --emit-slurm > "$tmp/d1.log" 2>&1
set +e; "$llmtrain" sweep "${base[@]}" --points "$tmp/p2.json" --out "$tmp/d" --emit-slurm > "$tmp/d2.log" 2>&1; rc=$?; set -e
[ "$rc" = 2 ] && grep -q 'point run_name=_a_b_: overrides \["run_name=\\"a b\\""\] -> \["run_name=\\"a_b\\""\]' "$tmp/d2.log" \
  || { cat "$tmp/d2.log"; fail "changed overrides of one point name"; }
set +e; "$llmtrain" sweep "${base[@]}" --points "$tmp/p1.json" --set train.seed=5 --out "$tmp/d" --emit-slurm \
  > "$tmp/d3.log" 2>&1; rc=$?; set -e
[ "$rc" = 2 ] && grep -q 'point run_name=_a_b_: --set \[\] -> \["train.seed=5"\]' "$tmp/d3.log" \
  || { cat "$tmp/d3.log"; fail "changed --set"; }

# --emit-slurm validates every point's config first: exit 2 naming the point and the error, nothing written.
for bad in train.lrr=1e-3,2e-3 train.lr=1e-3,abc; do
  set +e; "$llmtrain" sweep "${base[@]}" --grid "$bad" --out "$tmp/bad" --emit-slurm > "$tmp/bad.log" 2>&1; rc=$?; set -e
  [ "$rc" = 2 ] || { cat "$tmp/bad.log"; fail "--emit-slurm --grid $bad exits $rc, not 2"; }
  [ ! -e "$tmp/bad" ] || fail "--emit-slurm --grid $bad wrote $tmp/bad"
done
grep -q 'point train.lr=abc: .*train.lr' "$tmp/bad.log" || { cat "$tmp/bad.log"; fail "bad value not named"; }
! grep -q 'point train.lr=1e-3:' "$tmp/bad.log" || fail "a valid point reported"

# --emit-slurm: scripts only (a grid of valid points).
egrid=(--base tests/configs/parity_tiny.json --grid train.lr=1e-2,2e-2 --grid data.synthetic.max_length=6,20)
"$llmtrain" sweep "${egrid[@]}" --out "$tmp/e" --emit-slurm > "$tmp/emit.log" 2>&1
[ "$(ls "$tmp"/e/*/launch.sh | wc -l)" = 4 ] || fail "4 launch scripts"
grep -q '^#SBATCH --array=0-3$' "$tmp/e/sweep.slurm" || fail "array script"
[ -z "$(find "$tmp/e" -name metrics.jsonl)" ] || fail "--emit-slurm ran something"
[ "$(grep -c ',pending,' "$tmp/e/results.csv")" = 4 ] || fail "pending rows"
# One launch script, run by hand (as a Slurm task would), finishes its point; --collect picks it up.
bash "$tmp/e/train.lr=1e-2__data.synthetic.max_length=6/launch.sh"
"$llmtrain" sweep "${egrid[@]}" --out "$tmp/e" --collect > "$tmp/collect.log" 2>&1 || true
[ "$(grep -c ',finished,' "$tmp/e/results.csv")" = 1 ] || { cat "$tmp/e/results.csv"; fail "--collect"; }

# A sweep file lists override sets.
echo '{"points": [{"train.lr": 0.002}, {"train.lr": 0.005, "train.seed": 3}]}' > "$tmp/points.json"
"$llmtrain" sweep --base tests/configs/parity_tiny.json --points "$tmp/points.json" --set train.seed=7 --out "$tmp/f" \
  > "$tmp/file.log" 2>&1 \
  || { cat "$tmp/file.log"; fail "sweep file"; }
[ "$(grep -c ',finished,' "$tmp/f/results.csv")" = 2 ] || fail "sweep file results"
grep -q '^train.lr=0.005__train.seed=3,0.005,3,finished' "$tmp/f/results.csv" || { cat "$tmp/f/results.csv"; fail "sweep file row"; }
# --set applies to every point, before the point's own overrides.
seed() { python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['train']['seed'])" "$1"; }
[ "$(seed "$tmp/f/train.lr=0.002/config.json")" = 7 ] || fail "--set train.seed=7 not applied"
[ "$(seed "$tmp/f/train.lr=0.005__train.seed=3/config.json")" = 3 ] || fail "a point's own override must win over --set"

# Slurm preemption, one array task per point run by hand (a fake scontrol records the requeue): SIGUSR1 to the
# batch shell (--signal=B:USR1) reaches the trainer, which checkpoints and exits 75; SIGTERM to every process of
# the task (scancel) does the same; the task requeues itself.
grep -q '^#SBATCH --signal=B:USR1@' "$tmp/e/sweep.slurm" || fail "no --signal in sweep.slurm"
mkdir -p "$tmp/bin"
printf '#!/bin/sh\necho "$@" >> %s/requeue.log\n' "$tmp" > "$tmp/bin/scontrol"
chmod +x "$tmp/bin/scontrol"
"$llmtrain" sweep "${base[@]}" --grid train.seed=1,2 --set train.tokens=100000000 --set log.interval_steps=1 \
  --out "$tmp/q" --emit-slurm > "$tmp/q.log" 2>&1
for task in 0 1; do
  dir=$tmp/q/train.seed=$((task + 1))
  SLURM_ARRAY_JOB_ID=42 SLURM_ARRAY_TASK_ID=$task PATH="$tmp/bin:$PATH" bash "$tmp/q/sweep.slurm" &
  job=$!
  for _ in $(seq 600); do [ -s "$dir/metrics.jsonl" ] && break; sleep 0.1; done
  [ -s "$dir/metrics.jsonl" ] || fail "task $task did not start"
  if [ $task = 0 ]; then
    kill -USR1 $job
  else
    launcher=$(pgrep -P $job); trainer=$(pgrep -P "$launcher")
    kill -TERM $job "$launcher" "$trainer"
  fi
  # A signal that misses the trainer leaves it training: give it 60 s, then stop it and fail.
  for _ in $(seq 600); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
  if kill -0 $job 2>/dev/null; then
    for p in $(pgrep -P $job) $job; do pkill -KILL -P "$p" || true; done
    fail "task $task: the trainer did not stop on the signal"
  fi
  set +e; wait $job; rc=$?; set -e
  [ "$rc" = 75 ] && [ "$(cat "$dir/exit_code")" = 75 ] || { cat "$dir/train.log"; fail "task $task exits $rc, not 75"; }
  [ -n "$(ls "$dir/checkpoints")" ] || fail "task $task: no checkpoint"
done
[ "$(cat "$tmp/requeue.log")" = "requeue 42_0
requeue 42_1" ] || { cat "$tmp/requeue.log"; fail "requeue"; }
echo "ok: sweep"
