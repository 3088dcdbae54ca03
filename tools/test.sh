#!/usr/bin/env bash
# Sets up, builds and runs every test (the README's test command). Ends with the CTest summary.
# Before CTest it builds the sanitizer and fuzz dirs (tools/sanitize.sh build: build-fuzz/ with
# ASan+UBSan+libFuzzer, build-tsan/ with TSan); their runs are CTest tests labelled "sanitize"
# (skip the builds with KVCTL_SKIP_SANITIZE=1: those tests are then reported as skipped), and
# the clang -Wthread-safety build (tools/thread_safety.sh, build-tsa/; compile only, a failure
# stops here; skip it with KVCTL_SKIP_THREAD_SAFETY=1).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
if [ "${KVCTL_SKIP_THREAD_SAFETY:-0}" != "1" ]; then
  bash tools/thread_safety.sh
fi
if [ "${KVCTL_SKIP_SANITIZE:-0}" != "1" ]; then
  bash tools/sanitize.sh build
fi
cd build
ctest --output-on-failure -j "${KVCTL_JOBS:-$(nproc)}" --timeout 1500
