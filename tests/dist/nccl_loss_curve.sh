#!/usr/bin/env bash
# dist.backend=nccl in the trainer (issue 18, Done-when 4), on the CUDA emulator (two emulated
# devices, NCCL carried over MPI): 2 ranks with backend=cuda reproduce the 1-rank backend=cuda
# loss curve and final weights within 1e-4 relative at ZeRO 0, 1, 2 and 3. Each rank runs on its
# own device ordinal (rank r on device r); gradients, the AdamW step and the weight exchange stay
# on the devices (after the first step a rank's host->device bytes are at most its token ids and
# labels plus 4 KiB a step); ZeRO-3 keeps at most 0.55x of the model's base-weight bytes per rank
# (shards in device memory, the host copy freed), and its checkpoint resumes on one rank; the
# planner's device weights, communication and peak per rank match the tracker's; paged
# 8-bit AdamW (a host step) over NCCL ZeRO-3 gives the 1-rank curve. An
# fp16 run whose first step overflows, at ZeRO 2, equals the host-step path over MPI.
# dist.backend=nccl with backend=cpu is refused.
# usage: nccl_loss_curve.sh WORKER SHARED_DIR (from the emulated build: QLFT_CUDA_EMULATE=ON)
source "$(dirname "$0")/common.sh"
export QLFT_EMU_DEVICE_COUNT=2
mpi+=(-x QLFT_EMU_DEVICE_COUNT -x QLFT_MPI_PLUGIN -x QLFT_CUDA_PLUGIN)
steps=4 mb=2 seq=64
common=(train.max_steps=$steps train.micro_batch=$mb data.seq_len=$seq lora.dropout=0.1
        optim.max_grad_norm=0.05 quant.type=nf4 backend=cuda)
"$worker" train "$model" "$data" "$work/ref.txt" "${common[@]}" train.accumulation=2
# The model's base-weight bytes: a 1-rank CPU run holds exactly them (a cuda run adds its
# device copies).
"$worker" train "$model" "$data" "$work/cpu.txt" "${common[@]}" backend=cpu train.accumulation=2 \
  "w.mem=$work/memcpu"
model_bytes=$(tr ' ' '\n' <"$work/memcpu.0" | grep -A1 -x weights_allocated | tail -n1)
field() { tr ' ' '\n' <"$1" | grep -A1 -x "$2" | tail -n1; }
# Per step and rank: ids and labels (int32, mb x seq each) plus 4 KiB.
bound=$(((steps - 1) * (2 * mb * seq * 4 + 4096)))
for stage in 0 1 2 3; do
  # ZeRO-3 also writes a checkpoint after step 2 (device state gathered to rank 0), resumed below.
  ckpt=()
  [ "$stage" = 3 ] && ckpt=(w.save_at=2 "w.ckpt=$work/ckpt.safetensors")
  timeout 200 "${mpi[@]}" "$worker" train "$model" "$data" "$work/z$stage.txt" "${common[@]}" \
    train.accumulation=1 dist.backend=nccl dist.zero_stage=$stage dist.timeout_s=60 \
    "w.mem=$work/mem$stage" "${ckpt[@]}"
  echo "NCCL, ZeRO-$stage:"
  "$worker" compare "$work/z$stage.txt" "$work/ref.txt" 1e-4
  for r in 0 1; do
    f="$work/mem$stage.$r"
    [ -f "$f" ] || { echo "rank $r wrote no figures"; exit 1; }
    echo "  $(cat "$f")"
    [ "$(field "$f" device)" = "$r" ] || { echo "rank $r is not on device $r"; exit 1; }
    # The planner's device figures for this rank (ZeRO-3: shards and gathered units on the
    # device; stages 1-3: the device exchange buffer): weights and communication within 2%, the
    # whole device peak within 10%.
    for pair in "device_weights_peak planned_device_weights 0.02" \
      "device_communication_peak planned_device_communication 0.02" \
      "device_live_peak planned_device_peak 0.10"; do
      set -- $pair
      got=$(field "$f" "$1") want=$(field "$f" "$2")
      awk -v a="$got" -v b="$want" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d;
        exit !(b == 0 ? a == 0 : d <= t * b) }' ||
        { echo "rank $r: $1 $got, planned $want (tolerance $3)"; exit 1; }
    done
    h2d=$(field "$f" h2d_later)
    [ "$h2d" -le "$bound" ] || { echo "rank $r moved $h2d B host->device after step 1 (bound $bound)"; exit 1; }
    if [ "$stage" = 3 ]; then
      wa=$(field "$f" weights_allocated)
      awk -v a="$wa" -v b="$model_bytes" 'BEGIN { exit !(b > 0 && a <= 0.55 * b) }' ||
        { echo "rank $r keeps $wa B of weights, more than 0.55 x $model_bytes"; exit 1; }
      echo "  rank $r weights: $wa of $model_bytes = $(awk -v a="$wa" -v b="$model_bytes" 'BEGIN { printf "%.3f", a / b }')x"
    fi
  done
