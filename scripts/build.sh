#!/usr/bin/env bash
# Configures and builds ctrl into build/ (Release with debug info). Extra arguments go to cmake's
# configure step, e.g. scripts/build.sh -DCTRL_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
GEN=()
if command -v ninja >/dev/null 2>&1; then GEN=(-G Ninja); fi
if [ -f build/CMakeCache.txt ]; then
  cmake -S . -B build "$@" >/dev/null
else
  cmake -S . -B build "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
fi
cmake --build build -j "$(nproc)"
