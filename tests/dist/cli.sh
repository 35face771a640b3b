#!/usr/bin/env bash
# qlft-finetune train under mpirun: only rank 0 prints, writes metrics.jsonl (one record per
# step, not one per rank) and the adapters; the losses match a 1-rank CLI run with the same
# effective batch. usage: cli.sh QLFT_FINETUNE SHARED_DIR
source "$(dirname "$0")/common.sh"
cli=$worker
args=(--model "$model" --data "$data" --quant.type nf4 --threads 1 --seed 3 --data.seq_len 64
      --train.micro_batch 2 --train.max_steps 4 --lora.r 4 --optim.lr 2e-3)
"$cli" train "${args[@]}" --train.accumulation 2 --train.output_dir "$work/one" \
  >"$work/one.out" 2>"$work/one.err"
timeout 120 "${mpi[@]}" "$cli" train "${args[@]}" --train.accumulation 1 --dist.backend mpi \
  --dist.zero_stage 2 --train.output_dir "$work/two" >"$work/two.out" 2>"$work/two.err"
grep -q "distributed: 2 ranks" "$work/two.out"
[ "$(grep -c '"step"' "$work/two/metrics.jsonl")" = 4 ] || { cat "$work/two/metrics.jsonl"; exit 1; }
[ "$(grep -c '^step ' "$work/two.err")" = 4 ] || { echo "steps printed by several ranks:"; cat "$work/two.err"; exit 1; }
[ "$(grep -c 'eval loss before' "$work/two.out")" -le 1 ]
[ -f "$work/two/adapter/adapter_model.safetensors" ] && [ -f "$work/two/adapter.gguf" ] &&
  [ -f "$work/two/checkpoint.safetensors" ]
# Losses as the CLI printed them (metrics.jsonl, 6 decimals): same curve within 1e-4.
loss() { sed -n 's/.*"loss": \([0-9.e+-]*\).*/\1/p' "$1"; }
paste <(loss "$work/one/metrics.jsonl") <(loss "$work/two/metrics.jsonl") |
  awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4 * $1 || NF != 2) bad = 1; print }
       END { exit bad }'
echo "CLI under mpirun: rank 0 alone wrote, same losses"
# ZeRO-3 with an eval split: every rank joins the evaluations (they gather weights), rank 0
# prints them; the run ends well within dist.timeout_s (a rank evaluating alone would wait it out).
timeout 120 "${mpi[@]}" "$cli" train "${args[@]}" --train.accumulation 1 --dist.backend mpi \
  --dist.zero_stage 3 --dist.timeout_s 60 --data.eval_fraction 0.1 \
  --train.output_dir "$work/three" >"$work/three.out" 2>"$work/three.err" ||
  { cat "$work/three.err"; exit 1; }
grep -q "eval loss after" "$work/three.out" || { echo "ZeRO-3: no eval after"; cat "$work/three.out"; exit 1; }
[ "$(grep -c 'eval loss after' "$work/three.out")" = 1 ]
[ -f "$work/three/adapter/adapter_model.safetensors" ]
echo "CLI under mpirun with ZeRO-3: every rank evaluated, rank 0 printed"
# The same with the LoRA tensors sharded (dist.zero3_shard_adapter): every rank joins the
# evaluations and the adapter writes (gathered on rank 0), which hold the same bytes as the
# replicated run's adapter files.
timeout 120 "${mpi[@]}" "$cli" train "${args[@]}" --train.accumulation 1 --dist.backend mpi \
  --dist.zero_stage 3 --dist.timeout_s 60 --data.eval_fraction 0.1 \
  --dist.zero3_shard_adapter true --train.output_dir "$work/shard" >"$work/shard.out" \
  2>"$work/shard.err" || { cat "$work/shard.err"; exit 1; }
[ "$(grep -c 'eval loss after' "$work/shard.out")" = 1 ]
cmp "$work/shard/adapter/adapter_model.safetensors" "$work/three/adapter/adapter_model.safetensors"
cmp "$work/shard/adapter.gguf" "$work/three/adapter.gguf"
echo "CLI under mpirun with a sharded adapter: the same adapter files as ZeRO-3 without it"
# `eval` and `generate --adapter` under mpirun with ZeRO-3: rank 0 alone prints (it reads the
# weights it lacks from the model file), the same figures and text as one process.
ev=(eval --model "$model" --data "$data" --adapter "$work/three/adapter" --quant.type nf4
    --threads 1 --data.seq_len 64 --data.eval_fraction 0.1)
"$cli" "${ev[@]}" >"$work/eval1.out" 2>&1 || { cat "$work/eval1.out"; exit 1; }
timeout 120 "${mpi[@]}" "$cli" "${ev[@]}" --dist.backend mpi --dist.zero_stage 3 \
  --dist.timeout_s 60 >"$work/eval2.out" 2>"$work/eval2.err" || { cat "$work/eval2.err"; exit 1; }
[ "$(grep -c '^eval loss' "$work/eval2.out")" = 1 ] || { echo "eval printed by several ranks:"; cat "$work/eval2.out"; exit 1; }
diff <(grep '^eval loss' "$work/eval1.out") <(grep '^eval loss' "$work/eval2.out")
gen=(generate --model "$model" --adapter "$work/three/adapter" --quant.type nf4 --threads 1
     --prompt "Once upon a time" --max-tokens 16)
"$cli" "${gen[@]}" >"$work/gen1.out" 2>/dev/null
grep -q '[a-z]' "$work/gen1.out" || { echo "nothing generated"; exit 1; }
timeout 120 "${mpi[@]}" "$cli" "${gen[@]}" --dist.backend mpi --dist.zero_stage 3 \
  --dist.timeout_s 60 >"$work/gen2.out" 2>"$work/gen2.err" || { cat "$work/gen2.err"; exit 1; }
# Rank 1 prints nothing: the output is rank 0's alone, equal to one process's.
cmp "$work/gen1.out" "$work/gen2.out" || { echo "generated:"; cat "$work/gen1.out" "$work/gen2.out"; exit 1; }
echo "eval and generate under mpirun with ZeRO-3: rank 0 alone printed, as one process"