done
# The ZeRO-3 NCCL checkpoint resumes on one rank (backend=cuda, the same effective batch) at
# step 3 with the 2-rank run's next steps within 1e-4.
[ -f "$work/ckpt.safetensors" ] || { echo "no checkpoint written"; exit 1; }
"$worker" train "$model" "$data" "$work/resume1.txt" "${common[@]}" train.accumulation=2 \
  "w.resume=$work/ckpt.safetensors"
[ "$(head -n1 "$work/resume1.txt" | cut -d' ' -f1)" = 3 ] || { echo "did not resume at step 3"; exit 1; }
echo "NCCL ZeRO-3 checkpoint resumed on 1 rank:"
"$worker" compare "$work/resume1.txt" "$work/z3.txt" 1e-4 3
# paged 8-bit AdamW steps on the host (gradients out per pass, reduced over the MPI side) while
# ZeRO-3's shards and gathers stay on the devices: the 1-rank curve within 1e-4.
"$worker" train "$model" "$data" "$work/ref8.txt" "${common[@]}" train.accumulation=2 \
  optim.name=paged_adamw8bit
timeout 200 "${mpi[@]}" "$worker" train "$model" "$data" "$work/z8.txt" "${common[@]}" \
  train.accumulation=1 optim.name=paged_adamw8bit dist.backend=nccl dist.zero_stage=3 \
  dist.timeout_s=60
echo "NCCL ZeRO-3, paged 8-bit AdamW (host step):"
"$worker" compare "$work/z8.txt" "$work/ref8.txt" 1e-4
# fp16 whose first step overflows (skipped on both ranks: the device inf check is agreed over
# MPI), ZeRO-2: the host-step path over MPI within 1e-6 (2 ranks each; the device AdamW computes
# the host one's bits, CudaOptim.AdamWTorchEqualsHostOptimizer: an ulp of v between them grew
# through fp16's roundings to 2e-6 in the step-4 grad norm). (Against one rank
# with accumulation 2, fp16 rounding makes both 2-rank paths drift by ~1e-4 by step 4.)
fp16=(train.max_steps=4 train.micro_batch=$mb data.seq_len=$seq train.precision=fp16
      quant.type=nf4 backend=cuda scaler.init_scale=1e12 scaler.backoff_factor=1e-6
      train.accumulation=1 dist.zero_stage=2 dist.timeout_s=60)
for b in mpi nccl; do
  timeout 200 "${mpi[@]}" "$worker" train "$model" "$data" "$work/fp16_$b.txt" "${fp16[@]}" \
    dist.backend=$b
  grep -q '^1 .* inf$' "$work/fp16_$b.txt" || { echo "$b: step 1 was expected to overflow"; exit 1; }
done
echo "NCCL fp16, ZeRO-2, against MPI:"
"$worker" compare "$work/fp16_nccl.txt" "$work/fp16_mpi.txt" 1e-6
# NCCL exchanges device memory: with the CPU backend it is refused before any rank waits.
if "$worker" train "$model" "$data" "$work/bad.txt" "${common[@]}" backend=cpu \
  dist.backend=nccl "w.result=$work/bad"; then
  echo "FAIL: dist.backend=nccl with backend=cpu trained"; exit 1
fi
grep -q "dist.backend=nccl .*needs backend=cuda" "$work/bad.0" ||
  { cat "$work/bad.0"; echo "FAIL: no clear refusal"; exit 1; }
echo "dist.backend=nccl with backend=cpu: refused"
