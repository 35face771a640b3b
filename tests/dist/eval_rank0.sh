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
check() {  # NAME EVAL_RANK
  local f="$work/$1.txt"
  timeout 100 "${mpi[@]}" "$worker" train "$model" "$data" "$f" "${common[@]}" "${z3[@]}" \
    "w.eval_rank=$2" w.eval_at=2 w.gen=12
  [ -s "$f.eval" ] && [ -s "$f.gen" ] || { echo "$1: no eval or generation written"; exit 1; }
  echo "$1: eval $(tr '\n' ' ' <"$f.eval"); generated $(cat "$f.gen")"
  paste -d' ' "$f.eval" "$work/one.txt.eval" | awk -v n="$1" '
    { rel = ($2 - $5) / $5; if (rel < 0) rel = -rel
      if ($1 != $4 || $3 != $6 || rel > 1e-4) { print n ": eval " $0; bad = 1 } }
    END { exit bad || NR != 2 }' || { echo "$1: eval differs from 1 rank"; exit 1; }
  cmp -s "$f.gen" "$work/one.txt.gen" ||
    { echo "$1: generated $(cat "$f.gen") vs 1 rank $(cat "$work/one.txt.gen")"; exit 1; }
  "$worker" compare "$f" "$work/one.txt" 1e-4
}
check rank0 0
check rank1 1
check every -1
echo "rank 0 alone, rank 1 alone and every rank: same eval losses and generated ids as 1 rank"
