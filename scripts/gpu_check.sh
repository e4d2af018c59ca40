#!/usr/bin/env bash
# One pass over a GPU machine: build with CUDA, run the GPU tests, the kernel benchmarks and whole training steps,
# and print a short summary; every log goes to one folder (and one .tgz beside it, for machines that return few
# files). Meant for a machine that is rented by the minute: everything in one call, nothing interactive.
#
# Usage: scripts/gpu_check.sh [options]
#   --tests REGEX    GPU tests to run (ctest -L gpu -R REGEX); "all" (default) or "none"
#   --bench "A B"    benchmark programs (bench/A_bench.cu ...) to run, each plain and with --phases
#                    (default "mamba2 mamba3 delta"; "" for none)
#   --steps "C D"    configs (paths under configs/, without .json) to time with `llmtrain bench --steps 2
#                    --set train.micro_batch=4 train.batch_tokens=16384` (default none)
#   --out DIR        where the logs go (default gpu-logs/)
# Environment: BUILD (build folder, default build-gpu); BUILDER (a command that configures and builds into
# $BUILD, default: cmake with -DCMAKE_CUDA_ARCHITECTURES=90, e.g. a wrapper that first unpacks dependencies).
# Exit status: non-zero when the build or a selected test fails.
set -uo pipefail
cd "$(dirname "$0")/.."
tests=all bench="mamba2 mamba3 delta" steps="" out=gpu-logs
while [ $# -gt 0 ]; do
  case "$1" in
    --tests) tests=$2; shift 2 ;;
    --bench) bench=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "gpu_check.sh: unknown option $1 (allowed: --tests, --bench, --steps, --out)" >&2; exit 2 ;;
  esac
done
BUILD=${BUILD:-build-gpu}
export NCCL_NVLS_ENABLE=0
mkdir -p "$out"
t0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t0 )) s"; }
pack() { tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"; }
if [ -n "${BUILDER:-}" ]; then
  $BUILDER > "$out/build.log" 2>&1
else
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 > "$out/build.log" 2>&1 &&
    cmake --build "$BUILD" -j "$(nproc)" >> "$out/build.log" 2>&1
fi || { tail -30 "$out/build.log"; pack; exit 1; }
echo "build: $(elapsed)"
status=0
if [ "$tests" != none ]; then
  filter=(); [ "$tests" = all ] || filter=(-R "$tests")
  ctest --test-dir "$BUILD" -L gpu --output-on-failure "${filter[@]}" > "$out/ctest.log" 2>&1 || status=1
  grep -E "tests passed|\*\*\*Failed|Failed  |Timeout" "$out/ctest.log"
  echo "tests: $(elapsed)"
fi
for b in $bench; do
  "$BUILD/${b}_bench" > "$out/$b.txt" 2>&1 || status=1
  "$BUILD/${b}_bench" 5 --phases > "$out/${b}_phases.txt" 2>&1 || status=1
done
[ -n "$bench" ] && echo "benchmarks: $(elapsed)"
for c in $steps; do
  n=$(echo "$c" | tr / _)
  "$BUILD/llmtrain" bench --config "configs/$c.json" --steps 2 \
    --set train.micro_batch=4 train.batch_tokens=16384 > "$out/step_$n.txt" 2>&1 || status=1
  echo "step $c: $(grep -E "tokens/s" "$out/step_$n.txt" | tail -1)"
done
pack
for b in $bench; do
  echo "== $b (GPU ms)"
  grep "^|" "$out/$b.txt" | grep -v -- "---" | tail -8
done
exit $status
