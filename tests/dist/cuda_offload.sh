#!/usr/bin/env bash
# offload.params=cpu and offload.optimizer=cpu with backend=cuda (issue 18, Done-when 5, on the
# CUDA emulator, stories260K): the same loss curve and final weights as without offload within
# 1e-4; no optimizer state on the device (the step runs on the host); the device's weight peak
# below the run without offload's (a unit and the next one on the device, not the model); the
# host->device bytes per step equal the planner's prediction (streamed units, batches); the
# model holds its weights again after the trainer (generation and export can use it).
# usage: cuda_offload.sh WORKER SHARED_DIR (from the emulated build: QLFT_CUDA_EMULATE=ON)
source "$(dirname "$0")/common.sh"
common=(train.max_steps=4 train.micro_batch=2 data.seq_len=64 lora.dropout=0.1
        optim.max_grad_norm=0.05 quant.type=nf4 backend=cuda train.accumulation=2)
field() { tr ' ' '\n' <"$1" | grep -A1 -x "$2" | tail -n1; }
"$worker" train "$model" "$data" "$work/ref.txt" "${common[@]}" "w.mem=$work/ref"
"$worker" train "$model" "$data" "$work/off.txt" "${common[@]}" offload.params=cpu \
  offload.optimizer=cpu "w.mem=$work/off"
echo "no offload: $(cat "$work/ref.0")"
echo "offload:    $(cat "$work/off.0")"
"$worker" compare "$work/off.txt" "$work/ref.txt" 1e-4
[ "$(field "$work/ref.0" device_optimizer_peak)" -gt 0 ] ||
  { echo "FAIL: the run without offload kept no optimizer state on the device"; exit 1; }
[ "$(field "$work/off.0" device_optimizer_peak)" = 0 ] ||
  { echo "FAIL: offload.optimizer=cpu left optimizer state on the device"; exit 1; }
ref_w=$(field "$work/ref.0" device_weights_peak)
off_w=$(field "$work/off.0" device_weights_peak)
awk -v a="$off_w" -v b="$ref_w" 'BEGIN { exit !(b > 0 && a < 0.6 * b) }' ||
  { echo "FAIL: device weights peak $off_w with offload.params=cpu, not below 0.6 x $ref_w"; exit 1; }
echo "device weights peak: $off_w of $ref_w = $(awk -v a="$off_w" -v b="$ref_w" 'BEGIN { printf "%.3f", a / b }')x"
# The host->device bytes of steps 2-4 are the planner's prediction exactly (batches; with
# offload the streamed units and the host step's A/B per micro-batch); device->host bytes are
# its prediction (the host step's gradients) plus the scalars, under 64 B a step.
for run in ref off; do
  h2d=$(field "$work/$run.0" h2d_later)
  plan=$(field "$work/$run.0" planned_h2d_per_step)
  [ "$h2d" = "$((3 * plan))" ] ||
    { echo "FAIL: $run moved $h2d B host->device in steps 2-4, the planner says 3 x $plan"; exit 1; }
  d2h=$(field "$work/$run.0" d2h_later)
  dplan=$(field "$work/$run.0" planned_d2h_per_step)
  extra=$((d2h - 3 * dplan))
  [ "$extra" -ge 0 ] && [ "$extra" -le $((3 * 64)) ] ||
    { echo "FAIL: $run moved $d2h B device->host in steps 2-4, the planner says 3 x $dplan + scalars"; exit 1; }
  echo "$run: per step host->device $((h2d / 3)) B = planned $plan B; device->host $((d2h / 3)) B = planned $dplan B + $((extra / 3)) B of scalars"
done
grep -q "after_end resident" "$work/off.0" ||
  { echo "FAIL: the model did not get its weights back after the trainer"; exit 1; }
