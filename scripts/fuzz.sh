#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan+UBSan, build-fuzz/) and runs each for a bounded time,
# then replays the committed regression corpora. Every run appends one line per target to
# build-fuzz/fuzz-log.txt: date, target, seconds, executions, result.
#
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET=60] [TARGET...]
# Env: QLFT_SHARED_DIR (real models/data, default ../shared), FUZZ_BUILD (default build-fuzz),
#      FUZZ_JOBS (ninja -j, default 2), FUZZ_ARGS (extra libFuzzer flags), FUZZ_NO_BUILD=1.
# A crash leaves its input in build-fuzz/fuzz-artifacts/<target>/; after fixing the bug, copy it
# to tests/fuzz/regress/<target>/ so `ctest --test-dir build-fuzz/tests/fuzz -L fuzz` (or this script) replays it forever.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-60}
shift || true
build=${FUZZ_BUILD:-$root/build-fuzz}
all=(fuzz_gguf fuzz_safetensors fuzz_safetensors_index fuzz_hf_model fuzz_tokenizer_json
  fuzz_tokenizer_text fuzz_records fuzz_config_yaml fuzz_checkpoint fuzz_cli_args
  fuzz_output_guard)
targets=("${@:-${all[@]}}")
[ $# -eq 0 ] && targets=("${all[@]}")

if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DQLFT_FUZZ=ON -DQLFT_BUILD_TESTS=OFF -DQLFT_MPI=OFF || exit 1
fi
# FUZZ_NO_BUILD=1: fuzz the binaries as they are (a long campaign while the tree keeps changing).
if [ "${FUZZ_NO_BUILD:-}" != 1 ]; then
  ninja -C "$build" -j"${FUZZ_JOBS:-2}" "${targets[@]}" || exit 1
fi
bash "$root/tests/fuzz/make_seeds.sh" "$build" >/dev/null || exit 1

export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
log=$build/fuzz-log.txt
status=0
for t in "${targets[@]}"; do
  exe=$build/tests/fuzz/$t
  corpus=$build/fuzz-corpus/$t
  arts=$build/fuzz-artifacts/$t
  mkdir -p "$corpus" "$arts"
  # 1. The regression corpus must pass before anything else.
  if ! "$exe" -runs=0 "$root/tests/fuzz/regress/$t" >"$build/fuzz-$t.regress.txt" 2>&1; then
    echo "fuzz: $t REGRESSION input fails (see $build/fuzz-$t.regress.txt)"
    echo "$(date -u +%FT%TZ) $t regress FAIL" >>"$log"
    status=1
    continue
  fi
  # 2. Bounded fuzzing from the grown corpus plus the seeds.
  "$exe" -max_total_time="$secs" -timeout=30 -rss_limit_mb=4096 -malloc_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$arts/" ${FUZZ_ARGS:-} \
    "$corpus" "$build/fuzz-seeds/$t" >"$build/fuzz-$t.txt" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$build/fuzz-$t.txt" | grep -o '[0-9]*$' | tail -1)
  [ -z "$execs" ] && execs=$(grep -o 'Done [0-9]* runs' "$build/fuzz-$t.txt" | grep -o '[0-9]*' | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$build/fuzz-$t.txt" | tail -1 | grep -o '[0-9]*')
  result=ok
  if [ $rc -ne 0 ]; then
    result="CRASH rc=$rc artifacts=$arts"
    status=1
  fi
  line="$(date -u +%FT%TZ) $t seconds=$secs execs=${execs:-0} cov=${cov:-?} corpus=$(ls "$corpus" | wc -l) $result"
  echo "$line" | tee -a "$log"
done
exit $status
