#!/usr/bin/env bash
# Synthetic tasks as data sources (docs/SYNTHETIC.md): a tiny CPU model trains a few steps on MQAR and on parity,
# and every evaluation record of metrics.jsonl carries the accuracy fields (per point and overall, scaled accuracy
# for parity); a resumed MQAR run continues the same example stream (losses identical to an uninterrupted run);
# the example configs in configs/synthetic/ parse.
# Usage: synthetic.sh path/to/llmtrain   (run from the repository root)
set -euo pipefail
llmtrain=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$llmtrain" train --config tests/configs/mqar_tiny.json --out "$tmp/mqar" > "$tmp/mqar.log" 2>&1 || { cat "$tmp/mqar.log"; fail "mqar run"; }
m=$tmp/mqar/metrics.jsonl
# Evaluations at steps 0, 3 and 6, each with two points named after (length, pairs), accuracies in [0, 1].
[ "$(jq -c 'select(.val_acc != null) | .step' "$m" | tr '\n' ' ')" = "0 3 6 " ] || fail "mqar: evaluations at 0 3 6"
jq -e 'select(.val_acc != null) | (.eval_points | map(.name)) == ["L32_kv4", "L64_kv8"]' "$m" > /dev/null || fail "mqar: point names"
jq -e -s 'map(select(.val_acc != null)) | all(.val_acc >= 0 and .val_acc <= 1 and .val_example_acc >= 0
  and .val_example_acc <= .val_acc + 1e-12 and (.eval_points | all(.acc >= 0 and .acc <= 1 and .kv_pairs > 0))
  and (.val_loss | isnormal) and (has("val_scaled_acc") | not))' "$m" > /dev/null || fail "mqar: accuracy fields"
grep -q "val_acc" "$tmp/mqar.log" || fail "mqar: the log line reports the accuracy"

