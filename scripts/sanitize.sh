#!/usr/bin/env bash
# Sanitizer suites (issue 9); scripts/test.sh runs both in CI.
#   asan : build-asan: clang with -fsanitize=address,undefined plus libFuzzer's coverage
#          instrumentation (-DQLFT_FUZZ=ON), so the same build also serves scripts/fuzz.sh
#          (FUZZ_BUILD=build-asan) instead of compiling everything a third time. Runs every
#          test whatever its label (unit, api, fuzz regression replays, the CPU-side cuda tests
#          such as test_hd_helpers, new labels by default) except those excluded below, with
#          leak checking on. Excluded: dist (this build has no MPI), bindings (Rust/Go toolchain
#          builds; example_c_finetune_lsan runs the C example under LSan), e2e and isa (the CLI
#          scripts and the ISA-capped reruns: not yet measured under ASan, CI time), the
#          RSS-level checks (RssHarness, MemoryScalingRss, NvmeOffloadRss,
#          PredictionIsWhatTheOsSees: ASan's shadow memory is RSS the tracker cannot see), and
#          ApiThreadOwnership (it counts teams through GNU OpenMP's GOMP_parallel entry, which
#          a clang build using LLVM's libomp never calls; the main suite runs it).
#          The same build is the emulated CUDA configuration (-DQLFT_CUDA_EMULATE=ON: libqlft is
#          unchanged, the emulator lives in the CUDA plugin and tests/cuda), so the CUDA backend's
#          host code runs under ASan+UBSan too (issue 43): after the suite above, every case of
#          the kernel and optimizer tests (test_cuda_ops, test_cuda_optim: 46 s and 11 s under
#          ASan on 2 shared cores) and, of the training-step tests, the two shortest by name
#          (asan_emu_steps below: the device-state checkpoint resume and greedy generation, both
#          through the C API and the CUDA plugin; 2 min together). The other step tests take 2-5 min each
#          without ASan and about 3x that with it, past this stage's budget; the emulator stage
#          of scripts/test.sh runs them all without ASan. The emulator announces its fiber
#          switches to ASan (cuda/emu/src/launch.cpp).
#   tsan : build-tsan: -DQLFT_SANITIZE=thread with clang + LLVM's libomp (-fopenmp=libomp): the
#          multi-threaded kernel tests (test_backend_*), the tokenizer's concurrent encode, and
#          the C API used from several threads (test_api_threads). GCC's libgomp is not
#          TSan-aware (its barriers are invisible to TSan, so every parallel region reports false
#          races); libomp with its Archer tool (libarcher.so, OMP_TOOL_LIBRARIES) annotates its
#          fork/join and barriers for TSan. OpenBLAS and oneDNN (Debian's, GNU OpenMP)
#          still run their own uninstrumented libgomp threads: ignore_noninstrumented_modules=1
#          and tests/fuzz/tsan.supp drop reports *inside* those libraries only, never in qlft.
# Both builds turn MPI off (-DQLFT_MPI=OFF): Open MPI's own allocations are reported as leaks
# and its progress threads as races, which says nothing about qlft.
# Usage: scripts/sanitize.sh [asan|tsan|all]; env ASAN_BUILD / TSAN_BUILD override the dirs,
# SAN_JOBS the build and ctest -j (default 2).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
what=${1:-all}
jobs=${SAN_JOBS:-2}
status=0

# A build dir configured differently before (another compiler or sanitizer) is reconfigured from
# scratch: CMake refuses to switch compilers in place.
fresh_cache_unless() {
  local b=$1 want=$2
  if [ -f "$b/CMakeCache.txt" ] && ! grep -q "$want" "$b/CMakeCache.txt"; then
    echo "sanitize: $b was configured differently; reconfiguring"
    rm -rf "$b/CMakeCache.txt" "$b/CMakeFiles"
  fi
}

run_asan() {
  local b=${ASAN_BUILD:-$root/build-asan}
  fresh_cache_unless "$b" '^QLFT_FUZZ:BOOL=ON'
  cmake -S "$root" -B "$b" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQLFT_FUZZ=ON -DQLFT_BUILD_TESTS=ON -DQLFT_MPI=OFF \
    -DQLFT_CUDA_EMULATE=ON >"$b.cmake.log" 2>&1 || { cat "$b.cmake.log"; return 1; }
  cmake --build "$b" -j "$jobs" || return 1
  # Leak checks on; OpenMP threads wait passively (two tests at a time on two cores).
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=0 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 OMP_WAIT_POLICY=passive \
    ctest --test-dir "$b" -LE 'dist|bindings|e2e|isa|cuda-emu' \
    -E 'RssHarness|MemoryScalingRss|NvmeOffloadRss|PredictionIsWhatTheOsSees|ApiThreadOwnership' -j "$jobs" \
    --output-on-failure --timeout 900 || return 1
  # The emulated CUDA backend (see the header): kernels and optimizers whole, the step by name.
  local asan_emu_steps='CudaFineTune\.DeviceStateCheckpointResumesExactly|CudaGenerate\.'
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=0 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 OMP_WAIT_POLICY=passive \
    ctest --test-dir "$b" -L cuda-emu -R "^(CudaOps|CudaOptim)\.|^($asan_emu_steps)" -j "$jobs" \
    --output-on-failure --timeout 900
}

run_tsan() {
  local b=${TSAN_BUILD:-$root/build-tsan}
  fresh_cache_unless "$b" '^QLFT_SANITIZE:STRING=thread'
  cmake -S "$root" -B "$b" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOpenMP_CXX_FLAGS=-fopenmp=libomp \
    -DOpenMP_C_FLAGS=-fopenmp=libomp -DQLFT_SANITIZE=thread -DQLFT_BUILD_TESTS=ON -DQLFT_MPI=OFF \
    >"$b.cmake.log" 2>&1 || { cat "$b.cmake.log"; return 1; }
  local tests=(test_backend_ops test_backend_props test_backend_gemm test_tokenizer test_api_threads)
  local present=()
  for t in "${tests[@]}"; do
    [ -f "$root/tests/unit/$t.cpp" ] || [ -f "$root/tests/api/$t.cpp" ] && present+=("$t")
  done
  cmake --build "$b" -j "$jobs" --target "${present[@]}" || return 1
  # Archer (LLVM's OMPT tool for TSan) tells TSan about OpenMP fork/join and barriers; without
  # it libomp's internal synchronization is invisible and a worker reading what the master wrote
  # before the region (e.g. a loop bound on the master's stack) is reported as a race whenever
  # the team was forked from a non-main thread (test_api_threads).
  local archer
  archer=$(ls /usr/lib/llvm-*/lib/libarcher.so 2>/dev/null | sort -V | tail -1)
  [ -n "$archer" ] || echo "tsan: libarcher.so not found (package libomp-dev); OpenMP races may be false"
  local rc=0
  for t in "${present[@]}"; do
    local filter='*'
    [ "$t" = test_tokenizer ] && filter='*Concurrent*'
    local exe=$b/tests/$t
    echo "tsan: $t ($filter)"
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ignore_noninstrumented_modules=1 suppressions=$root/tests/fuzz/tsan.supp" \
      OMP_TOOL_LIBRARIES="$archer" OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive QLFT_SOURCE_DIR="$root" \
      "$exe" --gtest_brief=1 --gtest_filter="$filter" || rc=1
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
  *)
    echo "usage: $0 [asan|tsan|all]" >&2
    exit 2
    ;;
esac
[ $status -eq 0 ] && echo "sanitize: $what passed" || echo "sanitize: $what FAILED"
exit $status
