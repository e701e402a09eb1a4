#!/usr/bin/env bash
# The whole test suite on a fresh machine: install dependencies, build, run every test.
# CUDA tests skip themselves (saying why) where no GPU exists.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh "$@"
ctest --test-dir build --output-on-failure -j "$(nproc)"
