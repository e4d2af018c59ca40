#!/usr/bin/env bash
# llmtrain info: the parameter counts of the paper configs equal those derived in
# docs/spec/runs.md section 2 from the module definitions (Transformer 400M: 411.3M total,
# 308.3M non-embedding; 1.3B: 1439.1M, 1233.2M), here to the parameter.
# Usage: info_counts.sh path/to/llmtrain
set -euo pipefail
llmtrain=$1
expect() {  # config total non_embedding
  out=$("$llmtrain" info --config "$1")
  grep -qx "total params: $2" <<< "$out" || { echo "FAIL $1: expected total $2"; echo "$out"; exit 1; }
  grep -qx "non-embedding params: $3" <<< "$out" || { echo "FAIL $1: expected non-embedding $3"; echo "$out"; exit 1; }
  echo "ok $1: $2 ($3 non-embedding)"
  checked+=("$1")
}
checked=()
# 400M: 24 * (4*1024^2 + 3*1024*2816 + 2*1024) + 1024 = 308,331,520; + 2 * 50257 * 1024
expect configs/mdn-paper/400m/transformer.json 411257856 308331520
# 1.3B: 24 * (4*2048^2 + 3*2048*5632 + 2*2048) + 2048 = 1,233,225,728; + 2 * 50257 * 2048
expect configs/mdn-paper/1.3b/transformer.json 1439078400 1233225728
# GDN 400M (runs.md 2.1: 417.3M, 314.4M): per layer q,k 2*768*1024 + v,g 2*1536*1024 + o 1024*1536
# + a,b 2*6*1024 + A_log,dt_bias 12 + convs (768+768+1536)*4 + o_norm 256 + MLP 3*1024*2816 + norms 2*1024
expect configs/mdn-paper/400m/gdn.json 417278460 314352124
# GDN 1.3B (runs.md 2.2: 1462.1M, 1256.3M): the same with D 2048, 6 heads x 256, d_v 512, MLP 5632
expect configs/mdn-paper/1.3b/gdn.json 1462129404 1256276732
# Comba 400M (runs.md 2.1: 417.3M, 314.4M): GDN's per layer (14,969,100 = 786,432*2 q,k + 1,572,864*2 v,g
# + 1,572,864 o + 12,288 a,b + 12 A_log,dt_bias + 12,288 convs + 256 o_norm + 8,650,752 MLP + 2,048 norms)
# + decay, D 2*6 = 14,969,112; * 21 + final norm 1024 = 314,352,376; + 2 * 50257 * 1024 = 417,278,712
expect configs/mdn-paper/400m/comba.json 417278712 314352376
# Comba 1.3B (runs.md 2.2: 1462.1M, 1256.3M): GDN's per layer (59,822,604 = 3,145,728*2 q,k + 6,291,456*2 v,g
# + 6,291,456 o + 24,576 a,b + 12 + 24,576 convs + 512 o_norm + 34,603,008 MLP + 4,096 norms) + decay, D 12
# = 59,822,616; * 21 + final norm 2048 = 1,256,276,984; + 2 * 50257 * 2048 = 1,462,129,656
expect configs/mdn-paper/1.3b/comba.json 1462129656 1256276984
# GDN-H 3:1 400M (runs.md 2.3: 430.7M): 18 GDN layers (8 x 128, expand_v 1: q,k,v,g,o 5*1024^2 + a,b 2*8*1024
# + A_log,dt_bias 16 + convs 3*1024*4 + o_norm 128 = 5,271,696) + 6 attention layers (4*1024^2) + 24 * (MLP
# 3*1024*2816 + norms 2*1024) + final norm 1024 = 327,724,576; + 2 * 50257 * 1024 = 430,650,912
expect configs/mdn-paper/400m/hybrid/gdn-h-3to1.json 430650912 327724576
# Comba-H 3:1 400M (runs.md 2.3: 430.7M): GDN-H 3:1 plus decay and D (2 * 8) in each of the 18 Comba layers
expect configs/mdn-paper/400m/hybrid/comba-h-3to1.json 430651200 327724864
# KDA 400M (runs.md 2.1: 424.4M, 321.5M): per layer q,k,v 3*1024^2 + f_proj (128*1024 + 1024*128) + b_proj 8*1024
# + A_log 8 + dt_bias 1024 + convs 3*1024*4 + g_proj (128*1024 + 1024*128 + bias 1024) + o_norm 128 + o 1024^2
# = 4,741,256; + MLP 3*1024*2816 + norms 2*1024 = 13,394,056; * 24 + final norm 1024 = 321,458,368;
# + 2 * 50257 * 1024 = 424,384,704
expect configs/mdn-paper/400m/kda.json 424384704 321458368
# KDA 1.3B (runs.md 2.2: 1465.7M, 1259.9M): per layer q,k,v 3*2048^2 + f_proj 2*128*2048 + b_proj 16*2048 + A_log 16
# + dt_bias 2048 + convs 3*2048*4 + g_proj (2*128*2048 + 2048) + o_norm 128 + o 2048^2 = 17,887,376; + MLP
# 3*2048*5632 + norms 2*2048 = 52,494,480; * 24 + final norm 2048 = 1,259,869,568; + 2 * 50257 * 2048 = 1,465,722,240
expect configs/mdn-paper/1.3b/kda.json 1465722240 1259869568
# KDA-H 3:1 400M (runs.md 2.3: 421.1M): 18 KDA layers (4,741,256 each, as KDA 400M) + 6 attention layers (4*1024^2)
# + 24 * (MLP 3*1024*2816 + norms 2*1024) + final norm 1024 = 318,176,656; + 2 * 50257 * 1024 = 421,102,992
expect configs/mdn-paper/400m/hybrid/kda-h-3to1.json 421102992 318176656
# Mamba2 400M (runs.md 2.1: 419.8M, 316.9M; 6.60M per layer): 48 mixer-only blocks, per layer in_proj
# (2*2048 + 2*128 + 32) * 1024 + conv 2304 * 4 + conv bias 2304 + dt_bias, A_log, D 3*32 + norm 2048
# + out_proj 1024 * 2048 + attn_norm 1024 = 6,601,056; * 48 + final norm 1024 = 316,851,712;
# + 2 * 50257 * 1024 = 419,778,048
expect configs/mdn-paper/400m/mamba2.json 419778048 316851712
# Mamba2 1.3B (runs.md 2.2: 1446.6M, 1240.8M; 25.85M per layer): in_proj (2*4096 + 2*128 + 64) * 2048 + conv 4352 * 5
# + 3*64 + norm 4096 + out_proj 2048 * 4096 + attn_norm 2048 = 25,849,280; * 48 + 2048 = 1,240,767,488;
# + 2 * 50257 * 2048 = 1,446,620,160
expect configs/mdn-paper/1.3b/mamba2.json 1446620160 1240767488
# MDN 400M (runs.md 2.1: 417.5M, 314.6M): GDN's per layer (14,969,100) + m_proj, e_proj 2*6*1024
# + Mu_log, mu_bias, log_factor, D_log 4*6 = 14,981,412; * 21 + final norm 1024 = 314,610,676;
# + 2 * 50257 * 1024 = 417,537,012
expect configs/mdn-paper/400m/mdn.json 417537012 314610676
# MDN 1.3B (runs.md 2.2: 1462.6M, 1256.8M): GDN 1.3B's per layer (59,822,604) + m_proj, e_proj 2*6*2048 + 4*6
# = 59,847,204; * 21 + final norm 2048 = 1,256,793,332; + 2 * 50257 * 2048 = 1,462,646,004
expect configs/mdn-paper/1.3b/mdn.json 1462646004 1256793332
# MDN-H 3:1 400M (runs.md 2.3: 430.9M): GDN-H 3:1 (327,724,576) + per MDN layer m_proj, e_proj 2*8*1024 + 4*8
# = 16,416, * 18 = 295,488 -> 328,020,064; + 2 * 50257 * 1024 = 430,946,400
expect configs/mdn-paper/400m/hybrid/mdn-h-3to1.json 430946400 328020064
# MDN-H 7:1 400M (runs.md 2.3: 434.2M): 21 MDN layers (5,271,696 + 16,416 = 5,288,112 each) + 3 attention layers
# (4*1024^2) + 24 * (MLP 3*1024*2816 + norms 2*1024) + final norm 1024 = 331,301,488; + 102,926,336 = 434,227,824
expect configs/mdn-paper/400m/hybrid/mdn-h-7to1.json 434227824 331301488
# Mamba2-H 3:1 400M (runs.md 2.3 gives no count; our reading: Mamba2 400M with every 4th of its 48 mixer-only layers
# attention): 36 Mamba2 layers (6,601,056 each with their norm) + 12 attention layers (4*1024^2 + norm 1024 =
# 4,195,328) + final norm 1024 = 287,982,976; + 2 * 50257 * 1024 = 390,909,312
expect configs/mdn-paper/400m/hybrid/mamba2-h-3to1.json 390909312 287982976
# Ablations of the paper's Tables 4 / 6 (400M; runs.md 2.1 gives only MDN 400M's 417.5M, which the floor, no-floor,
# no-alpha_max, no-beta_max and eta = 2 sigmoid variants equal exactly). No output correction: no D_log, -6 per layer
# (-126; 417.5M).
# No momentum (GDN + alpha_max / beta_max): no m_proj, e_proj, Mu_log, mu_bias, -12,300 per layer (-258,300):
# 417,278,712 (417.3M, 0.06% below MDN's 417.5M; = GDN 400M + log_factor, D_log).
for a in floor-2 floor-1.5 floor-1.357 floor-1 no-momentum-floor no-alpha-max no-beta-max eta-2sigmoid; do
  expect configs/mdn-paper/400m/ablations/mdn-$a.json 417537012 314610676
