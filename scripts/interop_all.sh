#!/usr/bin/env bash
# Our exported models next to the reference libraries' (docs/INTEROP.md, "Checking"): per model type a tiny
# config (d_model 128, GPT-2 vocabulary) trained 4 steps on the CPU in fp32, `llmtrain export --format hf`,
# `llmtrain eval --dump-logits` of 512 held-out tokens with --backend cpu and --backend cuda, then
# scripts/interop_check.py. All types run at once, each independent of the others; a table ends the log.
#
# Usage (repository root, on a machine with a GPU, PyTorch, Triton and transformers):
#   FLA_SRC=path/to/flash-linear-attention MDN_FLA_SRC=path/to/MomentumDeltaNet/flash-linear-attention \
#     [PYLIB=dir-with-einops-and-mamba_ssm-sources] [ONLY="gdn mamba3"] [JOBS=8] [LLMTRAIN=build/llmtrain] \
#     [OUT=interop-out] [TOTAL_S=225] scripts/interop_all.sh
# Writes $OUT/interop.log and $OUT/interop/<type>.{log,json}; big files (HF exports, logits: ~100 MB each) go
# to $WORK (default a temporary folder). Triton compiles and autotunes FLA's kernels on first use (minutes per
# model): give TOTAL_S room, run fewer at once with JOBS, or a few types with ONLY. Exit status 0 (see the table).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
OUT=${OUT:-$root/interop-out}
WORK=${WORK:-$(mktemp -d /tmp/interop.XXXXXX)}
mkdir -p "$OUT/interop" "$WORK"
LOG=$OUT/interop.log
B=${LLMTRAIN:-$root/build/llmtrain}
JOBS=${JOBS:-8}   # model types at once (each compiles and autotunes its Triton kernels on first use)
[[ "$JOBS" =~ ^[1-9][0-9]*$ ]] || { echo "JOBS=$JOBS: give a positive number of model types to run at once" >&2; exit 2; }
FLA_SRC=${FLA_SRC:--}
MDN_FLA_SRC=${MDN_FLA_SRC:--}
[ -n "${PYLIB:-}" ] && export PYTHONPATH=$PYLIB${PYTHONPATH:+:$PYTHONPATH}
export TRITON_F32_DEFAULT=ieee      # Triton's fp32 dot products in IEEE fp32, not TF32 (interop_check.py)
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export OPENBLAS_NUM_THREADS=2      # 8 trainings at once on the CPU
STAGE_S=${STAGE_S:-100}             # limit of each llmtrain step
TOTAL_S=${TOTAL_S:-225}             # everything ends by then (interop_check.py gets what is left)
# one Triton cache for all (kernels and autotune results); kept, so a second run on the same warm machine
# neither compiles nor autotunes
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/interop-triton}
head -c 6000 data/fineweb-edu-sample10BT-head.part1.txt > "$WORK/held.txt"

{
  echo "== interop $(date -u +%FT%TZ) on $(hostname); work in $WORK"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -2
  python3 - <<'PY' 2>&1
import importlib
for m in ("torch", "triton", "transformers", "safetensors", "einops", "flash_attn", "causal_conv1d", "mamba_ssm",
          "tilelang"):
    try:
        mod = importlib.import_module(m)
        print(f"  {m} {getattr(mod, '__version__', '?')} {getattr(mod, '__file__', '')}")
    except Exception as e:
        print(f"  {m}: not importable ({type(e).__name__}: {str(e)[:120]})")
PY
} > "$LOG"

# type  config  FLA source  extra --set arguments
ALL_TYPES=(
  "gdn          configs/tiny/gdn.json          $FLA_SRC"
  "gdn_hybrid   configs/tiny/gdn.json          $FLA_SRC      model.attn_layers=[1] model.attn={\"num_heads\":2,\"head_dim\":64}"
  "comba        configs/tiny/comba.json        $FLA_SRC"
  "kda          configs/tiny/kda.json          $FLA_SRC"
  "mdn          configs/tiny/mdn.json          $MDN_FLA_SRC"
  "mamba2       configs/tiny/mamba2.json       $FLA_SRC"
  "transformer  configs/tiny/transformer.json  $FLA_SRC"
  "mamba3       configs/tiny/mamba3.json       -             model.mamba3.A_act=heavy_tail"
)
TYPES=()
for line in "${ALL_TYPES[@]}"; do
  [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" ${line%% *} "* ]] && TYPES+=("$line")
