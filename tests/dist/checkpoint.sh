#!/usr/bin/env bash
# A checkpoint written by 2 ranks (ZeRO-1, ZeRO-2 with sharded gradients and ZeRO-3: optimizer
# state gathered to rank 0) resumes on 2 ranks with the identical next steps, and on 1 rank (same
# effective batch) within 1e-4 relative.
source "$(dirname "$0")/common.sh"
for stage in 1 2 3; do
  echo "ZeRO-$stage:"
  common=(train.max_steps=5 train.micro_batch=2 optim.name=adamw quant.type=nf4)
  two=("${common[@]}" train.accumulation=1 dist.backend=mpi dist.zero_stage=$stage dist.timeout_s=60)
  rm -f "$work/ckpt.safetensors" "$work/full.txt" "$work/resume2.txt" "$work/resume1.txt"
  timeout 120 "${mpi[@]}" "$worker" train "$model" "$data" "$work/full.txt" "${two[@]}" \
    w.save_at=2 "w.ckpt=$work/ckpt.safetensors"
  [ -f "$work/ckpt.safetensors" ] || { echo "no checkpoint written"; exit 1; }
  timeout 120 "${mpi[@]}" "$worker" train "$model" "$data" "$work/resume2.txt" "${two[@]}" \
    "w.resume=$work/ckpt.safetensors"
  "$worker" train "$model" "$data" "$work/resume1.txt" "${common[@]}" train.accumulation=2 \
    "w.resume=$work/ckpt.safetensors"
  # The resumed curves start after the checkpoint (else the comparison would be vacuous).
  for f in resume2 resume1; do
    [ "$(head -n1 "$work/$f.txt" | cut -d' ' -f1)" = 3 ] || { echo "$f did not resume at step 3"; exit 1; }
  done
  echo "resumed on 2 ranks:"
  "$worker" compare "$work/resume2.txt" "$work/full.txt" 0 3
  echo "resumed on 1 rank:"
  "$worker" compare "$work/resume1.txt" "$work/full.txt" 1e-4 3
done
