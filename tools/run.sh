#!/usr/bin/env bash
# Sets up, builds and runs the main job on the embedded default (the README's first command).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
./build/bin/kvbench quant "$@"
