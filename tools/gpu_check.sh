#!/usr/bin/env bash
# tools/gpu_check.sh: the whole GPU check in one run, sized for 5 minutes on an H100/H200 with 16
# cores (docs/gpu.md). Steps, each under its own timeout and all under one overall budget:
#   1. configure a CUDA build (KVCTL_CUDA=ON, only the GPU's own architecture) in $BUILD, or, if
#      the full project does not configure, the minimal tools/gpu_check project in $BUILD-min;
#   2. build only kernels_cuda_test, kernels_warp_emu_test and kvbench_cuda;
#   3. run the [cuda] tests (GPU vs the CPU reference) and the warp emulation test;
#   4. kvbench_cuda: copy bandwidth, quantize throughput, fused attention at 8K/32K/128K;
#   5. torch SDPA bf16 baseline at the same shapes (skipped with a reason if torch has no CUDA);
#   6. with the time left: build the torch extension and run its CUDA-vs-CPU tests (pytest -k cuda),
#      then the device pool: sequence_test "CUDA pool*" and python/tests/test_cuda_pool.py;
#   7. merge everything into one JSON: $OUT/gpu_check.json (or results/gpu_check.json).
# A failing step is recorded and the later steps that do not depend on it still run; the JSON is
# always written. Exit status: 0 when the tests passed and the benchmark ran, 1 otherwise (targets
# missed is not a failure: the JSON says which were met).
#
#   tools/gpu_check.sh                      # everything
#   KVCTL_GPU_CHECK_QUICK=1 tools/gpu_check.sh   # smoke run: 8K only, fewer methods
# Environment: OUT (result folder), KVCTL_GPU_BUILD (build dir, default build-gpu), KVCTL_JOBS
# (default 16), KVCTL_CUDA_ARCH (default: from nvidia-smi, else "80;90"), KVCTL_GPU_CHECK_BUDGET
# (seconds, default 285), KVCTL_GPU_CHECK_MINIMAL=1 (skip the full project: build with
# tools/gpu_check/CMakeLists.txt, which needs only nvcc, Catch2 v2 and threads).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

BUILD=${KVCTL_GPU_BUILD:-build-gpu}
RESULTS=${OUT:-$ROOT/results}
JOBS=${KVCTL_JOBS:-16}
BUDGET=${KVCTL_GPU_CHECK_BUDGET:-285}
QUICK=${KVCTL_GPU_CHECK_QUICK:-0}
MINIMAL=${KVCTL_GPU_CHECK_MINIMAL:-0}
mkdir -p "$RESULTS"
LOG=$RESULTS/gpu_check.log
STEPS=$RESULTS/gpu_check_steps.tsv
JSON=$RESULTS/gpu_check.json
: >"$LOG"
: >"$STEPS"
rm -f "$RESULTS/kvbench_cuda.json" "$RESULTS/sdpa_bf16.json" "$JSON"  # No stale numbers.
START=$(date +%s)

say() { echo "[gpu_check +$(($(date +%s) - START))s] $*" | tee -a "$LOG" >&2; }
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >>"$STEPS"; }

# run NAME TIMEOUT CMD...: runs CMD under min(TIMEOUT, what is left of the budget minus 15 s for
# the merge), output to the terminal and the log; records rc (124: timed out or no time left).
# Never fails the script.
run() {
  local name=$1 limit=$2
  shift 2
  local left=$((BUDGET - ($(date +%s) - START) - 15))
  if ((left < limit)); then limit=$left; fi
  if ((limit < 5)); then
    say "$name: skipped, out of time budget (${BUDGET}s)"
    record "$name" 124 0 "skipped: out of time"
    return 0
  fi
  say "$name (timeout ${limit}s): $*"
  local t0 rc
  t0=$(date +%s)
  set +e
  timeout --kill-after=5 "$limit" "$@" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  set -e
  record "$name" "$rc" "$(($(date +%s) - t0))"
  say "$name: rc=$rc"
  return 0
}
step_rc() { awk -F'\t' -v n="$1" '$1 == n { rc = $2 } END { print (rc == "" ? -1 : rc) }' "$STEPS"; }

# --- preflight -----------------------------------------------------------------------------
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
if ! command -v nvcc >/dev/null 2>&1; then
  say "no nvcc on PATH (nor /usr/local/cuda/bin): cannot build the CUDA kernels"
  record preflight 1 0 "no nvcc"
fi
ARCH=${KVCTL_CUDA_ARCH:-}
if [ -z "$ARCH" ] && command -v nvidia-smi >/dev/null 2>&1; then
  ARCH=$(timeout 20 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
    head -n1 | tr -d ' .' || true)
  timeout 20 nvidia-smi -L 2>&1 | tee -a "$LOG" || true
