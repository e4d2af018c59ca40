#!/usr/bin/env bash
# scripts/ncu_line_stalls.py: a hand-written Nsight Compute source-page CSV (4 SASS instructions, 100 samples) and
# a hand-written `nvdisasm -gi` text of two kernels (the CSV holds a second launch, not counted) give the per-line shares counted by hand (an inlined line's
# samples go to the callee's line as inner and to the kernel body's line as outer), a mismatch count when the CSV
# is not the disassembled code, and a clear error when the kernel name matches no kernel.
# Usage: ncu_line_stalls.sh path/to/llmtrain   (the binary is not used; run from the repository root)
set -euo pipefail
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/k.dis" <<'DIS'
_Z2k1v:
	//## File "/x/a.cu", line 3
        /*0000*/                   EXIT ;
.text._Z2k2v:
_Z2k2v:
	//## File "/x/a.cu", line 10
        /*0000*/                   LDC R1, c[0x0][0x28] ;
	//## File "/x/b.cuh", line 5 inlined at "/x/a.cu", line 12
	//## File "/x/a.cu", line 12
        /*0010*/                   LDG.E R2, desc[UR4][R2.64] ;
        /*0020*/              @!P0 IMAD.U32 R3, R2, 0x10000, RZ ;
	//## File "/x/a.cu", line 13
        /*0030*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
DIS
csv() {  # $1: the opcode of the third instruction
  cat <<CSV
"Kernel Name","k2()"
"Address","Source","Warp Stall Sampling (All Samples)","stall_barrier","stall_long_sb","stall_selected","stall_long_sb (Not Issued)"
"0x7f0000000000","      LDC R1, c[0x0][0x28]","5","0","0","5","0"
"0x7f0000000010","      LDG.E R2, desc[UR4][R2.64]","10","0","0","10","0"
"0x7f0000000020","      @!P0  $1 R3, R2, 0x10000, RZ","60","0","60","0","60"
"0x7f0000000030","      BAR.SYNC.DEFER_BLOCKING 0x0","25","25","0","0","25"
"Kernel Name","k2()"
"Address","Source","Warp Stall Sampling (All Samples)","stall_barrier","stall_long_sb","stall_selected","stall_long_sb (Not Issued)"
"0x7f0000001000","      LDC R1, c[0x0][0x28]","900","0","0","900","0"
CSV
}
csv IMAD.U32 > "$tmp/k.csv"
scripts/ncu_line_stalls.py "$tmp/k.csv" "$tmp/k.dis" _Z2k2v > "$tmp/out.txt"
expect() { grep -qF -- "$1" "$tmp/out.txt" || { echo "FAIL: no line '$1' in:"; cat "$tmp/out.txt"; exit 1; }; }
expect "4 instructions (4 in the cubin's kernel), 0 opcode mismatches, 100 samples"
expect " 70.0%     2 instr a.cu:12    long_sb:86% selected:14%"
expect " 25.0%     1 instr a.cu:13    barrier:100%"
expect "  5.0%     1 instr a.cu:10    selected:100%"
expect " 70.0%     2 instr b.cuh:5     long_sb:86% selected:14%"
[ "$(grep -c "a.cu:12" "$tmp/out.txt")" = 1 ] || { echo "FAIL: a.cu:12 should be an outer line only"; exit 1; }
csv FMUL > "$tmp/bad.csv"
scripts/ncu_line_stalls.py "$tmp/bad.csv" "$tmp/k.dis" _Z2k2v > "$tmp/out.txt"
expect "1 opcode mismatches"
if scripts/ncu_line_stalls.py "$tmp/k.csv" "$tmp/k.dis" nosuchkernel > "$tmp/out.txt" 2>&1; then
  echo "FAIL: an unknown kernel was accepted"; exit 1
fi
expect "0 kernels in the cubin match 'nosuchkernel'"
echo "ncu_line_stalls: ok"
