#!/usr/bin/env bash
# train.micro_batch=auto under mpirun, the ranks with different memory.limit (an MPMD launch: one
# argument list per rank): both ranks must train with the same micro-batch, the one that fits
# the tighter rank (what a run where both ranks have the tighter limit picks), while a run where
# both have the looser limit picks a larger one (so a rank deciding alone would differ). Also:
# the planner's per-rank prediction (ZeRO-1 optimizer share, exchange buffer) equals the
# tracker's measurement on rank 0. usage: autotune.sh QLFT_FINETUNE SHARED_DIR
source "$(dirname "$0")/common.sh"
cli=$worker
tight=8M loose=64M
args=(train --model "$model" --data "$data" --quant.type nf4 --threads 1 --seed 3
      --data.seq_len 64 --train.micro_batch auto --train.max_steps 2 --lora.r 4
      --dist.backend mpi --dist.zero_stage 1)
mpmd=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader --tag-output
      -x OMP_NUM_THREADS -x OMP_WAIT_POLICY)
# run NAME LIMIT_RANK0 LIMIT_RANK1: prints "rank micro_batch" per rank.
run() {
  local out="$work/$1"
  timeout 120 "${mpmd[@]}" -np 1 "$cli" "${args[@]}" --memory.limit "$2" --train.output_dir "$out" \
    : -np 1 "$cli" "${args[@]}" --memory.limit "$3" --train.output_dir "$out" \
    >"$out.log" 2>&1 || { echo "run $1 failed:"; cat "$out.log"; exit 1; }
  sed -n 's/^\[1,\([01]\)\]<stdout>:micro_batch \([0-9]*\) x accumulation.*/\1 \2/p' "$out.log" |
    sort
}
pick() { # the micro-batch both ranks report (fails unless there are two equal ones)
  local lines
  lines=$(cat)
  [ "$(echo "$lines" | wc -l)" = 2 ] || { echo "expected two ranks' batch shapes: $lines"; exit 1; }
  [ "$(echo "$lines" | awk '{print $2}' | sort -u | wc -l)" = 1 ] ||
    { echo "ranks disagree on the micro-batch: $lines"; exit 1; }
  echo "$lines" | awk 'NR == 1 {print $2}'
}
sym=$(run sym "$tight" "$tight" | pick)
big=$(run big "$loose" "$loose" | pick)
mixed=$(run mixed "$loose" "$tight" | pick)
rev=$(run rev "$tight" "$loose" | pick)
echo "micro-batch: both $tight -> $sym, both $loose -> $big, $loose/$tight -> $mixed, $tight/$loose -> $rev"
[ "$big" -gt "$sym" ] || { echo "the looser limit should allow a larger micro-batch"; exit 1; }
[ "$mixed" = "$sym" ] && [ "$rev" = "$sym" ] ||
  { echo "the ranks did not settle on the tighter rank's micro-batch"; exit 1; }
# Rank 0 wrote the one cache, keyed by both ranks' limits.
grep -q 'ranks=2' "$work/mixed/autotune.json" && grep -q 'zero_stage=1' "$work/mixed/autotune.json"
grep -q 'memory.limit=67108864,8388608' "$work/mixed/autotune.json"
# The planner under ZeRO-1 with 2 ranks: predicted = measured for the sharded categories.
for cat in optimizer communication; do
  line=$(grep "^\[1,0\]<stdout>:$cat " "$work/mixed.log") || { echo "no $cat line"; exit 1; }
  echo "$line" | awk -v c="$cat" '{ if ($2 $3 != $4 $5) { print c ": predicted " $2 $3 " measured " $4 $5; exit 1 } }'
done
echo "auto-tune under mpirun: both ranks train with the tighter rank's micro-batch"
