#!/usr/bin/env bash
# Builds the request-path fuzzer (tests/fuzz/request_path_fuzz.cc: bytes -> DecodeRequest ->
# Dispatch -> a real Controller over a real shm pool -> reply encoders) with clang 14, libFuzzer,
# ASan and UBSan in build-fuzz/, replays tests/fuzz/regressions/, then fuzzes for SECONDS (default
# 60) starting from the generated seed corpus. Prints executions, exec/s, coverage (cov, ft) and
# crashes; exits non-zero on any crash, timeout, leak or sanitizer report. Crashing inputs are kept
# in build-fuzz/fuzz-artifacts/; add them to tests/fuzz/regressions/ once fixed.
#
#   tools/fuzz.sh [SECONDS]
#   tools/fuzz.sh --build-only        configure and build only (tools/sanitize.sh shares the dir)
#   tools/fuzz.sh --no-build SECONDS  run an existing build
#   tools/fuzz.sh [--no-build] --image SECONDS   fuzz sequence images instead (tests/fuzz/
#                                     image_fuzz.cc: ReadImageInfo + ImportImage) from the seeds in
#                                     tests/fuzz/image_seeds/, artifacts in build-fuzz/image-*
#   KVCTL_FUZZ_CORPUS=DIR   keep the grown corpus in DIR across runs (default: a fresh one)
#   KVCTL_FUZZ_ARGS="..."   extra libFuzzer flags (e.g. -use_value_profile=1)
#   KVCTL_FUZZ_BUILD=DIR    build dir (default build-fuzz); KVCTL_JOBS: build jobs
# Needs clang-14 and libclang-rt-14-dev (tools/setup.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MODE=run       # run, or build-only
BUILD_FIRST=1  # --no-build: use what build-fuzz/ holds
TARGET=request # --image: the sequence-image fuzzer
while [ $# -gt 0 ]; do
  case $1 in
    --build-only) MODE=build-only; shift ;;
    --no-build) BUILD_FIRST=0; shift ;;
    --image) TARGET=image; shift ;;
    *) break ;;
  esac
done
BUDGET=${1:-60}
BUILD=${KVCTL_FUZZ_BUILD:-build-fuzz}
JOBS=${KVCTL_JOBS:-$(nproc)}

SANITIZE_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
SANITIZE_FLAGS+=" -fno-omit-frame-pointer"
# -O1 keeps the instrumented build quick, and the test files (tools/sanitize.sh builds ASan tests
# here) compile at -O0 (KVCTL_TEST_OPT_LEVEL, cmake/KvctlHelpers.cmake); the kernels' SIMD files
# go to g++ (cxx_launcher.sh).
build() {
  local start
  start=$(date +%s)
  cmake -S . -B "$BUILD" -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
    -DCMAKE_CXX_COMPILER_LAUNCHER="$ROOT/tests/fuzz/cxx_launcher.sh" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" \
    -DKVCTL_CUDA=OFF -DKVCTL_TORCH=OFF -DKVCTL_FUZZ=ON -DKVCTL_WERROR=OFF \
    -DKVCTL_TEST_OPT_LEVEL=-O0 "-DCMAKE_CXX_FLAGS=$SANITIZE_FLAGS" >/dev/null
  # Build output (clang warnings on code written for g++) goes to a file, shown on failure.
  if ! cmake --build "$BUILD" -j "$JOBS" --target kvctl_request_fuzz kvctl_fuzz_seeds \
    kvctl_image_fuzz \
    >"$BUILD/build.log" 2>&1; then
    tail -50 "$BUILD/build.log"
    exit 1
  fi
  echo "fuzz: built in $(($(date +%s) - start)) s"
}

if [ "$BUILD_FIRST" = 1 ]; then build; fi
if [ "$MODE" = build-only ]; then exit 0; fi

if [ "$TARGET" = image ]; then
  FUZZER=$BUILD/bin/kvctl_image_fuzz
  SEEDS=tests/fuzz/image_seeds
  CORPUS=${KVCTL_FUZZ_CORPUS:-$BUILD/image-corpus}
  ARTIFACTS=$BUILD/image-artifacts
  LOG=$BUILD/image-fuzz.log
  MAX_LEN=131072
  rm -rf "$ARTIFACTS"
else
  FUZZER=$BUILD/bin/kvctl_request_fuzz
  SEEDS=$BUILD/fuzz-seeds
  CORPUS=${KVCTL_FUZZ_CORPUS:-$BUILD/fuzz-corpus}
  ARTIFACTS=$BUILD/fuzz-artifacts
  LOG=$BUILD/fuzz.log
  MAX_LEN=16384
  rm -rf "$SEEDS" "$ARTIFACTS"
fi
[ -z "${KVCTL_FUZZ_CORPUS:-}" ] && rm -rf "$CORPUS"
mkdir -p "$CORPUS" "$ARTIFACTS"
[ "$TARGET" = image ] || "$BUILD/bin/kvctl_fuzz_seeds" "$SEEDS"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# Runs the fuzzer with its output in $LOG; removes the shm pools a crashed run left behind.
run_fuzzer() {
  local rc=0
  "$FUZZER" "$@" >"$LOG" 2>&1 &
  local pid=$!
  wait "$pid" || rc=$?
  rm -f /dev/shm/kvctl-fuzz-"$pid"-*
  return "$rc"
}

report_failure() {
  echo "fuzz: FAILED (exit $1); the end of $LOG:"
  grep -v -E '^#[0-9]+\s+(NEW|REDUCE|pulse|INITED)' "$LOG" | tail -60
  echo "fuzz: crashing inputs: $(ls "$ARTIFACTS" 2>/dev/null | tr '\n' ' ')"
}

regressions=(tests/fuzz/regressions/*.in)
if [ "$TARGET" != image ] && [ -e "${regressions[0]}" ]; then
  rc=0
  run_fuzzer -runs=1 "${regressions[@]}" || rc=$?
  if [ "$rc" -ne 0 ]; then report_failure "$rc"; exit 1; fi
  echo "fuzz: ${#regressions[@]} regression inputs replayed, no crash"
fi

rc=0
# shellcheck disable=SC2086  # KVCTL_FUZZ_ARGS is a list of flags.
run_fuzzer -max_total_time="$BUDGET" -print_final_stats=1 -max_len=$MAX_LEN -timeout=60 \
  -artifact_prefix="$ARTIFACTS/" ${KVCTL_FUZZ_ARGS:-} "$CORPUS" "$SEEDS" || rc=$?

final_stat() { grep -m1 "^stat::$1:" "$LOG" | awk '{print $2}'; }
final=$(grep -E '^#[0-9]+\s' "$LOG" | grep 'cov:' | tail -1)
cov=$(sed -n 's/.*cov: \([0-9]*\).*/\1/p' <<<"$final")
ft=$(sed -n 's/.*ft: \([0-9]*\).*/\1/p' <<<"$final")
crashes=$(find "$ARTIFACTS" -type f | wc -l)
reports=$(grep -c -E 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:' "$LOG" ||
  true)
echo "fuzz: $(final_stat number_of_executed_units) executions in ${BUDGET} s" \
  "($(final_stat average_exec_per_sec) exec/s), cov $cov, ft $ft," \
  "corpus $(find "$CORPUS" -type f | wc -l) new inputs, peak RSS $(final_stat peak_rss_mb) MB;" \
  "crashes $crashes, sanitizer reports $reports"
if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ] || [ "$reports" -ne 0 ]; then
  report_failure "$rc"
  exit 1
fi
echo "fuzz: OK (full log: $LOG)"