fi
ARCH=${ARCH:-80;90}
say "CUDA architectures: $ARCH; build dir: $BUILD; results: $RESULTS"

# --- build -----------------------------------------------------------------------------------
# The full project first; if it does not configure (a GPU box without the daemon's packages),
# tools/gpu_check/CMakeLists.txt builds the same three targets from the same folder CMake files.
CONFIGURED=""
if [ "$MINIMAL" != 1 ]; then
  run configure 90 cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKVCTL_CUDA=ON \
    -DKVCTL_TORCH=AUTO "-DCMAKE_CUDA_ARCHITECTURES=$ARCH"
  if [ "$(step_rc configure)" = 0 ]; then
    CONFIGURED=full
  else
    say "the full project did not configure (see $LOG); trying tools/gpu_check (kernels only)"
  fi
fi
if [ -z "$CONFIGURED" ]; then
  BUILD=$BUILD-min
  run configure_minimal 90 cmake -S tools/gpu_check -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DKVCTL_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$ARCH"
  [ "$(step_rc configure_minimal)" = 0 ] && CONFIGURED=minimal
fi
if [ -n "$CONFIGURED" ]; then
  run build 200 cmake --build "$BUILD" -j "$JOBS" --target kernels_cuda_test kernels_warp_emu_test \
    kvbench_cuda
fi

# --- tests and benchmarks ------------------------------------------------------------------
if [ "$(step_rc build)" = 0 ]; then
  # KVCTL_REQUIRE_CUDA=1: a [cuda] case without a device fails here instead of skipping.
  run test_cuda 90 env KVCTL_REQUIRE_CUDA=1 "$BUILD/tests/kernels_cuda_test"
  run test_warp_emulation 30 "$BUILD/tests/kernels_warp_emu_test"
  BENCH_ARGS=(--json "$RESULTS/kvbench_cuda.json")
  [ "$QUICK" = 1 ] && BENCH_ARGS+=(--quick)
  run kvbench_cuda 120 "$BUILD/bin/kvbench_cuda" "${BENCH_ARGS[@]}"
else
  say "build failed or did not run: no tests, no benchmark (see $LOG)"
fi
SDPA_ARGS=(--json "$RESULTS/sdpa_bf16.json")
[ "$QUICK" = 1 ] && SDPA_ARGS+=(--quick)
run sdpa_bf16 90 python3 tools/kvbench_cuda_report.py sdpa "${SDPA_ARGS[@]}"

# --- torch.ops.kvctl on CUDA tensors (last, with whatever budget is left; needs the pip torch) --
if [ "$CONFIGURED" = full ] && [ "$(step_rc build)" = 0 ]; then
  run build_torch 120 cmake --build "$BUILD" -j "$JOBS" --target kvctl_torch
  if [ "$(step_rc build_torch)" = 0 ]; then
    run test_torch_cuda 60 env KVCTL_TORCH_LIB="$BUILD/lib/libkvctl_torch.so" python3 -m pytest \
      -q -p no:cacheprovider python/tests/test_torch_ops.py -k cuda
  fi
  # The device pool (pool.backend = "cuda") end to end: the arena's round trip, then a real daemon
  # whose pool engines open by CUDA IPC and attend on the device.
  run build_pool 120 cmake --build "$BUILD" -j "$JOBS" --target kvctl sequence_test
  if [ "$(step_rc build_pool)" = 0 ]; then
    run test_cuda_pool_arena 30 "$BUILD/tests/sequence_test" "CUDA pool*"
    if [ "$(step_rc build_torch)" = 0 ]; then
      run test_cuda_pool_daemon 60 env KVCTL_BIN="$BUILD/bin/kvctl" \
        KVCTL_TORCH_LIB="$BUILD/lib/libkvctl_torch.so" python3 -m pytest -q -p no:cacheprovider \
        python/tests/test_cuda_pool.py
    fi
  fi
fi

# --- one JSON ----------------------------------------------------------------------------------
python3 tools/kvbench_cuda_report.py merge --steps "$STEPS" --bench "$RESULTS/kvbench_cuda.json" \
  --sdpa "$RESULTS/sdpa_bf16.json" --out "$JSON"
say "wrote $JSON ($(($(date +%s) - START))s in total)"
python3 - "$JSON" <<'EOF' >&2 || true
import json, sys
j = json.load(open(sys.argv[1]))
print(json.dumps(j.get("verdict"), indent=1))
EOF
if [ "$(step_rc test_cuda)" = 0 ] && [ "$(step_rc kvbench_cuda)" = 0 ]; then
  exit 0
fi
say "FAILED: [cuda] tests rc=$(step_rc test_cuda), kvbench_cuda rc=$(step_rc kvbench_cuda)"
exit 1
