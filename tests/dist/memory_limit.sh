#!/usr/bin/env bash
# Issue 21, done-when 2 and 4: a SmolLM2-135M fine-tune whose single-rank plan is over
# memory.limit is refused before anything loads (the planner's figures per category on
# stderr), and the same run on 4 ZeRO-3 ranks under the same limit fits it and trains to the
# 1-rank loss curve (metrics.jsonl, within 1e-4); the planner's per-rank peak is within 10% of
# the tracker's measured peak of rank 0, and its predicted peak RSS near rank 0's peak RSS. usage: memory_limit.sh QLFT_FINETUNE SHARED_DIR
source "$(dirname "$0")/common.sh"
cli=$worker
smol="$shared/models/smollm2-135m-instruct-q4_1.gguf"
[ -f "$smol" ] || qlft_skip shared-missing "$smol not found"
head -c 120000 "$text" >"$work/smol.txt"
args=(--model "$smol" --data "$work/smol.txt" --quant.type keep --threads 1 --seed 5
      --data.seq_len 128 --train.micro_batch 1 --train.max_steps 2 --train.grad_checkpointing 1)
limit=160MiB
# The reference: one rank, no limit, effective batch 4.
"$cli" train "${args[@]}" --train.accumulation 4 --train.output_dir "$work/ref" \
  >"$work/ref.out" 2>"$work/ref.err" || { cat "$work/ref.err"; exit 1; }
# One rank under the limit: refused by the planner, nothing loaded, nothing trained.
set +e
"$cli" train "${args[@]}" --train.accumulation 4 --memory.limit "$limit" \
  --train.output_dir "$work/one" >"$work/one.out" 2>"$work/one.err"
rc=$?
set -e
[ "$rc" != 0 ] || { echo "FAIL: 1 rank under memory.limit $limit was not refused"; exit 1; }
grep -q "the memory planner predicts a peak of .* over memory.limit $limit; nothing was loaded" \
  "$work/one.err" && grep -q "^weights " "$work/one.err" && grep -q "^activations " "$work/one.err" ||
  { echo "FAIL: the refusal does not give the planner's figures:"; cat "$work/one.err"; exit 1; }
! grep -q "loaded .* model" "$work/one.err" "$work/one.out" ||
  { echo "FAIL: the model was loaded before the refusal"; exit 1; }
[ ! -s "$work/one/metrics.jsonl" ] || { echo "FAIL: the refused run trained"; exit 1; }
echo "1 rank under memory.limit $limit: refused before loading"
cat "$work/one.err"
# Four ZeRO-3 ranks under the same limit (each rank's tracker enforces it on every allocation).
timeout 240 "${mpi4[@]}" "$cli" train "${args[@]}" --train.accumulation 1 --memory.limit "$limit" \
  --dist.backend mpi --dist.zero_stage 3 --dist.timeout_s 120 --train.output_dir "$work/four" \
  >"$work/four.out" 2>"$work/four.err" || { cat "$work/four.err"; exit 1; }
loss() { sed -n 's/.*"loss": \([0-9.e+-]*\).*/\1/p' "$1"; }
paste <(loss "$work/ref/metrics.jsonl") <(loss "$work/four/metrics.jsonl") |
  awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4 * $1 || NF != 2) bad = 1; print }
       END { exit bad || NR != 2 }' || { echo "FAIL: 4 ranks left the 1-rank loss curve"; exit 1; }
echo "4 ZeRO-3 ranks under memory.limit $limit: trained, same losses"
# The planner's per-rank peak against rank 0's tracker ("total peak  predicted  measured").
grep "^total peak" "$work/four.out" | awk '{
  p = $3; if ($4 == "GiB") p *= 1024; m = $5; if ($6 == "GiB") m *= 1024;
  r = p / m; printf "rank 0: predicted %.1f MiB, measured %.1f MiB (%.3fx)\n", p, m, r;
  exit !(r >= 0.9 && r <= 1.1) }' || { echo "FAIL: the plan is not within 10% of the tracker"; exit 1; }
# The same against the OS: rank 0's predicted peak resident set (the planner's total, what the
# process held untracked when it planned, and what the first step maps beyond that) against
# its peak RSS ("peak RSS  predicted  measured"). 0.956x on the Sapphire Rapids guest of
# session 12; held to 15% here because the library pages a step touches differ by CPU (another
# ISA's kernels), while leaving out the untracked base (~40 MiB) or the first step's share (12
# MiB) misses by more.
grep "^peak RSS" "$work/four.out" | awk '{
  p = $3; if ($4 == "GiB") p *= 1024; m = $5; if ($6 == "GiB") m *= 1024;
  r = p / m; printf "rank 0: predicted peak RSS %.1f MiB, measured %.1f MiB (%.3fx)\n", p, m, r;
  exit !(r >= 0.85 && r <= 1.15) }' ||
  { echo "FAIL: the predicted peak RSS is not within 15% of rank 0's"; cat "$work/four.out"; exit 1; }
