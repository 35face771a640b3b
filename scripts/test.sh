#!/usr/bin/env bash
# The test command: installs what is missing, builds (CPU, and the CUDA configuration when the
# toolkit is present), and runs the whole ctest suite on 2 cores. CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

jobs=${QLFT_JOBS:-2}
build=${QLFT_BUILD_DIR:-build}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
# Paths inside the checkout hash as relative ones, so a fresh clone elsewhere reuses the cache.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
ccache -o hash_dir=false >/dev/null 2>&1 || true

if [ "${CI:-}" = "true" ]; then
  export QLFT_REQUIRE_SHARED=1  # in CI a missing shared/ file fails instead of skipping
fi

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQLFT_BUILD_TESTS=ON
cmake --build "$build" -j "$jobs"

if [ -x /usr/local/cuda/bin/nvcc ]; then
  # ---- CUDA (issue 6) ---------------------------------------------------------------------
  # The CUDA configuration: the backend library (cuda/) compiles for sm_80..sm_90 and links into
  # libqlft, the CLI and the GPU tests (tests/cuda). Without a device every GPU case reports
  # itself skipped (ctest lists them under "did not run"), the backend=cuda selection test
  # checks the clear error, and the CUDA source lint runs (it also runs in the CPU suite).
  cmake -S . -B "$build-cuda" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQLFT_CUDA=ON \
    -DQLFT_BUILD_TESTS=ON
  cuda_tests=$(cd tests/cuda && ls test_*.cpp | sed 's/\.cpp$//')
  # The NCCL communicator's test (tests/dist) exists when MPI is on too; unbuilt, ctest would
  # register an unlabelled test_dist_nccl_NOT_BUILT that `-L cuda` silently leaves out.
  # (grep reads all of ninja's list: `grep -q` would exit at the match, and under pipefail the
  # SIGPIPE it leaves ninja makes the test false at random.)
  if ninja -C "$build-cuda" -t targets all 2>/dev/null | grep '^test_dist_nccl:' >/dev/null; then
    cuda_tests="$cuda_tests test_dist_nccl"
  fi
  # A machine with an NVIDIA device node must run the GPU tests: QLFT_REQUIRE_GPU=1 turns each
  # "no usable CUDA device" skip into a failure (a broken driver must not look green).
  if compgen -G '/dev/nvidia[0-9]*' >/dev/null; then export QLFT_REQUIRE_GPU=${QLFT_REQUIRE_GPU:-1}; fi
  # shellcheck disable=SC2086
  # qlft builds the CUDA plugin (libqlft-cuda.so) beside it; `cuda=1` says the plugin loads.
  cmake --build "$build-cuda" -j "$jobs" --target qlft qlft-finetune qlft_fake_cuda_plugin $cuda_tests
  "$build-cuda/tools/qlft-finetune/qlft-finetune" version | grep "cuda=1" >/dev/null
  echo "cuda build: ok ($("$build-cuda/tools/qlft-finetune/qlft-finetune" version))"
  (cd "$build-cuda" && ctest -L cuda --output-on-failure --timeout 600)
fi

# ---- CUDA emulator (issue 17) -------------------------------------------------------------------
# The same cuda/src sources compiled as host C++ against cuda/emu (no toolkit needed): every CUDA
# kernel, cuBLASLt call and the whole backend=cuda training step run on the CPU and are compared
# with the CPU backend; the emulator's own tests show it catches barrier races and bad accesses.
cmake -S . -B "$build-cuda-emu" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQLFT_CUDA_EMULATE=ON \
  -DQLFT_BUILD_TESTS=ON
# dist_worker: the backend=cuda training scripts (NCCL ranks, offload) run it.
# qlft-finetune and the fake plugin: cuda_plugin_absent (the CLI with the plugin beside libqlft,
# and without the CUDA libraries).
emu_tests="test_cuda_emulator test_cuda_graph test_cuda_wmma dist_worker qlft-finetune qlft_fake_cuda_plugin $(cd tests/cuda && ls test_cuda_*.cpp | sed 's/\.cpp$//' | tr '\n' ' ')"
# The emulated NCCL communicator's mpirun worker exists where MPI does (with the MPI plugin it uses).
# (grep without -q: see the CUDA build's test above; a SIGPIPE dropped the worker in one CI run.)
if ninja -C "$build-cuda-emu" -t targets all 2>/dev/null | grep '^nccl_emu_worker:' >/dev/null; then
  emu_tests="$emu_tests nccl_emu_worker"
fi
# shellcheck disable=SC2086
cmake --build "$build-cuda-emu" -j "$jobs" --target $emu_tests
# The emulated training-step tests (CudaFineTune*, CudaGenerate*, CudaAutotuneTest*, the NCCL
# loss curves and offload) take about 8 min of the stage on 2 cores.
(cd "$build-cuda-emu" && ctest -L cuda-emu -j "$jobs" --output-on-failure --timeout 600)

root=$PWD
(cd "$build" && ctest -j "$jobs" --output-on-failure --timeout 600)

# ---- hardening (issue 9): sanitizers and fuzzing, after the main suite ------------------------
# One clang ASan+UBSan build (with libFuzzer coverage instrumentation) runs the unit, C API and
# fuzz-regression suites, then fuzzes each target for QLFT_FUZZ_SECONDS (default 30); a TSan
# build runs the threaded kernels and the C API from several threads. QLFT_HARDENING=0 skips
# this (quick local runs); CI always runs it.
if [ "${QLFT_HARDENING:-1}" != "0" ]; then
  case $build in /*) san=$build ;; *) san=$root/$build ;; esac
  ASAN_BUILD="$san-asan" TSAN_BUILD="$san-tsan" SAN_JOBS=$jobs bash scripts/sanitize.sh asan
  ASAN_BUILD="$san-asan" TSAN_BUILD="$san-tsan" SAN_JOBS=$jobs bash scripts/sanitize.sh tsan
  FUZZ_BUILD="$san-asan" FUZZ_JOBS=$jobs bash scripts/fuzz.sh "${QLFT_FUZZ_SECONDS:-30}"
fi
