#!/usr/bin/env bash
# scripts/plot_sweep.py: a hand-written results.csv of a 3 x 2 grid (one point failed, one pending, one with
# an empty metric) gives, for best_val_loss, final_val_loss and final_val_scaled_acc, the lines and points counted
# by hand, a PNG of the expected size, and clear errors for a missing table and an unknown --x key.
# Usage: plot_sweep.sh path/to/llmtrain   (the binary is not used; run from the repository root)
set -euo pipefail
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/s"
cat > "$tmp/s/results.csv" <<'CSV'
point,train.lr,model.d_model,status,final_val_loss,best_val_loss,tokens_per_s,final_val_acc,final_val_scaled_acc,error
a,0.001,128,finished,2.5,2.4,1000,0.5,0.1,
b,0.001,256,finished,2.2,2.1,900,0.6,0.2,
c,0.01,128,finished,2.0,1.9,1000,0.7,0.4,
d,0.01,256,failed,,,,,,"bad value, named"
e,0.1,128,finished,3.0,,1000,,,
f,0.1,256,pending,,,,,,
CSV
scripts/plot_sweep.py "$tmp/s" --out "$tmp/p.png" --summary > "$tmp/out.txt"
cat > "$tmp/expected.txt" <<TXT
model.d_model=128: 0.001:2.4 0.01:1.9
model.d_model=256: 0.001:2.1
wrote $tmp/p.png
TXT
diff "$tmp/expected.txt" "$tmp/out.txt" || { echo "FAIL: lines differ"; exit 1; }
scripts/plot_sweep.py "$tmp/s" --x model.d_model --metric final_val_loss --out "$tmp/q.png" --summary > "$tmp/out2.txt"
cat > "$tmp/expected2.txt" <<TXT
train.lr=0.001: 128.0:2.5 256.0:2.2
train.lr=0.01: 128.0:2.0
train.lr=0.1: 128.0:3.0
wrote $tmp/q.png
TXT
diff "$tmp/expected2.txt" "$tmp/out2.txt" || { echo "FAIL: lines by d_model differ"; exit 1; }
scripts/plot_sweep.py "$tmp/s" --metric final_val_scaled_acc --out "$tmp/r.png" --summary > "$tmp/out3.txt"
cat > "$tmp/expected3.txt" <<TXT
model.d_model=128: 0.001:0.1 0.01:0.4
model.d_model=256: 0.001:0.2
wrote $tmp/r.png
TXT
diff "$tmp/expected3.txt" "$tmp/out3.txt" || { echo "FAIL: final_val_scaled_acc lines differ"; exit 1; }
# 700 x 450 pixels (figsize 7 x 4.5 inches at 100 dpi): PNG signature and IHDR width / height
[ "$(head -c 8 "$tmp/p.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]
[ "$(od -An -tu1 -j16 -N8 "$tmp/p.png" | tr -s ' ' | sed 's/^ //')" = "0 0 2 188 0 0 1 194" ] || {
  echo "FAIL: image size"; exit 1; }
if scripts/plot_sweep.py "$tmp/nope" --out "$tmp/x.png" > "$tmp/err.txt" 2>&1; then
  echo "FAIL: a missing sweep was accepted"; exit 1
fi
grep -q "$tmp/nope/results.csv: not found" "$tmp/err.txt"
if scripts/plot_sweep.py "$tmp/s" --x train.seed --out "$tmp/x.png" > "$tmp/err.txt" 2>&1; then
  echo "FAIL: an unknown key was accepted"; exit 1
fi
grep -q -- "--x train.seed: not an override key of this sweep (keys: train.lr, model.d_model)" "$tmp/err.txt"
echo "plot_sweep: lines per other key as counted by hand, 700x450 PNG, errors named"
