#!/usr/bin/env bash
# `llmtrain train` under `mpirun -np 2` (CTest label mpi; the first run through scripts/launch/mpirun.sh): the
# launcher's environment makes it
# data parallel; only rank 0 prints progress and writes metrics (one line per step); the run
# continues on 1 process from the checkpoint of 2; --set dist.zero1=true reports its sharded
# optimizer state and gives the same losses bit for bit; a global batch the ranks cannot share is
# refused on every rank with the reason, and the job fails.
# Usage: train_cli.sh path/to/llmtrain path/to/mpiexec   (run from the repository root)
set -euo pipefail
llmtrain=$1 mpiexec=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(--config tests/configs/kill_resume.json --set "data.cache_dir=$tmp/cache" --set train.tokens=1280
        --set train.warmup_tokens=256 --set checkpoint.interval_steps=5 --set checkpoint.keep=2)
fail() { echo "FAIL: $*"; exit 1; }

# Started through the launch script of the docs (scripts/launch/mpirun.sh, which execs mpirun); the Slurm batch
# script at least parses.
LLMTRAIN="$llmtrain" MPIRUN_ARGS=--oversubscribe scripts/launch/mpirun.sh 2 "${common[1]}" "${common[@]:2}" \
  --out "$tmp/dp" > "$tmp/dp.log" 2>&1 || { cat "$tmp/dp.log"; fail "scripts/launch/mpirun.sh 2 exited with an error"; }
bash -n scripts/launch/slurm.sbatch || fail "scripts/launch/slurm.sbatch does not parse"
# The batch script asks for USR1 before the limit and requeues itself when the trainer exits 75 (preempted),
# only then: run with stand-ins for srun (exits with $FAKE_RC) and scontrol (records its arguments).
mkdir "$tmp/fakebin"
printf '#!/bin/sh\nexit "$FAKE_RC"\n' > "$tmp/fakebin/srun"
printf '#!/bin/sh\necho "$@" >> "$SCONTROL_LOG"\n' > "$tmp/fakebin/scontrol"
chmod +x "$tmp/fakebin/srun" "$tmp/fakebin/scontrol"
grep -q '^#SBATCH --signal=USR1@' scripts/launch/slurm.sbatch || fail "slurm.sbatch: no #SBATCH --signal=USR1@..."
grep -q '^#SBATCH --requeue' scripts/launch/slurm.sbatch || fail "slurm.sbatch: no #SBATCH --requeue"
for rc in 75 0 1; do
  rc_seen=0
  PATH="$tmp/fakebin:$PATH" FAKE_RC=$rc SCONTROL_LOG="$tmp/scontrol.$rc" SLURM_JOB_ID=4242 \
    bash scripts/launch/slurm.sbatch configs/tiny/gdn.json > /dev/null 2>&1 || rc_seen=$?
  [ "$rc_seen" -eq "$rc" ] || fail "slurm.sbatch exited $rc_seen after the trainer's $rc"
  if [ "$rc" -eq 75 ]; then
    [ "$(cat "$tmp/scontrol.$rc" 2>/dev/null)" = "requeue 4242" ] || fail "slurm.sbatch did not requeue job 4242 after exit 75"
  else
    [ ! -e "$tmp/scontrol.$rc" ] || fail "slurm.sbatch called scontrol after exit $rc"
  fi
done
[ "$(grep -c 'data parallel: 2 ranks (mpi communicator)' "$tmp/dp.log")" -eq 1 ] ||
  { cat "$tmp/dp.log"; fail "expected one 'data parallel: 2 ranks' line (rank 0 only)"; }
[ "$(grep -c '"loss"' "$tmp/dp/metrics.jsonl")" -eq 10 ] || fail "expected 10 step lines in metrics.jsonl"

# The same run on 1 process: the same losses (printed with 17 digits; compared to 1e-6).
"$llmtrain" train "${common[@]}" --out "$tmp/single" > "$tmp/single.log" 2>&1 || { cat "$tmp/single.log"; exit 1; }
losses() { grep -o '"loss":[^,}]*' "$1/metrics.jsonl" | cut -d: -f2; }
paste <(losses "$tmp/single") <(losses "$tmp/dp") |
  awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-6 * $1) { print "FAIL: step " NR ": " $1 " vs " $2; bad = 1 } }
       END { exit bad }'

# The 2-rank run's checkpoint of step 5, continued on 1 process: the same losses.
mkdir "$tmp/down"
cp -r "$tmp/dp/checkpoints" "$tmp/dp/metrics.jsonl" "$tmp/down/"
rm -r "$tmp/down/checkpoints/step_00000010"
"$llmtrain" train "${common[@]}" --out "$tmp/down" --resume > "$tmp/down1.log" 2>&1 || { cat "$tmp/down1.log"; exit 1; }
grep -q 'resumed from .*step_00000005' "$tmp/down1.log" || fail "the 1-process run did not resume from step 5"
paste <(losses "$tmp/single") <(losses "$tmp/down") |
  awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-6 * $1) { print "FAIL: resumed step " NR ": " $1 " vs " $2; bad = 1 } }
       END { if (NR != 10) { print "FAIL: " NR " steps"; bad = 1 } exit bad }'

# ZeRO-1 on 2 ranks: the startup line gives the per-rank optimizer state; the losses are the bits
# of the all-reduce run (metrics.jsonl prints 17 significant digits).
"$mpiexec" -np 2 --oversubscribe "$llmtrain" train "${common[@]}" --set dist.zero1=true --out "$tmp/zero1" \
  > "$tmp/zero1.log" 2>&1 || { cat "$tmp/zero1.log"; fail "mpirun -np 2 llmtrain train with dist.zero1 failed"; }
grep -q 'gradients reduced to their ZeRO-1 shards in buckets overlapped with backward; optimizer state .* MiB per rank (ZeRO-1: 1/2 of the moments)' \
  "$tmp/zero1.log" || { cat "$tmp/zero1.log"; fail "no ZeRO-1 startup line"; }
[ "$(losses "$tmp/zero1")" = "$(losses "$tmp/dp")" ] || fail "ZeRO-1 losses differ from the all-reduce run"

# batch_tokens 128 = 4 x 32 x 1 micro-batch: two ranks cannot share it.
if "$mpiexec" -np 2 --oversubscribe "$llmtrain" train "${common[@]}" --set train.micro_batch=4 --out "$tmp/bad" \
  > "$tmp/bad.log" 2>&1; then
  fail "an indivisible global batch was accepted"
fi
grep -q 'not divisible by micro_batch (4) x seq_len (32) x world size (2)' "$tmp/bad.log" ||
  { cat "$tmp/bad.log"; fail "the error does not give the reason"; }
echo "train_cli: 2 ranks == 1 process, 2 -> 1 resume, ZeRO-1 == all-reduce, indivisible batch refused"
