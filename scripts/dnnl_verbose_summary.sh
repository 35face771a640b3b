#!/usr/bin/env bash
# Where oneDNN's time goes in a run made with ONEDNN_VERBOSE=1: its `exec` lines (one per
# primitive execution, with the kernel oneDNN chose and its time in ms) summed by kernel and
# memory layouts (a `ba` layout is a transposed operand), then by those and the problem's
# dimensions, largest first. Executions inside parallel regions add their threads' times.
#
#   bash scripts/dnnl_verbose_summary.sh FILE [ROWS]      (ROWS: of the second table, default 40)
set -euo pipefail
file=${1:?a file of ONEDNN_VERBOSE=1 output}
rows=${2:-40}
summary() {  # $1: the awk expression of the key
  awk -F, -v OFS=, '$1 == "onednn_verbose" && $2 == "exec" {
      k = '"$1"'; n[k]++; t[k] += $NF; all += $NF
    }
    END {
      for (k in n) printf "%10.1f ms %5.1f%% %8d  %s\n", t[k], 100 * t[k] / (all ? all : 1), n[k], k
    }' "$file" | sort -rn
}
echo "== by primitive, kernel and layouts: ms, share, executions"
# shellcheck disable=SC2016  # the keys are awk expressions
summary '$4 " " $5 " " $7 " " $8'
echo "== by those and the dimensions (largest $rows)"
# shellcheck disable=SC2016
summary '$4 " " $5 " " $7 " " $8 " " $10' | head -n "$rows"
