#!/usr/bin/env bash
# Evaluation and generation called by one rank alone under ZeRO-3 (as the CLI and C API users
# call them: rank 0 only, e.g. from a progress callback): that rank reads the base weights from
# the model's file (Zero3Stream::rank_local) instead of gathering them, so it needs no peer. Rank
# 0 evaluates alone after step 2 (its peer goes on into step 3 and waits for it there) and after
# the last step, then generates alone; the eval losses and generated ids equal the 1-rank run's
# (within 1e-4 relative) and the training curve is undisturbed. Then rank 1 alone, and every
# rank at once, give the same figures.
source "$(dirname "$0")/common.sh"
common=(train.max_steps=4 train.micro_batch=2 quant.type=nf4 data.eval_fraction=0.1)
z3=(train.accumulation=1 dist.backend=mpi dist.zero_stage=3 dist.timeout_s=30)
"$worker" train "$model" "$data" "$work/one.txt" "${common[@]}" train.accumulation=2 \
  w.eval_rank=0 w.eval_at=2 w.gen=12
# A collective evaluation on one rank would wait out dist.timeout_s and fail.
check() {  # NAME EVAL_RANK GEN [SETTING...]: GEN 0 generates nothing
  local name=$1 f="$work/$1.txt" rank=$2 gen=$3
  shift 3
  local g=(); [ "$gen" = 0 ] || g=(w.gen=12)
  timeout 100 "${mpi[@]}" "$worker" train "$model" "$data" "$f" "${common[@]}" "${z3[@]}" \
    "w.eval_rank=$rank" w.eval_at=2 "${g[@]}" "$@"
  [ -s "$f.eval" ] || { echo "$name: no eval written"; exit 1; }
  echo "$name: eval $(tr '\n' ' ' <"$f.eval")"
  paste -d' ' "$f.eval" "$work/one.txt.eval" | awk -v n="$name" '
    { rel = ($2 - $5) / $5; if (rel < 0) rel = -rel
      if ($1 != $4 || $3 != $6 || rel > 1e-4) { print n ": eval " $0; bad = 1 } }
    END { exit bad || NR != 2 }' || { echo "$name: eval differs from 1 rank"; exit 1; }
  if [ "$gen" != 0 ]; then
    [ -s "$f.gen" ] || { echo "$name: no generation written"; exit 1; }
    cmp -s "$f.gen" "$work/one.txt.gen" ||
      { echo "$name: generated $(cat "$f.gen") vs 1 rank $(cat "$work/one.txt.gen")"; exit 1; }
  fi
  "$worker" compare "$f" "$work/one.txt" 1e-4
}
check rank0 0 1
check rank1 1 1
check every -1 1
echo "rank 0 alone, rank 1 alone and every rank: same eval losses and generated ids as 1 rank"
# dist.zero3_shard_adapter: the others' LoRA tensors exist only on them, so evaluation gathers
# them as training does. Every rank evaluating gives the 1-rank losses; rank 0 alone fails
# within dist.timeout_s with an error saying every rank must call it (and trains no further).
check shard -1 0 dist.zero3_shard_adapter=true
if timeout 100 "${mpi[@]}" "$worker" train "$model" "$data" "$work/alone.txt" "${common[@]}" \
  "${z3[@]}" dist.zero3_shard_adapter=true dist.timeout_s=3 w.eval_rank=0 w.eval_at=2 \
  >"$work/alone.log" 2>&1; then
  echo "rank 0 evaluating alone with a sharded adapter did not fail"; exit 1
fi
grep -q "every rank must call it" "$work/alone.log" ||
  { cat "$work/alone.log"; echo "rank 0 alone: not the expected error"; exit 1; }
echo "sharded adapter: every rank evaluates as 1 rank; rank 0 alone fails saying every rank must call"
