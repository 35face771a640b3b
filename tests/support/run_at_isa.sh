#!/usr/bin/env bash
# Runs a test executable with its kernels capped at one ISA level (QLFT_CPU_ISA), so the paths a
# smaller CPU takes are tested on this one too.
#   run_at_isa.sh LEVEL QLFT_FINETUNE TEST_EXE [ARGS...]
# The level must be below the CPU's own (the uncapped suite already runs the CPU's level); a
# level at or above it exits 77 (ctest: skipped) saying so. That skip is expected: the CPU
# lacks the path, or the main run covers it.
set -euo pipefail
level=$1 tool=$2
shift 2
order=(baseline avx2 avx512 avx512_bf16 amx)
rank() { for i in "${!order[@]}"; do [ "${order[$i]}" = "$1" ] && echo "$i" && return; done; echo -1; }
# The library's own detection (CPUID + XGETBV + AMX permission), as `version` reports it.
cpu=$(env -u QLFT_CPU_ISA "$tool" version | sed -n 's/.* cpu=\([a-z0-9_]*\) .*/\1/p')
if [ -z "$cpu" ] || [ "$(rank "$level")" -lt 0 ]; then
  echo "run_at_isa: cannot read the CPU level ('$cpu') or unknown level '$level'" >&2
  exit 2
fi
if [ "$(rank "$level")" -ge "$(rank "$cpu")" ]; then
  source "$(dirname "${BASH_SOURCE[0]}")/skip.sh"
  qlft_skip isa-absent "ISA level $level is not below this CPU's ($cpu); the uncapped suite runs it"
fi
export QLFT_CPU_ISA=$level
info=$("$tool" version)
case $info in *" isa=$level "*) ;; *) echo "run_at_isa: cap not applied: $info" >&2; exit 2 ;; esac
echo "$info"
exec "$@"
