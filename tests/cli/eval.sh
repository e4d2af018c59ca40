#!/usr/bin/env bash
# llmtrain eval:
# - on the validation windows the trainer uses (eval.tokens of the config), the loss of a
#   checkpoint equals the val_loss the trainer logged at that step;
# - over a text file every token after the first is scored once (non-overlapping or sliding),
#   the bytes counted are the file's bytes minus those of its first token ("The", GPT-2 id 464:
#   3 bytes), bits per byte = loss_sum / (ln 2 * bytes) and perplexity = exp(loss);
# - errors name the file.
# Usage: eval.sh path/to/llmtrain   (run from the repository root)
set -euo pipefail
llmtrain=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

source tests/cli_tiny_run.sh
train_tiny_run "$llmtrain" "$tmp"

# |a - b| <= tol * |b|
close() { python3 -c "import sys; a, b, t = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= t * abs(b) else 1)" "$@"; }

for step in 5 10; do
  logged=$(jq -r "select(.step == $step) | .val_loss" "$tmp/run/metrics.jsonl")
  ckpt=$(printf '%s/run/checkpoints/step_%08d' "$tmp" $step)
  "$llmtrain" eval --checkpoint "$ckpt" --data "$tmp/ds" --max-tokens 1024 --json > "$tmp/eval.json"
  got=$(jq -r .loss "$tmp/eval.json")
  [ "$(jq -r .tokens "$tmp/eval.json")" = 1024 ] || { echo "FAIL: expected 1024 scored tokens"; exit 1; }
  # the same windows in the same micro-batches: equal up to rounding of the printed value
  close "$got" "$logged" 1e-12 || { echo "FAIL: step $step: eval loss $got, trainer val_loss $logged"; exit 1; }
done
# a run directory means its newest checkpoint (step 10)
"$llmtrain" eval --checkpoint "$tmp/run" --data "$tmp/ds" --max-tokens 1024 --json > "$tmp/run.json"
[ "$(jq -r .loss "$tmp/run.json")" = "$got" ]

head -c 3000 data/fineweb-edu-sample10BT-head.part1.txt > "$tmp/held.txt"
bytes=$(( $(stat -c %s "$tmp/held.txt") - 3 ))
n=$("$llmtrain" tokenize --file "$tmp/held.txt" | wc -w)
for stride in 32 5; do
  "$llmtrain" eval --checkpoint "$tmp/run" --text "$tmp/held.txt" --stride $stride --json > "$tmp/s$stride.json"
  j="$tmp/s$stride.json"
  [ "$(jq -r .tokens "$j")" = $((n - 1)) ] || { echo "FAIL: stride $stride: $(jq .tokens "$j") tokens, expected $((n - 1))"; exit 1; }
  [ "$(jq -r .bytes "$j")" = $bytes ] || { echo "FAIL: stride $stride: $(jq .bytes "$j") bytes, expected $bytes"; exit 1; }
  close "$(jq -r .bits_per_byte "$j")" "$(python3 -c "import json, math; e = json.load(open('$j')); print(e['loss_sum'] / (math.log(2) * $bytes))")" 1e-12
  close "$(jq -r .perplexity "$j")" "$(python3 -c "import json, math; e = json.load(open('$j')); print(math.exp(e['loss_sum'] / $((n - 1))))")" 1e-12
done
# more context per token (stride 5: every token after the first window sees 27 or more tokens)
# cannot give the loss of non-overlapping windows
[ "$(jq -r .loss "$tmp/s5.json")" != "$(jq -r .loss "$tmp/s32.json")" ]

# --dump-logits: the first window's logits (seq_len 17 here) give, by log-softmax at the next token, the loss
# that eval reports for its first window of 16 targets (causal: the 17th token changes no earlier logit)
"$llmtrain" eval --checkpoint "$tmp/run" --text "$tmp/held.txt" --seq-len 17 --dump-logits "$tmp/logits.st" > /dev/null
"$llmtrain" eval --checkpoint "$tmp/run" --text "$tmp/held.txt" --seq-len 16 --max-tokens 16 --json > "$tmp/w16.json"
from_dump=$(python3 - "$tmp/logits.st" <<'PY'
import array, json, math, struct, sys
raw = open(sys.argv[1], "rb").read()
(hlen,) = struct.unpack("<Q", raw[:8])
header = json.loads(raw[8:8 + hlen])
data = raw[8 + hlen:]
def tensor(name, code):
    info = header[name]
    a = array.array(code)
    a.frombytes(data[info["data_offsets"][0]:info["data_offsets"][1]])
    return info["shape"], a
(n,), ids = tensor("input_ids", "i")
(rows, vocab), logits = tensor("logits", "f")
assert n == 17 and rows == 17, (n, rows)
loss = 0.0
for t in range(16):
    row = logits[t * vocab:(t + 1) * vocab]
    m = max(row)
    loss += m + math.log(sum(math.exp(z - m) for z in row)) - row[ids[t + 1]]
print(loss / 16)
PY
)
close "$from_dump" "$(jq -r .loss "$tmp/w16.json")" 1e-5 || { echo "FAIL: dumped logits give loss $from_dump"; exit 1; }

# errors name the file
if "$llmtrain" eval --checkpoint "$tmp/ds" --text "$tmp/held.txt" > "$tmp/err.txt" 2>&1; then echo "FAIL: not a checkpoint"; exit 1; fi
grep -q "$tmp/ds" "$tmp/err.txt"
if "$llmtrain" eval --checkpoint "$tmp/run" --text "$tmp/held.txt" --stride 33 > "$tmp/err.txt" 2>&1; then
  echo "FAIL: stride > seq_len accepted"; exit 1
fi
grep -q "stride" "$tmp/err.txt"
if "$llmtrain" eval --checkpoint "$tmp/run" --text "$tmp/held.txt" --split train > "$tmp/err.txt" 2>&1; then
  echo "FAIL: --split without --data accepted"; exit 1
fi
grep -q -- "--split requires --data" "$tmp/err.txt"
if "$llmtrain" eval --checkpoint "$tmp/run" > "$tmp/err.txt" 2>&1; then
  echo "FAIL: eval of a text checkpoint without --data or --text accepted"; exit 1
fi
grep -q -- "give the held-out text with --data DATASET_DIR or --text FILE" "$tmp/err.txt"
echo "eval: matches the trainer's val_loss at steps 5 and 10; $((n - 1)) tokens / $bytes bytes scored at strides 32 and 5"
