#!/usr/bin/env bash
# scripts/plot_metrics.py: two hand-written runs (one with a skipped step whose gradient norm
# is null, and a partial last line) give a PNG of the expected size, and --summary reports the
# points drawn per panel as counted by hand; a missing metrics.jsonl is an error naming it.
# Usage: plot_metrics.sh path/to/llmtrain   (the binary is not used; run from the repository root)
set -euo pipefail
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/a" "$tmp/b"
cat > "$tmp/a/metrics.jsonl" <<'JSONL'
{"step":0,"tokens":0,"val_loss":10.9}
{"step":1,"loss":10.8,"lr":1e-4,"grad_norm":1.5,"tokens":128,"tokens_per_s":5000.0}
{"step":2,"loss":9.7,"lr":2e-4,"grad_norm":null,"tokens":256,"tokens_per_s":5100.0,"skipped":true}
{"step":3,"loss":9.1,"lr":3e-4,"grad_norm":1.1,"tokens":384,"tokens_per_s":5050.0,"val_loss":9.3}
JSONL
cat > "$tmp/b/metrics.jsonl" <<'JSONL'
{"step":1,"loss":10.7,"lr":1e-3,"grad_norm":2.0,"tokens":256,"tokens_per_s":4000.0}
{"step":2,"loss":9.0,"lr":1e-3,"grad_norm":1.0,"tokens":512,"tokens_per_s":4100.0,"val_loss":9.2}
JSONL
printf '{"step":3,"loss":8.' >> "$tmp/b/metrics.jsonl"  # a line being written

scripts/plot_metrics.py "$tmp/a" "$tmp/b" --out "$tmp/plot.png" --x tokens --summary > "$tmp/summary.txt"
cat > "$tmp/expected.txt" <<'TXT'
a loss 3 384 9.1
a val_loss 2 384 9.3
a lr 3 384 0.0003
a grad_norm 2 384 1.1
a tokens_per_s 3 384 5050.0
b loss 2 512 9.0
b val_loss 1 512 9.2
b lr 2 512 0.001
b grad_norm 2 512 1.0
b tokens_per_s 2 512 4100.0
wrote TMP/plot.png
TXT
sed -i "s|TMP|$tmp|" "$tmp/expected.txt"
diff "$tmp/expected.txt" "$tmp/summary.txt" || { echo "FAIL: summary differs"; exit 1; }
# a PNG of 900 x 1100 pixels (figsize 9 x 11 inches at 100 dpi): signature and IHDR width/height
[ "$(head -c 8 "$tmp/plot.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]
[ "$(od -An -tu1 -j16 -N8 "$tmp/plot.png" | tr -s ' ' | sed 's/^ //')" = "0 0 3 132 0 0 4 76" ] || {
  echo "FAIL: image size"; exit 1; }

# a synthetic-task run adds the accuracy panel (6 panels: 900 x 1320 pixels)
mkdir -p "$tmp/c"
cat > "$tmp/c/metrics.jsonl" <<'JSONL'
{"step":0,"tokens":0,"val_loss":2.0,"val_acc":0.1}
{"step":5,"loss":1.0,"lr":1e-3,"grad_norm":1.0,"tokens":640,"tokens_per_s":900.0,"val_loss":0.5,"val_acc":0.8}
JSONL
scripts/plot_metrics.py "$tmp/c" --out "$tmp/acc.png" --summary > "$tmp/acc.txt"
grep -qx "c val_acc 2 5 0.8" "$tmp/acc.txt" || {
  echo "FAIL: accuracy panel"; exit 1; }
[ "$(od -An -tu1 -j16 -N8 "$tmp/acc.png" | tr -s ' ' | sed 's/^ //')" = "0 0 3 132 0 0 5 40" ] || {
  echo "FAIL: image size with the accuracy panel"; exit 1; }

# --panels keeps the training loss only; --points adds a panel per evaluation point: its scaled_acc where
# given (state tracking), else its acc (MQAR); a run without the point draws nothing there (3 panels: 900 x 660)
mkdir -p "$tmp/p" "$tmp/q"
cat > "$tmp/p/metrics.jsonl" <<'JSONL'
{"step":10,"loss":0.7,"eval_points":[{"name":"L40","acc":0.9,"scaled_acc":0.8},{"name":"L256","acc":0.6,"scaled_acc":0.2}]}
{"step":20,"loss":0.1,"eval_points":[{"name":"L40","acc":1.0,"scaled_acc":1.0},{"name":"L256","acc":0.995,"scaled_acc":0.99}]}
JSONL
cat > "$tmp/q/metrics.jsonl" <<'JSONL'
{"step":30,"loss":8.3,"eval_points":[{"name":"L512_kv32","acc":0.25}]}
JSONL
scripts/plot_metrics.py "$tmp/p" "$tmp/q" --out "$tmp/pts.png" --panels loss --points L256,L512_kv32 --summary > "$tmp/pts.txt"
cat > "$tmp/pts-expected.txt" <<'TXT'
p loss 2 20 0.1
p point:L256 2 20 0.99
p point:L512_kv32 0 -
q loss 1 30 8.3
q point:L256 0 -
q point:L512_kv32 1 30 0.25
wrote TMP/pts.png
TXT
sed -i "s|TMP|$tmp|" "$tmp/pts-expected.txt"
diff "$tmp/pts-expected.txt" "$tmp/pts.txt" || { echo "FAIL: --panels / --points summary differs"; exit 1; }
[ "$(od -An -tu1 -j16 -N8 "$tmp/pts.png" | tr -s ' ' | sed 's/^ //')" = "0 0 3 132 0 0 2 148" ] || {
  echo "FAIL: image size with --panels loss and two --points"; exit 1; }
if scripts/plot_metrics.py "$tmp/p" --out "$tmp/x.png" --panels loss,accuracy > "$tmp/err.txt" 2>&1; then
  echo "FAIL: an unknown panel was accepted"; exit 1
fi
grep -q "unknown panel 'accuracy' (allowed: loss, val_loss" "$tmp/err.txt" || { echo "FAIL: unknown panel message"; exit 1; }

if scripts/plot_metrics.py "$tmp/a" "$tmp/nope" --out "$tmp/x.png" > "$tmp/err.txt" 2>&1; then
  echo "FAIL: a missing run directory was accepted"; exit 1
fi
grep -q "$tmp/nope/metrics.jsonl: not found" "$tmp/err.txt"
echo "plot_metrics: two runs drawn (points as expected), 900x1100 PNG; --panels / --points; missing file named"