done
[ ${#TYPES[@]} -gt 0 ] || { echo "ONLY=\"$ONLY\" names no model type of: ${ALL_TYPES[*]%% *}" >&2; exit 2; }

left() {  # seconds to the deadline, at most $1
  local l=$(( deadline - $(date +%s) )); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l
}
ts() { echo "== $(( $(date +%s) - start )) s: $*"; }

pipeline() {  # name config fla sets...
  local name=$1 config=$2 fla=$3; shift 3
  local d=$WORK/$name res=$OUT/interop/$name.json
  mkdir -p "$d"
  fail() { echo "{\"type\": \"$name\", \"error\": \"$1\"}" > "$res"; echo "FAILED: $1"; }
  ts "$name: train ($config $*)"
  timeout $(left $STAGE_S) "$B" train --config "$config" --out "$d/run" --set train.tokens=8192 train.warmup_tokens=2048 \
      eval.tokens=2048 eval.at_start=false train.backend=cpu train.precision=fp32 "data.cache_dir=$d/cache" \
      checkpoint.interval_steps=0 "$@" 2>&1 | tail -n 4
  [ "${PIPESTATUS[0]}" = 0 ] || { fail "train failed"; return; }
  ts "$name: export"
  timeout $(left $STAGE_S) "$B" export --checkpoint "$d/run" --format hf --out "$d/hf" 2>&1 | tail -n 3
  [ "${PIPESTATUS[0]}" = 0 ] || { fail "export failed"; return; }
  cat "$d/hf/config.json"; echo
  local dumps=()
  for be in cpu cuda; do
    ts "$name: eval --backend $be --dump-logits"
    if timeout $(left $STAGE_S) "$B" eval --checkpoint "$d/run" --text "$WORK/held.txt" --seq-len 512 --max-tokens 512 \
        --batch 1 --backend $be --json --dump-logits "$d/ours-$be.safetensors" 2>&1 | tail -n 3 \
        && [ -s "$d/ours-$be.safetensors" ]; then
      dumps+=("$d/ours-$be.safetensors")
    else
      echo "eval --backend $be failed"
    fi
  done
  [ ${#dumps[@]} -gt 0 ] || { fail "eval --dump-logits failed"; return; }
  ts "$name: interop_check.py"
  local flarg=(); [ "$fla" = - ] || flarg=(--fla "$fla")
  local limit; limit=$(left 100000)
  timeout $limit python3 scripts/interop_check.py --hf "$d/hf" --logits "${dumps[@]}" \
      "${flarg[@]}" > "$d/check.jsonl" 2> "$d/check.err"
  local rc=$?
  ts "$name: interop_check.py exited $rc"
  cat "$d/check.jsonl"; grep -v "^\s*$" "$d/check.err" | tail -n 60
  if [ -s "$d/check.jsonl" ]; then
    python3 -c "import json,sys; [print(json.dumps(dict(json.loads(l), type=sys.argv[1], rc=int(sys.argv[2])))) for l in open(sys.argv[3])]" \
        "$name" $rc "$d/check.jsonl" > "$res"
  else
    local why; why=$(grep -E "^interop_check: [A-Za-z]" "$d/check.err" | grep -v "note:" | tail -n 1 | cut -c1-300)
    [ $rc = 124 ] && why="interop_check.py timed out after ${limit}s (the ${TOTAL_S}s deadline)"
    fail "$(echo "${why:-interop_check.py exited $rc}" | sed 's/\\/\\\\/g; s/"/\\"/g')"
  fi
}

set -f  # the --set values hold [ ] (no globbing)
start=$(date +%s)
deadline=$(( start + TOTAL_S ))
for line in "${TYPES[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done  # at most JOBS types at once
  read -r name config fla sets <<< "$line"
  # shellcheck disable=SC2086
  pipeline "$name" "$config" "$fla" $sets > "$OUT/interop/$name.log" 2>&1 &
done
wait
for line in "${TYPES[@]}"; do
  read -r name _ <<< "$line"
  { echo; echo "################ $name"; cat "$OUT/interop/$name.log"; } >> "$LOG"
done

python3 - "$OUT/interop" "${TYPES[@]%% *}" <<'PY' | tee -a "$LOG"
import json, os, sys
d, names = sys.argv[1], [n.split()[0] for n in sys.argv[2:]]
rows = [("model type", "ours", "max abs diff", "max |logit|", "ratio", "argmax agree", "status")]
for n in names:
    p = os.path.join(d, n + ".json")
    recs = [json.loads(l) for l in open(p)] if os.path.exists(p) else [{"error": "no result (killed?)"}]
    for r in recs:
        if "error" in r:
            rows.append((n, "-", "-", "-", "-", "-", "ERROR: " + r["error"]))
            continue
        be = "cuda" if "cuda" in os.path.basename(r["logits"]) else "cpu"
        worst = max(r["variants"], key=lambda v: r["variants"][v]["ratio"])
        status = ("ok" if r["ok"] else "TOO DIFFERENT") + f" (tol {r['tol']:g}, worst variant {worst}; " + \
            ", ".join(f"{v} {x['ratio']:.2e}" for v, x in r["variants"].items()) + f"; {r['class']})" + \
            "".join(f"; variant {v} FAILED: {m[:120]}" for v, m in r.get("failed_variants", {}).items())
        rows.append((n, be, f"{r['max_abs_diff']:.3e}", f"{r['max_abs_logit']:.3f}", f"{r['ratio']:.2e}",
                     f"{r['argmax_agree']:.4f}", status))
w = [max(len(r[i]) for r in rows) for i in range(6)]
for r in rows:
    print(" | ".join(r[i].ljust(w[i]) for i in range(6)) + " | " + r[6])
PY
echo "total $(( $(date +%s) - start )) s; logs in $OUT/interop/, work files in $WORK" | tee -a "$LOG"
