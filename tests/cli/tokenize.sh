#!/usr/bin/env bash
# llmtrain tokenize: the ids of hard strings equal the reference ids of js-tiktoken (GPT-2) and
# llama3-tokenizer-js (tests/fixtures/tokenizer_reference.json, made by independent tokenizers);
# the first ids of the bundled text equal data/README.md's golden values; --decode turns the
# ids (plain and --json output alike) back into the exact text; bad input is an error naming it.
# Usage: tokenize.sh path/to/llmtrain   (run from the repository root)
set -euo pipefail
llmtrain=$1
ref=tests/fixtures/tokenizer_reference.json
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# (tests/tokenizer_test.cpp checks every reference string in process; here the Unicode one goes
# through the CLI, and "hello world" below)
jq -j ".strings[1].text" "$ref" > "$tmp/text.txt"
for tok in gpt2 llama3; do
  expected=$(jq -c ".strings[1].$tok" "$ref")
  got=$("$llmtrain" tokenize --tokenizer $tok --file "$tmp/text.txt" --json | jq -c .)
  [ "$got" = "$expected" ] || { echo "FAIL: $tok ids of the Unicode string: got $got, expected $expected"; exit 1; }
done

# decode(encode(x)) == x for all reference strings, one after another, and the head of the
# bundled text, from the plain (space-separated) output
jq -j '.strings[].text' "$ref" > "$tmp/all.txt"
head -c 20000 data/fineweb-edu-sample10BT-head.part1.txt >> "$tmp/all.txt"
for tok in gpt2 llama3; do
  "$llmtrain" tokenize --tokenizer $tok --file "$tmp/all.txt" > "$tmp/ids.txt"
  "$llmtrain" tokenize --tokenizer $tok --file "$tmp/ids.txt" --decode > "$tmp/back.txt"
  cmp "$tmp/all.txt" "$tmp/back.txt" || { echo "FAIL: $tok: decode(encode(x)) differs from x"; exit 1; }
done

# --text; "hello world" is GPT-2 [31373, 995] (the reference file's first string)
[ "$("$llmtrain" tokenize --text 'hello world')" = "31373 995" ]
[ "$("$llmtrain" tokenize --decode --text '[31373, 995]')" = "hello world" ]
# the bundled text's first GPT-2 ids (data/README.md)
head -c 200 data/fineweb-edu-sample10BT-head.part1.txt > "$tmp/head.txt"
[ "$("$llmtrain" tokenize --file "$tmp/head.txt" | cut -d' ' -f1-8)" = '464 13362 12091 198 1890 477 262 1842' ]

# errors name what is wrong
if "$llmtrain" tokenize --decode --text '12 x3' > "$tmp/err.txt" 2>&1; then echo "FAIL: bad id accepted"; exit 1; fi
grep -q "offset 3" "$tmp/err.txt"
if "$llmtrain" tokenize --decode --text '99999999' > "$tmp/err.txt" 2>&1; then echo "FAIL: id out of range accepted"; exit 1; fi
grep -q "99999999" "$tmp/err.txt"
if "$llmtrain" tokenize --tokenizer nosuch.json --text hi > "$tmp/err.txt" 2>&1; then echo "FAIL: missing tokenizer accepted"; exit 1; fi
grep -q "nosuch.json" "$tmp/err.txt"
echo "tokenize: reference ids match, decode(encode(x)) == x for gpt2 and llama3; errors named"
