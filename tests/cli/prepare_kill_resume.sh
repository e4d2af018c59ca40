#!/usr/bin/env bash
# Kill `llmtrain prepare-data` with SIGKILL at random moments, rerun it each time, and check
# that the final directory is byte-identical to an uninterrupted run's (shards, dataset.json,
# state), that finished shards were kept, and that no shard under its final name is ever
# invalid (issue 3: "never leaves a half shard under its final name").
# Usage: prepare_kill_resume.sh path/to/llmtrain   (run from the repository root)
set -euo pipefail
llmtrain=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
inputs=()
for i in $(seq 1 12); do inputs+=(--input data/fineweb-edu-sample10BT-head.part1.txt --input tests/fixtures/slimpajama_derived.jsonl.zst); done
common=("${inputs[@]}" --tokenizer llama3 --shard-tokens 10000 --val-fraction 0.05 --doc-separator bos --threads 2)

"$llmtrain" prepare-data "${common[@]}" --out "$tmp/straight" > "$tmp/straight.log" 2>&1
grep -q "prepare-data: .* docs/s" "$tmp/straight.log" || { echo "FAIL: no progress line"; cat "$tmp/straight.log"; exit 1; }

# Every shard under a final name must pass the header/size check of the loader's reader.
check_shards() {
  for f in "$1"/*.bin; do
    [ -e "$f" ] || continue
    size=$(stat -c %s "$f")
    count=$(od -An -t d4 -j 8 -N 4 "$f" | tr -d ' ')
    version=$(od -An -t d4 -j 4 -N 4 "$f" | tr -d ' ')
    [ "$version" = 7 ] || { echo "FAIL: $f has version $version"; exit 1; }
    [ "$size" = $((1024 + 4 * count)) ] || { echo "FAIL: $f is $size bytes for $count tokens"; exit 1; }
  done
}

# Kill runs once they have finished at least 10, 60, 120, 200 shards (polling the directory),
# then let a last run complete. A run that ends before its target is simply not killed.
kills=0
for target in 10 60 120 200; do
  "$llmtrain" prepare-data "${common[@]}" --out "$tmp/killed" >> "$tmp/killed.log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null && [ "$(ls "$tmp/killed" 2>/dev/null | grep -c '\.bin$')" -lt "$target" ]; do
    sleep 0.01
  done
  if kill -9 "$pid" 2>/dev/null; then kills=$((kills + 1)); fi
  wait "$pid" 2>/dev/null || true
  check_shards "$tmp/killed"
done
"$llmtrain" prepare-data "${common[@]}" --out "$tmp/killed" >> "$tmp/killed.log" 2>&1
check_shards "$tmp/killed"
rm -f "$tmp"/killed/*.tmp
diff -r "$tmp/straight" "$tmp/killed" > /dev/null || { echo "FAIL: killed and resumed output differs"; diff -rq "$tmp/straight" "$tmp/killed"; exit 1; }
reused=$(grep -o "[0-9]* kept from an earlier run" "$tmp/killed.log" | awk '{s += $1} END {print s}')
[ "$reused" -gt 0 ] || { echo "FAIL: no run kept a finished shard of an earlier one"; cat "$tmp/killed.log"; exit 1; }
echo "ok: $kills kills, output identical to the uninterrupted run ($reused shard reuses in all)"
