#!/usr/bin/env bash
# A start that the run directory refuses fails before any data preparation: checkpoints without --resume, and
# --resume with a config that is not the run's (train.lr changed), are refused with their messages and leave
# data.cache_dir uncreated (data.text is never tokenized); the same --resume with the run's own config does
# tokenize into it (the control that shows the cache directory is where data preparation would show).
# Usage: resume_refused.sh path/to/llmtrain   (run from the repository root)
set -euo pipefail
llmtrain=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# 40 kB of text (about 9k tokens) and 12 steps of 128 tokens: a checkpoint at step 7 and one at the end.
head -c 40000 data/fineweb-edu-sample10BT-head.part1.txt > "$tmp/small.txt"
common=(--config tests/configs/kill_resume.json --set "data.text=$tmp/small.txt" --set train.tokens=1536
        --out "$tmp/run")
"$llmtrain" train "${common[@]}" --set "data.cache_dir=$tmp/cache" > "$tmp/first.log" 2>&1 \
  || { cat "$tmp/first.log"; fail "the first run"; }
ls "$tmp/run/checkpoints" | grep -q '^step_' || fail "the first run wrote no checkpoint"

# --resume with another learning rate: refused naming the key, before the cache is made.
if "$llmtrain" train "${common[@]}" --set "data.cache_dir=$tmp/cache-lr" --set train.lr=0.02 --resume \
    > "$tmp/lr.log" 2>&1; then
  fail "a resume with train.lr changed was accepted"
fi
grep -q "resume: train.lr is 0.02 in the config" "$tmp/lr.log" || { cat "$tmp/lr.log"; fail "the mismatch message"; }
[ ! -e "$tmp/cache-lr" ] || fail "the refused resume prepared data.text first ($tmp/cache-lr exists)"

# No --resume on a directory with checkpoints: refused, before the cache is made.
if "$llmtrain" train "${common[@]}" --set "data.cache_dir=$tmp/cache-new" > "$tmp/new.log" 2>&1; then
  fail "a start without --resume over checkpoints was accepted"
fi
grep -q "already holds checkpoints" "$tmp/new.log" || { cat "$tmp/new.log"; fail "the checkpoints message"; }
[ ! -e "$tmp/cache-new" ] || fail "the refused start prepared data.text first ($tmp/cache-new exists)"

# Control: the accepted resume (data.cache_dir may change under a resume) tokenizes into its cache.
"$llmtrain" train "${common[@]}" --set "data.cache_dir=$tmp/cache-ok" --resume > "$tmp/ok.log" 2>&1 \
  || { cat "$tmp/ok.log"; fail "the resume with the run's own config"; }
grep -q "resumed from" "$tmp/ok.log" || { cat "$tmp/ok.log"; fail "the accepted resume did not resume"; }
[ -d "$tmp/cache-ok" ] || fail "the accepted resume made no cache in $tmp/cache-ok"
echo "ok: refused starts (config mismatch under --resume, checkpoints without --resume) fail before data preparation"
