#!/usr/bin/env bash
# Shows that a test which expects a code path asks the dispatch function the code uses, not the
# CPU's flags: test_planner's AMX attention test prints the expectation it derived from
# cpu::gemm_bf16_native() ("workspace expectation: exact|modelled"); this runs it at the CPU's own
# level and capped at every level below it (QLFT_CPU_ISA) and checks, at each, that it passes and
# that its expectation is the one `qlft-finetune version` reports for the same cap (bf16gemm=).
# On a CPU whose bf16 GEMMs run on oneDNN the expectation must change between the levels (modelled
# at its own, exact once capped below AVX512-BF16), and pass both ways.
#   path_expectation.sh QLFT_FINETUNE TEST_PLANNER
set -euo pipefail
tool=$1 test=$2
order=(baseline avx2 avx512 avx512_bf16 amx)
cpu=$(env -u QLFT_CPU_ISA "$tool" version | sed -n 's/.* cpu=\([a-z0-9_]*\) .*/\1/p')
levels=()
for l in "${order[@]}"; do
  levels+=("$l")
  [ "$l" = "$cpu" ] && break
done
[ "${levels[-1]}" = "$cpu" ] || { echo "path_expectation: unknown CPU level '$cpu'" >&2; exit 2; }

seen=()
for l in "${levels[@]}"; do
  engine=$(QLFT_CPU_ISA=$l "$tool" version | sed -n 's/.* bf16gemm=\([a-z]*\) .*/\1/p')
  case $engine in
    onednn) want=modelled ;;
    sgemm) want=exact ;;
    *) echo "path_expectation: no bf16gemm= in 'version' at $l" >&2; exit 2 ;;
  esac
  log=$(QLFT_CPU_ISA=$l "$test" --gtest_filter='PlannerTest.AttentionOnAmxTilesMatchesTheTracker' 2>&1) || {
    printf '%s\n' "$log"
    echo "FAIL: the test failed at isa=$l (bf16gemm=$engine)"
    exit 1
  }
  got=$(printf '%s\n' "$log" | sed -n 's/^workspace expectation: \([a-z]*\) .*/\1/p')
  echo "isa=$l bf16gemm=$engine: expected '$want', the test expected '$got' and passed"
  if [ "$got" != "$want" ]; then
    echo "FAIL: at isa=$l the test's expectation ($got) is not the dispatch's ($engine)"
    exit 1
  fi
  seen+=("$got")
done
# Where the CPU runs both engines, the expectation must have changed across the caps.
if [ "${seen[-1]}" = modelled ] && [ "${seen[0]}" != exact ]; then
  echo "FAIL: the expectation did not change when the ISA was capped below the bf16 engine"
  exit 1
fi
echo "path_expectation: ok (${#levels[@]} levels)"
