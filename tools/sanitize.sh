#!/usr/bin/env bash
# The sanitizer checks, each in its own build dir with only the targets it needs:
#   asan  ASan + UBSan over kernels_test, the controller's pool_test, config_test and service_test,
#         and ipc_test. They share build-fuzz/ with
#         the request-path fuzzer (tools/fuzz.sh: clang 14 at -O1, every library instrumented once
#         for both; the kernels' SIMD files are compiled by g++ with the same sanitizers).
#   tsan  TSan (g++ -O1) over the concurrency tests in build-tsan/: the daemon (integration_test
#         runs a TSan kvctl: 8 clients at once, leases, SIGHUP, hostile clients), ipc_test's server
#         tests (I/O thread and responders on other threads; from ipc_server_test, the two of
#         ipc_test's files they are in), pool_test, service_test's hostile-client and [threads]
#         tests (the dense FETCH helper thread; from service_threads_test, its three files) and
#         sequence_test's pool-pressure tests (these from sequence_pressure_test, the two of
#         sequence_test's files they are in, in both builds). The TSan build compiles only these
#         subsets.
# Sanitizer reports of child processes (the daemon) go to files under <build>/sanitizer-logs/;
# any file there fails the check.
#
#   tools/sanitize.sh                 build everything, run every check (asan, tsan, fuzz 60 s)
#   tools/sanitize.sh build           build both dirs (tools/test.sh does this before ctest)
#   tools/sanitize.sh run CHECK       run one check: asan-kernels, asan-controller, asan-ipc,
#                                     tsan-integration, tsan-ipc, tsan-controller, fuzz (60 s,
#                                     KVCTL_CI_FUZZ_SECONDS). Exit 77 (skipped) when its build is
#                                     missing. tests/fuzz/CMakeLists.txt registers each as a ctest.
# Needs what tools/setup.sh installs (clang-14, libclang-rt-14-dev among them).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ASAN_BUILD=${KVCTL_FUZZ_BUILD:-build-fuzz}
TSAN_BUILD=${KVCTL_TSAN_BUILD:-build-tsan}
JOBS=${KVCTL_JOBS:-$(nproc)}
# It measures heap growth with mallinfo2(), which a sanitizer's allocator does not report.
NOT_UNDER_SANITIZERS='~"Hostile: the OPEN estimate covers what an OPEN really allocates"'
# The controller under coverage + ASan + UBSan at -O1 runs its pool, config and service (hostile
# clients, checksums, staging) tests but not sequence_test: its eviction and pressure cases decode
# long sequences through the scorers and ran for minutes of CPU each without finishing. The fuzzer drives those paths under
# ASan instead (its quantizer models and streaming, h2o, snapkv, rkv and requantize variants).
TOO_SLOW_INSTRUMENTED='~[evict]'
CHECKS=(asan-kernels asan-controller asan-ipc tsan-integration tsan-ipc tsan-controller fuzz
  fuzz-image)

build_asan() {
  KVCTL_FUZZ_BUILD=$ASAN_BUILD bash tools/fuzz.sh --build-only
  build_targets "$ASAN_BUILD" kernels_test pool_test config_test service_test \
    sequence_pressure_test ipc_test
}

# Build output goes to <build>/build.log, shown on failure.
build_targets() {
  local build=$1
  shift
  if ! cmake --build "$build" -j "$JOBS" --target "$@" >"$build/build.log" 2>&1; then
    tail -50 "$build/build.log"
    exit 1
  fi
}

build_tsan() {
  # -Werror off: g++ -O1 gives false -Wstringop-overflow warnings in the SIMD kernels. Test files
  # at -O0 (KVCTL_TEST_OPT_LEVEL): a third of their compile time; the code under test stays -O1.
  cmake -S . -B "$TSAN_BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" -DKVCTL_CUDA=OFF -DKVCTL_TORCH=OFF \
    -DKVCTL_WERROR=OFF -DKVCTL_TEST_OPT_LEVEL=-O0 "-DCMAKE_CXX_FLAGS=-fsanitize=thread" >/dev/null
  build_targets "$TSAN_BUILD" kvctl integration_test ipc_server_test pool_test \
    service_threads_test sequence_pressure_test
}

# Runs a test binary with the sanitizer's reports (its own and its children's) logged to files;
# fails on a non-zero exit or on any report file.
run_logged() {
  local build=$1 var=$2 options=$3
  shift 3
  local logs="$ROOT/$build/sanitizer-logs/$$"
  rm -rf "$logs"
  mkdir -p "$logs"
  local rc=0
  env "$var=$options:log_path=$logs/report" "$@" || rc=$?
  if compgen -G "$logs/report*" >/dev/null; then
    echo "sanitize: reports in $logs:"
    cat "$logs"/report*
    rc=1
  fi
  rm -rf "$logs"
  return "$rc"
}

