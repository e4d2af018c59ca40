# Shared by quickstart.sh and test.sh: install the Debian packages that are missing, then
# configure and build into build/ (Release). Sourced, not run.

# Debian packages the build needs (listed in README.md).
LLMT_PACKAGES=(cmake g++ ninja-build git nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev catch2
               libopenblas-dev libpcre2-dev libzstd-dev libsentencepiece-dev libopenmpi-dev openmpi-bin jq
               python3-matplotlib)

llmt_install_missing() {
  local missing=()
  for p in "${LLMT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing missing Debian packages: ${missing[*]}"
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "error: need root or sudo to install: ${missing[*]}" >&2; return 1; }
    sudo=(sudo)
  fi
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# llmt_build [TARGET...]: configure build/ and build the targets (default: everything, tests included).
# LLMT_CUDA=OFF skips the CUDA backend even where nvcc is installed (default AUTO: built when found).
llmt_build() {
  local jobs
  jobs=$(nproc)
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLMT_CUDA="${LLMT_CUDA:-AUTO}"
  cmake --build build -j "$jobs" ${1:+--target "$@"}
}

# The Node helper that converts parquet for prepare-data (tools/parquet2jsonl.mjs): its npm
# packages, pinned by tools/package-lock.json. Skipped (with a note) when Node.js is absent:
# everything else works without it, and parquet inputs then fail with an install hint.
llmt_install_node_tools() {
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "note: node/npm not found: .parquet inputs of prepare-data need them (apt-get install nodejs npm)"
    return 0
  fi
  if [ ! -d tools/node_modules/hyparquet ] || [ tools/package-lock.json -nt tools/node_modules/.package-lock.json ]; then
    echo "installing tools/ npm packages (npm ci)"
    (cd tools && npm ci --no-audit --no-fund --loglevel=error) ||
      echo "warning: npm ci in tools/ failed: .parquet inputs (and their tests) are unavailable"
  fi
}