# llmtrain eval on the final checkpoint scores the same evaluation points as the trainer did at step 6 (the same
# per-point losses and accuracies, to 1e-12); --precision fp32 is the CPU's own precision (the same numbers);
# text-only options are refused with their names.
pick='[.val_loss, .val_acc, .val_example_acc, (.eval_points[] | .name, .loss, .acc, .example_acc)]'
jq -c "select(.step == 6 and .val_acc != null) | $pick" "$m" > "$tmp/want.json"
for prec in "" fp32; do
  "$llmtrain" eval --checkpoint "$tmp/mqar" ${prec:+--precision $prec} --json > "$tmp/eval.json" || fail "eval of the mqar run"
  jq -e --slurpfile w "$tmp/want.json" "$pick as \$g | [\$g, \$w[0]] | transpose |
    all(if (.[0] | type) == \"number\" then (.[0] - .[1] | fabs) < 1e-12 else .[0] == .[1] end)" "$tmp/eval.json" > /dev/null \
    || fail "eval ${prec:-default}: $(jq -c "$pick" "$tmp/eval.json") vs the trainer's $(cat "$tmp/want.json")"
done
"$llmtrain" eval --checkpoint "$tmp/mqar" > "$tmp/table.txt" || fail "eval table"
grep -q "^L64_kv8 " "$tmp/table.txt" || fail "eval: the table lists the point L64_kv8"
# the table's "all" row holds the totals of --json (val_loss, val_acc, val_example_acc), printed to 4 decimals
read -r _ t_loss t_acc t_ex < <(grep "^all " "$tmp/table.txt")
jq -e --argjson l "$t_loss" --argjson a "$t_acc" --argjson e "$t_ex" '((.val_loss - $l) | fabs) < 6e-5 and
  ((.val_acc - $a) | fabs) < 6e-5 and ((.val_example_acc - $e) | fabs) < 6e-5' "$tmp/eval.json" > /dev/null \
  || fail "eval table's all row ($t_loss $t_acc $t_ex) vs --json $(jq -c '[.val_loss, .val_acc, .val_example_acc]' "$tmp/eval.json")"
if "$llmtrain" eval --checkpoint "$tmp/mqar" --max-tokens 10 > "$tmp/err.txt" 2>&1; then fail "eval --max-tokens accepted"; fi
grep -q -- "--max-tokens.* apply to text" "$tmp/err.txt" || { cat "$tmp/err.txt"; fail "eval --max-tokens message"; }
printf 'some text' > "$tmp/held.txt"
if "$llmtrain" eval --checkpoint "$tmp/mqar" --text "$tmp/held.txt" > "$tmp/err.txt" 2>&1; then fail "eval --text of an mqar run accepted"; fi
grep -q "trained on the synthetic task mqar, not on text" "$tmp/err.txt" || { cat "$tmp/err.txt"; fail "eval --text message"; }
if "$llmtrain" eval --checkpoint "$tmp/mqar" --backend cpu --precision bf16 > "$tmp/err.txt" 2>&1; then fail "eval bf16 on the cpu accepted"; fi
grep -q -- "--precision bf16 needs the cuda backend (the cpu backend computes in fp32); use --precision fp32" "$tmp/err.txt" || { cat "$tmp/err.txt"; fail "eval bf16 message"; }

# Resume: stop at step 3 (checkpoint), resume, compare with the uninterrupted run's step records.
cp -r "$tmp/mqar" "$tmp/full"
rm -rf "$tmp/mqar/checkpoints/step_00000006"
"$llmtrain" train --config tests/configs/mqar_tiny.json --out "$tmp/mqar" --resume > "$tmp/resume.log" 2>&1 || { cat "$tmp/resume.log"; fail "resume"; }
grep -q "resumed from .*step_00000003" "$tmp/resume.log" || fail "did not resume from step 3"
diff <(jq -c '[.step, .loss, .val_acc]' "$tmp/full/metrics.jsonl") <(jq -c '[.step, .loss, .val_acc]' "$m") || fail "resumed run differs"

"$llmtrain" train --config tests/configs/parity_tiny.json --out "$tmp/parity" > "$tmp/parity.log" 2>&1 || { cat "$tmp/parity.log"; fail "parity run"; }
p=$tmp/parity/metrics.jsonl
jq -e -s 'map(select(.val_acc != null)) | length == 3 and all(
  (.val_scaled_acc - (.val_acc - 0.5) / 0.5 | fabs) < 1e-12 and .val_example_acc == .val_acc
  and (.eval_points | map(.name)) == ["L12", "L20"] and (.eval_points | all(has("scaled_acc"))))' "$p" > /dev/null \
  || fail "parity: accuracy fields"

# The length curriculum: 1 step (128 tokens) at length 4, then 4 -> 12 over 256 tokens; every step's record
# names the bound of its last example (example i = 4 step - 1: 4, 4 + 8·96/256, 4 + 8·224/256, 12).
"$llmtrain" train --config tests/configs/parity_tiny.json --out "$tmp/cur" --set data.synthetic.curriculum_tokens=256 \
  data.synthetic.curriculum_hold_tokens=128 data.synthetic.curriculum_start_length=4 > "$tmp/cur.log" 2>&1 \
  || { cat "$tmp/cur.log"; fail "curriculum run"; }
[ "$(jq -c -s 'map(select(.loss != null) | .curriculum_max_length)' "$tmp/cur/metrics.jsonl")" = "[4,7,11,12]" ] \
  || fail "curriculum_max_length: $(jq -c -s 'map(.curriculum_max_length)' "$tmp/cur/metrics.jsonl")"
jq -e -s 'all(has("curriculum_max_length") | not)' "$p" > /dev/null || fail "curriculum_max_length without a curriculum"

# A vocabulary smaller than the task's ids is refused with the key named.
if "$llmtrain" train --config tests/configs/parity_tiny.json --set model.vocab_size=2 --out "$tmp/bad" > "$tmp/bad.log" 2>&1; then
  fail "vocab_size 2 accepted"
fi
grep -q "model.vocab_size (2)" "$tmp/bad.log" || { cat "$tmp/bad.log"; fail "vocab error message"; }
# The example configs parse (their sizes and data settings are valid).
for f in configs/synthetic/*.json; do
  "$llmtrain" info --config "$f" > "$tmp/info.log" 2>&1 || { cat "$tmp/info.log"; fail "$f"; }
done
echo "ok: synthetic tasks train and report accuracy"
