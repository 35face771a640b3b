#!/usr/bin/env bash
# Sanitizer suites (issue 9):
#   asan : build-asan, -DQLFT_SANITIZE=address,undefined (the default compiler, gcc), the whole
#          unit suite (ctest -L unit).
#   tsan : build-tsan, -DQLFT_SANITIZE=thread with clang + LLVM's libomp (-fopenmp=libomp):
#          the multi-threaded kernel tests (test_backend_*) and the C API used from several
#          threads (test_api_threads). GCC's libgomp is not TSan-aware (its barriers are invisible
#          to TSan, every parallel region reports false races), so TSan uses clang/libomp, whose
#          runtime carries TSan annotations. OpenBLAS (the OpenMP flavour) still runs its own
#          libgomp threads uninstrumented: tests/fuzz/tsan.supp suppresses reports *inside*
#          libopenblas/libgomp only, never in qlft code.
# Usage: scripts/sanitize.sh [asan|tsan|all] ; env ASAN_BUILD / TSAN_BUILD override the dirs,
# SAN_JOBS the ninja -j (default 2).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
what=${1:-all}
jobs=${SAN_JOBS:-2}
status=0

run_asan() {
  local b=${ASAN_BUILD:-$root/build-asan}
  cmake -S "$root" -B "$b" -G Ninja -DQLFT_SANITIZE=address,undefined -DQLFT_BUILD_TESTS=ON >/dev/null || return 1
  ninja -C "$b" -j"$jobs" || return 1
  # Leak checks on; OpenMP threads wait passively (the tests run two at a time on two cores).
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$b" -L unit -j2 --output-on-failure
}

run_tsan() {
  local b=${TSAN_BUILD:-$root/build-tsan}
  cmake -S "$root" -B "$b" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DOpenMP_CXX_FLAGS=-fopenmp=libomp -DOpenMP_C_FLAGS=-fopenmp=libomp \
    -DQLFT_SANITIZE=thread -DQLFT_BUILD_TESTS=ON >/dev/null || return 1
  ninja -C "$b" -j"$jobs" test_backend_ops test_backend_props test_api_threads || return 1
  local rc=0
  for t in test_backend_ops test_backend_props test_api_threads; do
    echo "tsan: $t"
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ignore_noninstrumented_modules=1 suppressions=$root/tests/fuzz/tsan.supp" \
      OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive QLFT_SOURCE_DIR="$root" \
      "$b/tests/$t" --gtest_brief=1 || rc=1
  done
  return $rc
}

case $what in
  asan) run_asan || status=1 ;;
  tsan) run_tsan || status=1 ;;
  all)
    run_asan || status=1
    run_tsan || status=1
    ;;
  *) echo "usage: $0 [asan|tsan|all]" >&2; exit 2 ;;
esac
[ $status -eq 0 ] && echo "sanitize: $what passed" || echo "sanitize: $what FAILED"
exit $status
