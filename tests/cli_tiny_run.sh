# Sourced by tests/cli/eval.sh and generate.sh (not a test itself): train_tiny_run LLMTRAIN DIR prepares the
# bundled SlimPajama-derived fixture into DIR/ds and trains tests/configs/eval_tiny.json on it into DIR/run
# (its log in DIR/train.log, printed when training fails).
train_tiny_run() {
  local llmtrain=$1 dir=$2
  "$llmtrain" prepare-data --input tests/fixtures/slimpajama_derived.jsonl.zst --out "$dir/ds" --val-fraction 0.2 \
      --threads 1 --quiet > /dev/null
  "$llmtrain" train --config tests/configs/eval_tiny.json --set "data.dataset=$dir/ds" --out "$dir/run" \
      > "$dir/train.log" 2>&1 || { cat "$dir/train.log"; return 1; }
}