done
expect configs/mdn-paper/400m/ablations/mdn-no-output-correction.json 417536886 314610550
expect configs/mdn-paper/400m/ablations/mdn-no-momentum.json 417278712 314352376
# Mamba-3 (runs.md 3.2: SISO 186.8M / 443.0M / 892.8M / 1494.7M; MIMO 1.4947B at 1.5B), tied, vocab 128256, N 128,
# P 64, H = 2 d / 64, S = 32 angles: per layer in_proj d * (4 d + 2 * 128 R + 3 H + 32) + dt_bias, D 2 H + B_bias,
# C_bias 2 H R 128 + B_norm, C_norm 2 * 128 + out_proj 2 d^2 (+ mimo_x, mimo_z, mimo_o 3 H R 64 for R = 4)
# + MLP 3 d F + norms 2 d; * layers + final norm d; + 128256 d. 1.5B SISO: 17,760,256 + 128 + 16,384 + 256
# + 8,388,608 + 25,165,824 + 4,096 = 51,335,552; * 24 + 2048 = 1,232,055,296; + 262,668,288 = 1,494,723,584.
# MIMO (R = 4) adds 2 * 128 * 3 * d + 2 H * 3 * 128 + 3 H * 4 * 64 = 3 d (4096 - 3824) per layer: the same totals.
expect configs/mamba3-paper/180m/mamba3-siso.json 186849600 88348992
expect configs/mamba3-paper/440m/mamba3-siso.json 443015680 311681536
expect configs/mamba3-paper/880m/mamba3-siso.json 892782336 695781120
expect configs/mamba3-paper/1.5b/mamba3-siso.json 1494723584 1232055296
for s in 180m 440m 880m 1.5b; do
  siso=$("$llmtrain" info --config configs/mamba3-paper/$s/mamba3-siso.json | grep -E '^(total|non-embedding) params')
  mimo=$("$llmtrain" info --config configs/mamba3-paper/$s/mamba3-mimo.json | grep -E '^(total|non-embedding) params')
  [[ "$siso" == "$mimo" ]] || { echo "FAIL $s: MIMO (MLP - 272) differs from SISO"; echo "$siso"; echo "$mimo"; exit 1; }
  echo "ok configs/mamba3-paper/$s/mamba3-mimo.json: equals SISO"
  checked+=("configs/mamba3-paper/$s/mamba3-mimo.json")
