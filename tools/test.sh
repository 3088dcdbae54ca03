#!/usr/bin/env bash
# Sets up, builds and runs every test (the README's test command). Ends with the CTest summary.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cd build
ctest --output-on-failure -j "${KVCTL_JOBS:-$(nproc)}" --timeout 1500
