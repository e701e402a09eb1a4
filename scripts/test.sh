#!/usr/bin/env bash
# The whole test suite on a fresh machine: install dependencies, build, run every test.
# CUDA tests skip themselves (saying why) where no GPU exists.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh "$@"
# Tests run side by side, each with OpenMP threads: waiting threads must yield the core rather than
# spin (with spinning, one test's barrier can wait out whole time slices of another's threads: a
# 2-second test took over 120 s on the 2-core machine).
export OMP_WAIT_POLICY=PASSIVE
ctest --test-dir build --output-on-failure -j "$(nproc)"
