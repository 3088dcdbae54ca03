#!/usr/bin/env bash
# The thread-safety check (common/thread_annotations.h): clang 14 with -Wthread-safety
# -Werror=thread-safety checks every translation unit of every library and binary (the daemon,
# kvtop, kvbench, kvcalib, kvdemo) as configured in build-tsa/, without tests, CUDA or torch, at
# -fsyntax-only (tools/syntax_check.py over CMake's compile database): nothing is compiled or runs.
# A member declared KVCTL_GUARDED_BY read or written without its lock, a KVCTL_REQUIRES function
# called without it, or a lock left held fails the check with clang's message. The kernels' SIMD
# files are skipped (GCC vector extensions that clang 14 lacks; they take no locks).
#
# First it proves the flags bite: tests/thread_safety/unguarded_access.cc breaks the rules (each
# break marked "Breaks:") and must fail with one thread-safety error per mark.
#
#   tools/thread_safety.sh          (tools/test.sh runs it before CTest; KVCTL_SKIP_THREAD_SAFETY=1
#                                    skips it there)
#   KVCTL_TSA_BUILD=DIR   build dir (default build-tsa); KVCTL_JOBS: build jobs
# Needs clang-14 (tools/setup.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${KVCTL_TSA_BUILD:-build-tsa}
JOBS=${KVCTL_JOBS:-$(nproc)}
FLAGS="-Wthread-safety -Werror=thread-safety"
start=$(date +%s)

probe=tests/thread_safety/unguarded_access.cc
expected=$(grep -c '// Breaks:' "$probe")
# shellcheck disable=SC2086  # FLAGS is a list of flags.
if out=$(clang++-14 -std=c++20 -fsyntax-only -I"$ROOT" $FLAGS "$probe" 2>&1); then
  echo "thread-safety: $probe compiled; the analysis is not running"
  exit 1
fi
found=$(grep -c 'error: .*\[-Werror,-Wthread-safety' <<<"$out" || true)
if [ "$found" != "$expected" ]; then
  echo "thread-safety: $probe gave $found thread-safety errors, expected $expected:"
  echo "$out"
  exit 1
fi

mkdir -p "$BUILD"
cmake -S . -B "$BUILD" -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_CXX_COMPILER_LAUNCHER= -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O0" \
  -DKVCTL_CUDA=OFF -DKVCTL_TORCH=OFF -DKVCTL_BUILD_TESTS=OFF -DKVCTL_WERROR=OFF \
  "-DCMAKE_CXX_FLAGS=$FLAGS" >"$BUILD/configure.log" 2>&1 ||
  { cat "$BUILD/configure.log"; exit 1; }
# The analysis is semantic, so every translation unit of the compile database is checked with
# -fsyntax-only (no code generation, no linking: about half the time of an -O0 build), JOBS at a
# time. Other clang warnings (on code written for g++, which -Werror checks in the main build) stay
# in the log; only the thread-safety ones are errors.
if ! python3 "$ROOT/tools/syntax_check.py" "$BUILD/compile_commands.json" --jobs "$JOBS" \
  --skip '/kernels/[^/]*(avx2|avx512)\.cc$' >"$BUILD/build.log" 2>&1; then
  grep -A3 -- '-Wthread-safety' "$BUILD/build.log" | head -60 || true
  tail -20 "$BUILD/build.log"
  exit 1
fi
echo "thread-safety: clean in $(($(date +%s) - start)) s"
