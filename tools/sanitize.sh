#!/usr/bin/env bash
# Builds kernels_test, controller_test and ipc_test with ASan + UBSan at -O2 (RelWithDebInfo) in
# build-asan and runs them. Not part of CI (a from-scratch sanitizer build takes ~12 minutes on 2
# cores); run it after changing SIMD kernels or the pool: a QuaRot kernel that passed at -O2 and
# -O3 once failed here (docs/attention.md, "Weaknesses"). Needs what tools/setup.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${KVCTL_SANITIZE_BUILD:-build-asan}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVCTL_CUDA=OFF -DKVCTL_TORCH=OFF \
  "-DCMAKE_CXX_FLAGS=-fsanitize=address,undefined -fno-sanitize-recover=undefined"
cmake --build "$BUILD" -j "${KVCTL_JOBS:-$(nproc)}" --target kernels_test controller_test ipc_test
for t in kernels_test controller_test ipc_test; do
  echo "== $t"
  "$BUILD/tests/$t"
done