need() {
  [ -x "$1" ] && return 0
  echo "sanitize: $1 is not built (run tools/sanitize.sh build); skipped"
  exit 77
}

run_check() {
  local asan_opts="detect_leaks=1:halt_on_error=1"
  local ubsan="UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1"
  local tsan_opts="halt_on_error=0:second_deadlock_stack=1"
  tsan_opts+=":suppressions=$ROOT/tests/fuzz/tsan_suppressions.txt"
  case $1 in
    asan-kernels | asan-ipc)
      local bin="$ASAN_BUILD/tests/${1#asan-}_test"
      need "$bin"
      run_logged "$ASAN_BUILD" ASAN_OPTIONS "$asan_opts" env "$ubsan" "$bin"
      ;;
    asan-controller)
      local skip="$NOT_UNDER_SANITIZERS $TOO_SLOW_INSTRUMENTED"  # "," binds looser than " ".
      for bin in pool_test config_test service_test; do
        need "$ASAN_BUILD/tests/$bin"
        run_logged "$ASAN_BUILD" ASAN_OPTIONS "$asan_opts" env "$ubsan" "$ASAN_BUILD/tests/$bin" \
          "$skip"
      done
      # Slab compaction and moving a head's records to a narrower slab under a full pool: the
      # fuzzer's 2 MiB pool does not fill with short inputs, so these run here.
      need "$ASAN_BUILD/tests/sequence_pressure_test"
      run_logged "$ASAN_BUILD" ASAN_OPTIONS "$asan_opts" env "$ubsan" \
        "$ASAN_BUILD/tests/sequence_pressure_test" \
        "KvSequence: slab compaction*,KvSequence: a joint sequence under pressure lowers widths*"
      ;;
    tsan-integration)
      need "$TSAN_BUILD/tests/integration_test"
      run_logged "$TSAN_BUILD" TSAN_OPTIONS "$tsan_opts" "$TSAN_BUILD/tests/integration_test"
      ;;
    tsan-ipc)
      need "$TSAN_BUILD/tests/ipc_server_test"
      run_logged "$TSAN_BUILD" TSAN_OPTIONS "$tsan_opts" "$TSAN_BUILD/tests/ipc_server_test" \
        "ZmqServer*,Client*"
      ;;
    tsan-controller)
      for bin in pool_test service_threads_test sequence_pressure_test; do
        need "$TSAN_BUILD/tests/$bin"
      done
      run_logged "$TSAN_BUILD" TSAN_OPTIONS "$tsan_opts" "$TSAN_BUILD/tests/pool_test"
      run_logged "$TSAN_BUILD" TSAN_OPTIONS "$tsan_opts" "$TSAN_BUILD/tests/service_threads_test" \
        "[hostile]$NOT_UNDER_SANITIZERS,[threads]"
      run_logged "$TSAN_BUILD" TSAN_OPTIONS "$tsan_opts" \
        "$TSAN_BUILD/tests/sequence_pressure_test" \
        "KvSequence: under pool pressure*,KvSequence: pressure relief*,KvSequence: prepared on two threads*"
      ;;
    fuzz)
      need "$ASAN_BUILD/bin/kvctl_request_fuzz"
      KVCTL_FUZZ_BUILD=$ASAN_BUILD bash tools/fuzz.sh --no-build "${KVCTL_CI_FUZZ_SECONDS:-60}"
      ;;
    fuzz-image)
      need "$ASAN_BUILD/bin/kvctl_image_fuzz"
      KVCTL_FUZZ_BUILD=$ASAN_BUILD bash tools/fuzz.sh --no-build --image \
        "${KVCTL_CI_IMAGE_FUZZ_SECONDS:-30}"
      ;;
    *)
      echo "sanitize: unknown check \"$1\"; expected one of ${CHECKS[*]}" >&2
      exit 2
      ;;
  esac
}

case ${1:-all} in
  build)
    start=$(date +%s)
    build_asan
    echo "sanitize: asan/fuzz build done at $(($(date +%s) - start)) s"
    build_tsan
    echo "sanitize: built in $(($(date +%s) - start)) s"
    ;;
  run)
    run_check "$2"
    ;;
  all)
    build_asan
    build_tsan
    for check in "${CHECKS[@]}"; do
      echo "== $check"
      run_check "$check"
    done
    ;;
  *)
    echo "usage: tools/sanitize.sh [build | run CHECK]" >&2
    exit 2
    ;;
esac
