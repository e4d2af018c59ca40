#!/usr/bin/env bash
# Data-parallel training on one machine: one llmtrain process per GPU (or per CPU rank on the
# cpu backend), started by Open MPI's mpirun (docs/DISTRIBUTED.md).
# Usage: scripts/launch/mpirun.sh NPROC CONFIG [llmtrain train options...]
#   e.g. scripts/launch/mpirun.sh 8 configs/mdn-paper/1.3b/mdn.json --out runs/mdn-1.3b
# Environment: LLMTRAIN (default build/llmtrain), MPIRUN_ARGS (extra mpirun options).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 NPROC CONFIG [llmtrain train options...]" >&2
  exit 2
fi
nproc=$1 config=$2
shift 2
llmtrain=${LLMTRAIN:-build/llmtrain}
[ -x "$llmtrain" ] || { echo "error: $llmtrain not found or not executable (build first, or set LLMTRAIN)" >&2; exit 2; }
# NVLink SHARP (multicast) off: it needs the fabric manager's multicast support, which shared or
# virtualised machines often lack (docs/DISTRIBUTED.md).
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
# --bind-to none: each rank's OpenBLAS / CUDA threads are not pinned to one core.
# shellcheck disable=SC2086
exec mpirun -np "$nproc" --bind-to none -x NCCL_NVLS_ENABLE ${MPIRUN_ARGS:-} \
  "$llmtrain" train --config "$config" "$@"
