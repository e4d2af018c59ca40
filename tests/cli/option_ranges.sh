#!/usr/bin/env bash
# Numeric command-line options out of range (tools/cli_checks.h): the error names the option and states the
# rule and the value given ("--stride: must be a number > 0, got 0"), exit 2, nothing run.
# Usage: option_ranges.sh path/to/llmtrain   (run from the repository root)
set -euo pipefail
llmtrain=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# expect_error EXPECTED_MESSAGE ARGS...: llmtrain ARGS exits 2 and its output contains EXPECTED_MESSAGE
expect_error() {
  local want=$1 rc=0
  shift
  "$llmtrain" "$@" > "$tmp/out.txt" 2>&1 || rc=$?
  [ "$rc" = 2 ] || { echo "FAIL: llmtrain $*: exit $rc, expected 2"; cat "$tmp/out.txt"; exit 1; }
  grep -qF -- "$want" "$tmp/out.txt" || { echo "FAIL: llmtrain $*: expected '$want' in:"; cat "$tmp/out.txt"; exit 1; }
}

mkdir "$tmp/ckpt"  # an existing directory: the value checks come before any checkpoint is read
expect_error "--stride: must be a number > 0, got 0" eval --checkpoint "$tmp/ckpt" --text README.md --stride 0
expect_error "--max-tokens: must be a number > 0, got -5" eval --checkpoint "$tmp/ckpt" --text README.md --max-tokens -5
expect_error "--steps: must be a number > 0, got abc" bench --config configs/tiny/transformer.json --steps abc
expect_error "--warmup: must be a number >= 0, got -1" bench --config configs/tiny/transformer.json --warmup -1
expect_error "--threads: must be a number >= 0, got -1" prepare-data --input README.md --out "$tmp/ds" --threads -1
expect_error "--batch: must be a number > 0, got 0" probe --mixer gdn --batch 0
[ ! -e "$tmp/ds" ] || { echo "FAIL: prepare-data wrote $tmp/ds despite a bad option"; exit 1; }
echo "option_ranges: ok"
