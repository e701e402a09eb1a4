#!/usr/bin/env bash
# Installs every Debian package ctrl needs to build and test. Idempotent: packages already
# present are left alone, and apt is only asked when something is missing.
# The CUDA toolkit (nvcc on PATH, CUDA_HOME) is the one thing assumed, and it is optional.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config
  libiniparser-dev   # INI parsing
  libltdl-dev        # plugin loading
  libopenblas-openmp-dev  # CPU GEMM, on the same OpenMP threads as ctrl's kernels
  libopenmpi-dev openmpi-bin  # distributed bootstrap
  libpcre2-dev       # tokenizer pre-tokenizer regex
  libcjson-dev       # JSON (config.json, tokenizer.json, safetensors headers, datasets)
  zlib1g-dev libzstd-dev  # parquet datasets' GZIP and ZSTD pages
  libmicrohttpd-dev  # ctrl serve
  gnuplot-nox        # metric plots
  curl               # the ctrl serve tests talk HTTP with it
  file
  clang libclang-rt-dev libomp-dev  # the sanitizer + libFuzzer build (docs/fuzzing.md)
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
