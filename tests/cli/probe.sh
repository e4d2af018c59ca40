#!/usr/bin/env bash
# llmtrain probe: the self-test passes; --out then --inputs of that file reproduces it byte
# for byte; an unknown mixer is named in the error.
# Usage: probe.sh path/to/llmtrain
set -euo pipefail
llmtrain=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for mixer in transformer gdn comba kda mdn mamba2 mamba3; do
  "$llmtrain" probe --mixer $mixer --selftest --dtype f64 | tee "$tmp/selftest.txt"
  grep -q "probe --mixer $mixer --selftest: passed" "$tmp/selftest.txt"
done

for mixer in transformer gdn comba kda mdn mamba2 mamba3; do
  "$llmtrain" probe --mixer $mixer --batch 2 --seq-len 6 --out "$tmp/a.safetensors"
  "$llmtrain" probe --mixer $mixer --inputs "$tmp/a.safetensors" --out "$tmp/b.safetensors"
  cmp "$tmp/a.safetensors" "$tmp/b.safetensors"
done

# An unknown mixer is an error that names it.
if "$llmtrain" probe --mixer mamba9 --selftest 2> "$tmp/err.txt"; then echo "FAIL: unknown mixer accepted"; exit 1; fi
grep -q "mamba9" "$tmp/err.txt"
# A config without a layer of the probed mixer is refused naming both, before any kernel runs.
if "$llmtrain" probe --mixer gdn --config configs/tiny/transformer.json --out "$tmp/c.safetensors" > "$tmp/err2.txt" 2>&1; then
  echo "FAIL: a config without gdn layers accepted"; exit 1
fi
grep -q "configs/tiny/transformer.json has no gdn layer" "$tmp/err2.txt"
echo "probe: selftest passed; --out/--inputs round trip byte-identical; errors named"
