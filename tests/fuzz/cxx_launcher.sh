#!/usr/bin/env bash
# CMAKE_CXX_COMPILER_LAUNCHER of the clang 14 builds: fuzz (tools/fuzz.sh) and thread safety
# (tools/thread_safety.sh). The kernels' SIMD translation units (kernels/*avx2.cc,
# kernels/*avx512.cc) use GCC vector extensions (__builtin_shuffle) that clang 14 lacks, so those
# few are compiled by g++ with the same ASan and UBSan instrumentation (GCC's objects run on clang's
# sanitizer runtime) but without libFuzzer's coverage, which GCC cannot emit, and without clang's
# -Wthread-safety (they take no locks); every other file goes to the compiler CMake chose.
set -euo pipefail
compiler=$1
shift
for arg in "$@"; do
  case $arg in
    */kernels/*avx2.cc | */kernels/*avx512.cc)
      gcc_args=()
      for a in "$@"; do
        case $a in
          -fsanitize=*) gcc_args+=("-fsanitize=address,undefined") ;;
          -gline-tables-only) gcc_args+=("-g1") ;;
          -Wthread-safety* | -Werror=thread-safety*) ;;
          *) gcc_args+=("$a") ;;
        esac
      done
      exec g++ "${gcc_args[@]}"
      ;;
  esac
done
exec "$compiler" "$@"
