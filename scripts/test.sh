#!/usr/bin/env bash
# Install what is missing, build, and run the whole CTest suite (2 jobs).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
llmt_install_missing
llmt_install_node_tools
llmt_build
ctest --test-dir build --output-on-failure -j 2
