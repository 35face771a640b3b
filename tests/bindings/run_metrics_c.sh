#!/usr/bin/env bash
# ctest metrics_c_run: a real run's metrics.jsonl for the bindings' metrics tests. qlft-finetune
# trains stories260K 6 fp32 steps with an evaluation every 3 into $QLFT_BINDINGS_OUT/metrics-run,
# and qlft_metrics_dump writes what the C API reads from it (every field of every record) to
# metrics-run/metrics_c.txt; bindings_rust and bindings_go must read the same values.
# usage: run_metrics_c.sh QLFT_FINETUNE QLFT_METRICS_DUMP
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/skip.sh"
cli=$1
dump=$2
shared=${QLFT_SHARED_DIR:?}
model=$shared/models/stories260K.gguf
data=$shared/data/tinyshakespeare.txt
[[ -f $model && -f $data ]] || qlft_skip shared-missing "$model or $data is absent"
out=${QLFT_BINDINGS_OUT:?}/metrics-run
rm -rf "$out"
mkdir -p "$(dirname "$out")"
"$cli" train --model "$model" --data "$data" --train.output_dir "$out" --threads 1 \
  --quant.type keep --train.precision fp32 --data.seq_len 32 --train.micro_batch 2 --seed 42 \
  --train.max_steps 6 --train.eval_every 3 --data.eval_fraction 0.01 > "$out.log" 2>&1 || {
  cat "$out.log"; exit 1; }
"$dump" "$out/metrics.jsonl" > "$out/metrics_c.txt"
# The run must hold what the bindings are compared on, or the comparison proves little: six
# step records, two of them evaluated (train.eval_every), an evaluation record of its own (the
# one before training: no loss), a memory timeline and the planner's prediction.
summary=$(awk '$1 != "records" {
    i = substr($1, 1, index($1, ".") - 1); f = substr($1, index($1, ".") + 1); v[i, f] = $2
    if (i + 1 > n) n = i + 1 }
  END {
    for (i = 0; i < n; i++) {
      ev = v[i, "eval_loss"] != "nan"
      if (v[i, "loss"] != "nan") { steps++; step_evals += ev } else eval_records += ev
      mem += (v[i, "memory.weights"] > 0); peak += (v[i, "memory_category_peak.activations"] > 0)
      pred += (v[i, "predicted_total"] > 0) }
    printf "steps=%d step_evals=%d eval_records=%d mem=%d peak=%d pred=%d\n",
      steps, step_evals, eval_records, (mem > 0), (peak > 0), (pred > 0) }' "$out/metrics_c.txt")
echo "C API: $summary"
[[ $summary =~ ^steps=6\ step_evals=2\ eval_records=[1-9][0-9]*\ mem=1\ peak=1\ pred=1$ ]] || {
  echo "FAIL: the run lacks what the comparison needs"; cat "$out/metrics_c.txt"; exit 1; }
echo "metrics: $(wc -l < "$out/metrics_c.txt") lines from the C API ($out/metrics_c.txt)"
echo OK
