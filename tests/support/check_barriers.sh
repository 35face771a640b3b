#!/usr/bin/env bash
# Removing any one __syncthreads() from any kernel makes the emulated suite fail (issue 45, Done
# when 1). For every barrier site in cuda/src (grep), the emulated kernel tests run with that one
# site left out (QLFT_EMU_SKIP_SITE, the emulator's site switch: cuda/emu/include/qlft_emu_device.h)
# and the site is reported as
#   caught  the tests fail (the race check or the values),
#   MISSED  they pass without it,
#   UNREACHED  no test ran it (the emulator never announced skipping it).
# The tests first run with nothing left out; they must pass, or no result would mean anything.
#
# Usage: check_barriers.sh BUILD_DIR [--sites REGEX] [--tests "BIN..."] [--filter GTEST_FILTER]
#                          [--pattern WORD]
#   BUILD_DIR   an emulated build (-DQLFT_CUDA_EMULATE=ON) with the test binaries built
#   --sites     only the sites whose "file:line" matches REGEX (e.g. 'reduce.cuh')
#   --tests     the gtest binaries (default: the kernel tests test_cuda_ops, test_cuda_optim,
#               test_cuda_attention_tc, test_cuda_generate (the decode kernels), and
#               test_cuda_emulator, whose tests hold reduce.cuh's helpers to their contract:
#               block_sum's array may be reused at once, which no kernel in cuda/src does today)
#   --filter    the gtest filter for every run (default: all)
#   --pattern   the call that marks a site (default __syncthreads; another switchable intrinsic,
#               such as a fragment load, can be swept the same way)
# Exit status: 0 when every site is caught, 1 otherwise, 2 on a usage or baseline error.
# Last full sweep (emulated build, 2 cores, ~4 min): every __syncthreads site caught, 21 of 21
# (k_quant.cu's trailing dequant barrier by CudaOps.DequantizationLoopingPerBlockEqualsCpu, the
# decode kernels' by CudaGenerate.DecodeAttentionEqualsCpu).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:?usage: check_barriers.sh BUILD_DIR [--sites REGEX] [--filter F] [--pattern WORD]}
shift
sites_re=. filter='*' pattern=__syncthreads tests="test_cuda_ops test_cuda_optim test_cuda_attention_tc test_cuda_generate test_cuda_emulator"
while [ $# -gt 0 ]; do
  case $1 in
    --sites) sites_re=$2; shift 2 ;;
    --tests) tests=$2; shift 2 ;;
    --filter) filter=$2; shift 2 ;;
    --pattern) pattern=$2; shift 2 ;;
    *) echo "check_barriers: unknown argument $1" >&2; exit 2 ;;
  esac
done
bins=()
for t in $tests; do
  exe=$(find "$build" -name "$t" -type f -perm -u+x 2>/dev/null | head -1)
  [ -n "$exe" ] || { echo "check_barriers: $t not built in $build" >&2; exit 2; }
  bins+=("$exe")
done

# Sites: "file:line" of each call outside a comment, the file by its name under cuda/src.
mapfile -t sites < <(cd "$root/cuda/src" && grep -n "\b$pattern(" -- *.cu *.cuh 2>/dev/null |
  grep -v "^[^:]*:[0-9]*:[[:space:]]*//" | cut -d: -f1,2 | grep -E -- "$sites_re")
[ ${#sites[@]} -gt 0 ] || { echo "check_barriers: no $pattern site matches '$sites_re'" >&2; exit 2; }

export OMP_WAIT_POLICY=passive QLFT_POISON_UNINIT=1 QLFT_SHARED_DIR=${QLFT_SHARED_DIR:-$root/../shared}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Runs the test binaries; returns 0 when all pass. The first failure is the answer
# (--gtest_fail_fast, and no further binary), so the log ends with it.
run_tests() {
  : >"$log"
  for exe in "${bins[@]}"; do
    "$exe" --gtest_filter="$filter" --gtest_fail_fast >>"$log" 2>&1 || return 1
  done
}

if ! QLFT_EMU_SKIP_SITE= run_tests; then
  echo "check_barriers: the tests fail with no site left out:" >&2
  tail -40 "$log" >&2
  exit 2
fi
missed=0
for site in "${sites[@]}"; do
  t0=$SECONDS
  if QLFT_EMU_SKIP_SITE=$site run_tests; then
    if grep -q "QLFT_EMU_SKIP_SITE: leaving out .*$site\$" "$log"; then
      verdict=MISSED
    else
      verdict=UNREACHED
    fi
    missed=$((missed + 1))
  else
    first=$(grep -m1 -o '^\[  FAILED  \] [A-Za-z0-9_./]*' "$log" | cut -c14-)
    # What the failing test printed: from its "[ RUN" line to its "[  FAILED".
    failing=$(awk '/^\[ RUN      \]/ { buf = "" } { buf = buf $0 "\n" } /^\[  FAILED  \]/ { print buf; exit }' "$log")
    how=values
    grep -q 'shared-memory race' <<<"$failing" && how=race
    grep -q 'deadlock' <<<"$failing" && how=deadlock
    verdict="caught ($how; first failing test: ${first:-?})"
  fi
  printf '%-22s %s [%ds]\n' "$site" "$verdict" $((SECONDS - t0))
done
echo "check_barriers: ${#sites[@]} $pattern sites, $((${#sites[@]} - missed)) caught, $missed missed"
[ $missed -eq 0 ]
