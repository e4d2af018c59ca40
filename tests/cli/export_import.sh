#!/usr/bin/env bash
# llmtrain export / import (docs/INTEROP.md): a tiny GDN and a tiny GDN/attention hybrid trained for 2 steps,
# exported to the flash-linear-attention HF layout and imported back, give the same eval loss as the original
# checkpoint (bit-exact weights); the imported run resumes (`train --resume`); bf16 export changes the loss
# only a little; a tiny Mamba-3 round trip (mamba_ssm layout) gives the same loss too; a missing tensor and
# Mamba-3 with the softplus A activation are refused with errors naming them.
# Usage: export_import.sh path/to/llmtrain   (run from the repository root)
set -euo pipefail
llmtrain=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 3000 data/fineweb-edu-sample10BT-head.part1.txt > "$tmp/held.txt"

run() {  # name, extra --set arguments...
  local name=$1; shift
  "$llmtrain" train --config configs/tiny/gdn.json --out "$tmp/$name" --set train.tokens=4096 \
      --set train.warmup_tokens=2048 --set eval.tokens=2048 --set train.backend=cpu \
      --set "data.cache_dir=$tmp/cache" "$@" > "$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; exit 1; }
}
loss() { "$llmtrain" eval --checkpoint "$1" --text "$tmp/held.txt" --backend cpu --json | jq -r .loss; }

run gdn
run hybrid --set 'model.attn_layers=[1]' --set 'model.attn={"num_heads":2,"head_dim":64}'
for name in gdn hybrid; do
  "$llmtrain" export --checkpoint "$tmp/$name" --format hf --out "$tmp/$name-hf" > /dev/null
  [ "$(jq -r .model_type "$tmp/$name-hf/config.json")" = gated_deltanet ]
  "$llmtrain" import --in "$tmp/$name-hf" --out "$tmp/$name-back" > /dev/null
  a=$(loss "$tmp/$name"); b=$(loss "$tmp/$name-back")
  [ "$a" = "$b" ] || { echo "FAIL: $name: eval loss $a before export, $b after import"; exit 1; }
  echo "$name: eval loss $a before and after export -> import"
  if [ $name = gdn ]; then gdn_loss=$a; fi
done
[ "$(jq -c .attn.layers "$tmp/hybrid-hf/config.json")" = "[1]" ]

# the imported run is a checkpoint train --resume accepts (weights only: it starts at step 0)
"$llmtrain" train --config "$tmp/gdn-back/config.json" --out "$tmp/gdn-back" --resume > "$tmp/resume.log" 2>&1 \
    || { cat "$tmp/resume.log"; exit 1; }
[ "$(jq -s 'map(select(.loss != null)) | length' "$tmp/gdn-back/metrics.jsonl")" = 2 ]

# bf16: close to the f32 loss but rounded
"$llmtrain" export --checkpoint "$tmp/gdn" --out "$tmp/bf16-hf" --dtype bf16 > /dev/null
"$llmtrain" import --in "$tmp/bf16-hf" --out "$tmp/bf16-back" > /dev/null
c=$(loss "$tmp/bf16-back")
python3 -c "import sys; a, c = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if a != c and abs(a - c) < 1e-2 * a else 1)" \
    "$gdn_loss" "$c" || { echo "FAIL: bf16 loss $c vs f32 $gdn_loss"; exit 1; }

# errors name what is wrong
python3 - "$tmp/gdn-hf/model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]
raw = open(p, 'rb').read()
n = struct.unpack('<Q', raw[:8])[0]
header = json.loads(raw[8:8 + n])
del header['model.layers.0.attn.A_log']
h = json.dumps(header).encode()
open(p, 'wb').write(struct.pack('<Q', len(h)) + h + raw[8 + n:])
PY
if "$llmtrain" import --in "$tmp/gdn-hf" --out "$tmp/bad" > "$tmp/err.txt" 2>&1; then echo "FAIL: missing tensor accepted"; exit 1; fi
grep -q "model.layers.0.attn.A_log" "$tmp/err.txt" || { cat "$tmp/err.txt"; exit 1; }
# Mamba-3 goes to mamba_ssm's layout when its A activation is mamba_ssm's (heavy tail); softplus is refused
for act in heavy_tail softplus; do
  "$llmtrain" train --config configs/tiny/mamba3.json --out "$tmp/m3-$act" --set train.tokens=2048 \
      --set train.warmup_tokens=0 --set eval.tokens=2048 --set "model.mamba3.A_act=$act" \
      --set "data.cache_dir=$tmp/cache" > "$tmp/m3.log" 2>&1 || { cat "$tmp/m3.log"; exit 1; }
done
"$llmtrain" export --checkpoint "$tmp/m3-heavy_tail" --out "$tmp/m3-hf" > /dev/null
"$llmtrain" import --in "$tmp/m3-hf" --out "$tmp/m3-back" > /dev/null
a=$(loss "$tmp/m3-heavy_tail"); b=$(loss "$tmp/m3-back")
[ "$a" = "$b" ] || { echo "FAIL: mamba3: eval loss $a before export, $b after import"; exit 1; }
[ "$(jq -r .ssm_cfg.layer "$tmp/m3-hf/config.json")" = Mamba3 ]
if "$llmtrain" export --checkpoint "$tmp/m3-softplus" --out "$tmp/m3-bad" > "$tmp/err.txt" 2>&1; then
  echo "FAIL: mamba3 with A_act softplus exported"; exit 1
fi
grep -q "model.mamba3.A_act" "$tmp/err.txt" || { cat "$tmp/err.txt"; exit 1; }
echo "export_import: round trips give equal eval losses; resume, bf16 and errors as expected"
