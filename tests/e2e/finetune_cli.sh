#!/usr/bin/env bash
# The reference fine-tune through the CLI: stories260K on Shakespeare, NF4 base, r=8, bf16,
# paged 8-bit AdamW, checkpointing every layer, micro-batch 4 x accumulation 4, 200 steps. The
# held-out loss must fall by at least 30%, the adapter files and metrics must be written, and
# generation with the adapter must produce text.
# usage: finetune_cli.sh QLFT_FINETUNE SHARED_DIR
set -euo pipefail
cli=$1
shared=$2
model="$shared/models/stories260K.gguf"
text="$shared/data/tinyshakespeare.txt"
source "$(dirname "${BASH_SOURCE[0]}")/../support/skip.sh"
[ -f "$model" ] && [ -f "$text" ] || qlft_skip shared-missing "$model or $text not found"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$cli" train --model "$model" --data "$text" --train.output_dir "$work/out" --threads 1 \
  --quant.type nf4 --lora.r 8 --lora.alpha 16 --train.precision bf16 \
  --optim.name paged_adamw8bit --optim.lr 5e-3 --sched.name cosine --sched.warmup_steps 10 \
  --train.grad_checkpointing 1 --train.micro_batch 4 --train.accumulation 4 \
  --train.max_steps 200 --data.seq_len 64 --data.eval_fraction 0.02 >"$work/stdout" 2>"$work/stderr"
cat "$work/stdout"
before=$(sed -n 's/^eval loss before: \([0-9.]*\).*/\1/p' "$work/stdout")
after=$(sed -n 's/^eval loss after: *\([0-9.]*\).*/\1/p' "$work/stdout")
[ -n "$before" ] && [ -n "$after" ] || { echo "no eval losses printed"; cat "$work/stderr"; exit 1; }
awk -v b="$before" -v a="$after" 'BEGIN { if (a > 0.7 * b) { print "loss fell only from " b " to " a; exit 1 } }'
# One record per step (with a "loss"), and the evaluations before and after training.
[ "$(grep -c '"loss": ' "$work/out/metrics.jsonl")" = 200 ] || { echo "metrics.jsonl incomplete"; exit 1; }
[ "$(grep -c '"eval_loss": ' "$work/out/metrics.jsonl")" = 2 ] || { echo "metrics.jsonl: not 2 evaluations"; exit 1; }
for f in adapter/adapter_model.safetensors adapter/adapter_config.json adapter.gguf checkpoint.safetensors; do
  [ -s "$work/out/$f" ] || { echo "missing $f"; exit 1; }
done
gen=$("$cli" generate --model "$model" --adapter "$work/out/adapter" --prompt "ROMEO:" \
  --max-tokens 40 --threads 1)
[ -n "$gen" ] || { echo "no generated text"; exit 1; }
echo "generated: $gen"
echo "held-out loss $before -> $after"
