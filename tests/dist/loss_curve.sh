#!/usr/bin/env bash
# 2 ranks reproduce the 1-rank loss curve (and gradient norms) of a stories260K fine-tune with
# the same effective batch, within 1e-4 relative, for ZeRO stages 0, 1 and 2. LoRA dropout and
# clipping are on, so the global micro-batch numbering and the sharded global norm are tested.
source "$(dirname "$0")/common.sh"
common=(train.max_steps=6 train.micro_batch=2 lora.dropout=0.1 optim.max_grad_norm=0.05
        quant.type=nf4)
"$worker" train "$model" "$data" "$work/ref.txt" "${common[@]}" train.accumulation=2
for stage in 0 1 2; do
  timeout 120 "${mpi[@]}" "$worker" train "$model" "$data" "$work/z$stage.txt" "${common[@]}" \
    train.accumulation=1 dist.backend=mpi dist.zero_stage=$stage dist.timeout_s=60
  echo "ZeRO-$stage:"
  "$worker" compare "$work/z$stage.txt" "$work/ref.txt" 1e-4
done
