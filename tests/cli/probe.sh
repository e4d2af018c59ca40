#!/usr/bin/env bash
# llmtrain probe: the self-test passes; --out then --inputs of that file reproduces it byte
# for byte; an unknown mixer is named in the error.
# Usage: probe.sh path/to/llmtrain
set -euo pipefail
llmtrain=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$llmtrain" probe --mixer transformer --selftest --dtype f64 | tee "$tmp/selftest.txt"
grep -q "selftest: passed" "$tmp/selftest.txt"

"$llmtrain" probe --mixer transformer --batch 2 --seq-len 6 --out "$tmp/a.safetensors"
"$llmtrain" probe --mixer transformer --inputs "$tmp/a.safetensors" --out "$tmp/b.safetensors"
cmp "$tmp/a.safetensors" "$tmp/b.safetensors"

# An unknown mixer is an error that names it.
if "$llmtrain" probe --mixer mamba9 --selftest 2> "$tmp/err.txt"; then echo "FAIL: unknown mixer accepted"; exit 1; fi
grep -q "mamba9" "$tmp/err.txt"
echo "probe: selftest passed; --out/--inputs round trip byte-identical; errors named"
