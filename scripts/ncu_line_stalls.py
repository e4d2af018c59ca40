#!/usr/bin/env python3
"""Warp-stall samples of one CUDA kernel per source line, from an Nsight Compute report.

Usage: scripts/ncu_line_stalls.py SASS_CSV CUBIN KERNEL [--top N] [--src DIR]

SASS_CSV  the kernel's source page exported by Nsight Compute, one row per SASS instruction (where the report
          holds several launches, the first one's rows are used):
          ncu --section SourceCounters --section WarpStateStats -k regex:KERNEL -c 1 -o rep ./bench ...
          ncu -i rep.ncu-rep --page source --csv --print-source sass > KERNEL.sass.csv
CUBIN     the cubin of the kernel's .cu file, built with the same nvcc and flags as the profiled binary plus
          -lineinfo (the project's CUDA targets build with -lineinfo), e.g.
          nvcc -std=c++17 -O3 -DNDEBUG -arch=sm_90 -lineinfo --expt-relaxed-constexpr -Isrc -DLLMT_HAVE_CUDA=1
               -cubin -o x.cubin src/kernels/cuda/x.cu
          (or a text file holding `nvdisasm -gi -c` of it).
KERNEL    a substring of the kernel's mangled name that picks one instantiation, e.g.
          ssd_bwd_chunk_kernelI13__nv_bfloat16 or mdn_bchunk_kernelINS0_4tile3Mma.

The CSV's instructions are matched to the disassembly by offset from the kernel's first instruction (every
opcode is checked; a count of mismatches is printed, and a non-zero count means the cubin is not the profiled
code). Each instruction's samples go to two lines: its innermost source line, and its outer line (the line in
the kernel's own body that the inlined call chain starts from). Printed per line: the share of all samples,
the instruction count, the top three stall reasons (long_sb: waiting on a global/local load; barrier:
__syncthreads; no_inst: instruction cache; short_sb: shared memory / MUFU; wait: fixed latency) and the
source text (read from --src, default the directory of each file as the disassembly names it).
nvdisasm is taken from $CUDA_HOME/bin where it is there, else from PATH.
"""
import argparse
import collections
import csv
import os
import re
import shutil
import subprocess
import sys

LOC = re.compile(r'//## File "([^"]+)", line (\d+)')
INSN = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def nvdisasm():
    home = os.path.join(os.environ.get("CUDA_HOME", ""), "bin", "nvdisasm")
    tool = home if os.path.exists(home) else shutil.which("nvdisasm")
    if not tool:
        sys.exit("ncu_line_stalls: nvdisasm not found (set CUDA_HOME or put it on PATH)")
    return tool


def disassembly(path):
    """`nvdisasm -gi -c` text of a cubin, or the file's text if it is already a disassembly."""
    if path.endswith(".cubin"):
        out = subprocess.run([nvdisasm(), "-gi", "-c", path], capture_output=True, text=True, check=True)
        return out.stdout
    with open(path) as f:
        return f.read()


def kernel_lines(dis, kernel):
    """{offset: (inner (file, line), outer (file, line), instruction text)} of the kernel whose label contains `kernel`."""
    lines = dis.split("\n")
    labels = [i for i, l in enumerate(lines) if l.startswith("_Z") and l.endswith(":") and kernel in l]
    if len(labels) != 1:
        sys.exit(f"ncu_line_stalls: {len(labels)} kernels in the cubin match '{kernel}' (need exactly one)")
    out, chain, in_chain = {}, [], False
    for l in lines[labels[0] + 1:]:
        if l.startswith(".text.") or l.lstrip().startswith(".section") or (l.startswith("_Z") and l.endswith(":")):
            break
        m = LOC.search(l)
        if m:
            if not in_chain:
                chain = []
            in_chain = True
            chain.append((m.group(1), int(m.group(2))))
            continue
        m = INSN.match(l)
        if m:
            in_chain = False
            unknown = ("?", 0)
            out[int(m.group(1), 16)] = (chain[0] if chain else unknown, chain[-1] if chain else unknown, m.group(2))
    return out


def opcode(text):
    words = text.split()
    return (words[1] if words[0].startswith("@") else words[0]).split(".")[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sass_csv")
    ap.add_argument("cubin")
    ap.add_argument("kernel")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--src", default=None, help="directory to read the source files from")
    args = ap.parse_args()
    code = kernel_lines(disassembly(args.cubin), args.kernel)
    with open(args.sass_csv) as f:
        rows = list(csv.reader(f))
    head = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if head is None:
        sys.exit(f"ncu_line_stalls: {args.sass_csv} has no 'Address' header row (not a --page source CSV)")
    hdr = rows[head]
    col = {h: i for i, h in enumerate(hdr)}
    data = []
    for r in rows[head + 1:]:  # the first profiled launch: its rows end where the next "Kernel Name" row starts
        if r and r[0] == "Kernel Name":
            break
        if len(r) == len(hdr):
            data.append(r)
    samples = col["Warp Stall Sampling (All Samples)"]
    reasons = [h for h in hdr if h.startswith("stall_") and "(Not Issued)" not in h]
    base = int(data[0][0], 16)
    total = sum(int(r[samples]) for r in data) or 1
    per = {"outer": collections.defaultdict(lambda: [0, 0, collections.Counter()]),
           "inner": collections.defaultdict(lambda: [0, 0, collections.Counter()])}
    mismatches = 0
    for r in data:
        off = int(r[0], 16) - base
        if off not in code or opcode(r[1]) != opcode(code[off][2]):
            mismatches += 1
            if off not in code:
                continue
        inner, outer, _ = code[off]
        for key, where in (("inner", inner), ("outer", outer)):
            e = per[key][where]
            e[0] += int(r[samples])
            e[1] += 1
            for h in reasons:
                e[2][h[len("stall_"):]] += int(r[col[h]])
    print(f"{args.sass_csv}: {len(data)} instructions ({len(code)} in the cubin's kernel), "
          f"{mismatches} opcode mismatches, {total} samples")
    cache = {}

    def source(path, line):
        p = os.path.join(args.src, os.path.basename(path)) if args.src else path
        if p not in cache:
            try:
                with open(p) as f:
                    cache[p] = f.read().split("\n")
            except OSError:
                cache[p] = []
        text = cache[p]
        return text[line - 1].strip()[:72] if 0 < line <= len(text) else ""

    for key in ("outer", "inner"):
        print(f"-- by {key} line")
        for (path, line), (s, n, why) in sorted(per[key].items(), key=lambda kv: -kv[1][0])[:args.top]:
            top3 = " ".join(f"{k}:{100 * v / max(s, 1):.0f}%" for k, v in why.most_common(3))
            print(f"{100 * s / total:5.1f}% {n:5d} instr {os.path.basename(path)}:{line:<5d} {top3:34s} | "
                  f"{source(path, line)}")


if __name__ == "__main__":
    main()
