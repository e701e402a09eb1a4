#!/usr/bin/env bash
# The main job on a fresh machine: install dependencies, build, and run configs/quickstart.ini.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
./build/ctrl --plugin-dir build/plugins plugins
./build/ctrl --plugin-dir build/plugins config check configs/quickstart.ini
