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
common=("${inputs[@]}" --tokenizer llama3 --shard-tokens 30000 --val-fraction 0.05 --doc-separator bos --threads 2)

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

kills=0
for attempt in $(seq 1 40); do
  "$llmtrain" prepare-data "${common[@]}" --out "$tmp/killed" >> "$tmp/killed.log" 2>&1 &
  pid=$!
  if [ $kills -lt 5 ]; then
    # a random moment 0.6 to 2.6 s after the start (an uninterrupted run takes about 3 s)
    sleep 0.6; sleep "$(printf '0.%03d' $((RANDOM % 1000)))"; sleep "$((RANDOM % 2))"
    if kill -9 "$pid" 2>/dev/null; then
      wait "$pid" 2>/dev/null || true
      kills=$((kills + 1))
      check_shards "$tmp/killed"
      continue
    fi
  fi
  wait "$pid"
  break
done
check_shards "$tmp/killed"
rm -f "$tmp"/killed/*.tmp
diff -r "$tmp/straight" "$tmp/killed" > /dev/null || { echo "FAIL: killed and resumed output differs"; diff -rq "$tmp/straight" "$tmp/killed"; exit 1; }
reused=$(grep -o "[0-9]* kept from an earlier run" "$tmp/killed.log" | awk '{s += $1} END {print s}')
[ "$reused" -gt 0 ] || { echo "FAIL: no run kept a finished shard of an earlier one"; cat "$tmp/killed.log"; exit 1; }
echo "ok: $kills kills, output identical to the uninterrupted run ($reused shard reuses in all)"