done
# Mamba-3 paper baselines at 1.5B (runs.md 3.2, tag A: Transformer 1.4959B, GDN 1.4725B, Mamba-2 1.4871B), tied
# Llama-3.1 embedding 128256 * 2048 = 262,668,288. Transformer: per layer 4 * 2048^2 + MLP 3 * 2048 * 5632
# + norms 2 * 2048 = 51,384,320; * 24 + 2048 = 1,233,225,728.
expect configs/mamba3-paper/1.5b/transformer.json 1495894016 1233225728
# GDN (12 heads, d_k 128, d_v 256): q,k 2 * 1536 * 2048 + v,g 2 * 3072 * 2048 + o 2048 * 3072 + a,b 2 * 12 * 2048
# + A_log, dt_bias 24 + convs (1536 + 1536 + 3072) * 4 + o_norm 256 + MLP 3 * 2048 * 4096 + norms 2 * 2048
# = 50,409,752; * 24 + 2048 = 1,209,836,096.
expect configs/mamba3-paper/1.5b/gdn.json 1472504384 1209836096
# Mamba-2 + MLP 4096: the 1.3B Mamba2 mixer block (25,849,280 with its norm) + MLP 3 * 2048 * 4096 + MLP norm 2048
# = 51,017,152; * 24 + 2048 = 1,224,413,696.
expect configs/mamba3-paper/1.5b/mamba2.json 1487081984 1224413696
# Every paper config is checked above (a config added without its count fails here).
for f in $(find configs/mdn-paper configs/mamba3-paper -name '*.json' | sort); do
  [[ " ${checked[*]} " == *" $f "* ]] || { echo "FAIL $f: no parameter-count check in $0"; exit 1; }
done
echo "ok: all ${#checked[@]} paper configs checked"
# The FLOPs line says which FLOPs it leaves out: the recurrent cores' (none for a Transformer).
"$llmtrain" info --config configs/tiny/gdn.json | grep -q "the gdn cores' own FLOPs not counted" ||
  { echo "FAIL: no FLOPs caveat for gdn"; exit 1; }
! "$llmtrain" info --config configs/tiny/transformer.json | grep -q "not counted" ||
  { echo "FAIL: a FLOPs caveat for the transformer"; exit 1; }
