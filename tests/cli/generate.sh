#!/usr/bin/env bash
# llmtrain generate (incremental decoding + sampling) on a tiny trained checkpoint:
# - a seed fixes the sampled text; greedy (temperature 0) ignores the seed;
# - one token is drawn per step, so a shorter run with the same seed is a prefix of a longer one
#   (greedy and sampled): prefill + decode carry the state correctly from step to step;
# - --max-new-tokens 0 prints the prompt unchanged;
# - --backend cuda decodes on the GPU where one is visible (else a clear error);
# - bad flags and bad checkpoints are clear errors naming the flag or the path.
# Usage: generate.sh path/to/llmtrain   (run from the repository root)
set -euo pipefail
llmtrain=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

source tests/cli_tiny_run.sh
train_tiny_run "$llmtrain" "$tmp"

gen() { "$llmtrain" generate --checkpoint "$tmp/run" --prompt "The history of" "$@"; }
fail() { echo "FAIL: $*"; exit 1; }

a=$(gen --max-new-tokens 16 --seed 7)
b=$(gen --max-new-tokens 16 --seed 7)
[ "$a" = "$b" ] || fail "seed 7 gave two texts: '$a' / '$b'"
c=$(gen --max-new-tokens 16 --seed 8)
[ "$a" != "$c" ] || fail "seeds 7 and 8 gave the same sampled text '$a'"
short=$(gen --max-new-tokens 5 --seed 7)
[[ "$a" == "$short"* ]] || fail "5 sampled tokens '$short' are not a prefix of 16 '$a'"
[ "$short" != "The history of" ] || fail "no tokens generated"

g1=$(gen --max-new-tokens 16 --temperature 0 --seed 1)
g2=$(gen --max-new-tokens 16 --temperature 0 --seed 2)
[ "$g1" = "$g2" ] || fail "greedy depends on the seed: '$g1' / '$g2'"
g3=$(gen --max-new-tokens 4 --temperature 0)
[[ "$g1" == "$g3"* ]] || fail "greedy 4 tokens '$g3' are not a prefix of 16 '$g1'"
# top-k 1 is greedy at any temperature
k1=$(gen --max-new-tokens 16 --temperature 1.5 --top-k 1 --seed 9)
[ "$k1" = "$g1" ] || fail "top-k 1 '$k1' differs from greedy '$g1'"
[ "$(gen --max-new-tokens 0)" = "The history of" ] || fail "--max-new-tokens 0 changed the prompt"
gen --max-new-tokens 8 --temperature 0.8 --top-k 20 --top-p 0.9 --seed 3 > /dev/null

# errors name the flag or the path
expect_error() {  # expect_error PATTERN ARGS...: the command fails and its output contains PATTERN
  local pattern=$1
  shift
  if "$llmtrain" generate "$@" > "$tmp/err.txt" 2>&1; then fail "accepted: $*"; fi
  grep -q -- "$pattern" "$tmp/err.txt" || { cat "$tmp/err.txt"; fail "no '$pattern' in the error of: $*"; }
}
expect_error "--temperature" --checkpoint "$tmp/run" --prompt x --temperature -1
expect_error "--top-p" --checkpoint "$tmp/run" --prompt x --top-p 0
expect_error "--top-p" --checkpoint "$tmp/run" --prompt x --top-p 1.5
expect_error "--top-k" --checkpoint "$tmp/run" --prompt x --top-k -2
expect_error "--max-new-tokens" --checkpoint "$tmp/run" --prompt x --max-new-tokens -1
expect_error "--prompt" --checkpoint "$tmp/run"
expect_error "empty prompt" --checkpoint "$tmp/run" --prompt ""
expect_error "$tmp/ds" --checkpoint "$tmp/ds" --prompt x
expect_error "--seed: must be a non-negative integer" --checkpoint "$tmp/run" --prompt x --seed -1
# a synthetic-task checkpoint has no text tokenizer: refused, naming the task
"$llmtrain" train --config tests/configs/parity_tiny.json --out "$tmp/parity" \
    > "$tmp/parity.log" 2>&1 || { cat "$tmp/parity.log"; fail "parity run"; }
expect_error "data.source = parity" --checkpoint "$tmp/parity" --prompt x
# warnings on stderr (stdout holds the text alone): greedy ignores top-k
w=$(gen --max-new-tokens 4 --temperature 0 --top-k 5 2> "$tmp/warn.txt")
grep -q "top-k and --top-p have no effect" "$tmp/warn.txt" || fail "no warning for top-k with greedy"
[[ "$g1" == "$w"* ]] || fail "stdout of a warned run '$w' is not the greedy text"
# --backend cuda: decoding on the GPU where one is visible (greedy, reproducible, a prefix of a longer run),
# else the error naming the missing device
if gen --max-new-tokens 8 --temperature 0 --backend cuda > "$tmp/cuda_out.txt" 2> "$tmp/cuda_err.txt"; then
  cuda_out=$(cat "$tmp/cuda_out.txt")
  [ "$cuda_out" = "$(gen --max-new-tokens 8 --temperature 0 --backend cuda)" ] || fail "cuda greedy not reproducible"
  [[ "$(gen --max-new-tokens 16 --temperature 0 --backend cuda)" == "$cuda_out"* ]] ||
    fail "cuda greedy 8 tokens '$cuda_out' are not a prefix of 16"
  [ "$cuda_out" != "The history of" ] || fail "no tokens generated on cuda"
else
  cat "$tmp/cuda_out.txt" "$tmp/cuda_err.txt" | grep -q "no CUDA device is visible\|has no CUDA backend (configured with LLMT_CUDA=OFF, or no CUDA compiler was found); reconfigure" ||
    { cat "$tmp/cuda_out.txt" "$tmp/cuda_err.txt"; fail "--backend cuda failed for another reason than a missing GPU"; }
fi
echo "generate: seeded sampling and greedy are reproducible and prefix-consistent; '$g1'"
