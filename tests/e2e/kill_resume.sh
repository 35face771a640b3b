#!/usr/bin/env bash
# SIGKILL the CLI at a random step, --resume, and require the same adapter bytes as an
# uninterrupted run (fp32, fixed seed, one thread). Every checkpoint seen must load.
# usage: kill_resume.sh QLFT_FINETUNE SHARED_DIR
set -euo pipefail
cli=$1
shared=$2
model="$shared/models/stories260K.gguf"
text="$shared/data/tinyshakespeare.txt"
source "$(dirname "${BASH_SOURCE[0]}")/../support/skip.sh"
[ -f "$model" ] && [ -f "$text" ] || qlft_skip shared-missing "$model or $text not found"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args=(--model "$model" --data "$text" --quant.type keep --threads 1 --seed 11
      --data.seq_len 64 --train.micro_batch 2 --train.max_steps 14 --train.save_every 1
      --lora.r 4 --lora.dropout 0.05 --optim.name adamw --optim.lr 1e-3)

"$cli" train "${args[@]}" --train.output_dir "$work/straight" >/dev/null 2>"$work/straight.log"

kill_at=$((2 + RANDOM % 10))
"$cli" train "${args[@]}" --train.output_dir "$work/killed" >/dev/null 2>"$work/killed.log" &
pid=$!
while kill -0 "$pid" 2>/dev/null; do
  n=$(grep -c '"step"' "$work/killed/metrics.jsonl" 2>/dev/null || true)
  if [ "${n:-0}" -ge "$kill_at" ]; then kill -9 "$pid"; break; fi
  sleep 0.01
done
wait "$pid" 2>/dev/null || true
echo "killed at step >= $kill_at"
"$cli" train "${args[@]}" --train.output_dir "$work/killed" --resume >/dev/null 2>"$work/resume.log"
grep -q "resumed from" "$work/resume.log" || { echo "did not resume:"; cat "$work/resume.log"; exit 1; }

cmp "$work/straight/adapter/adapter_model.safetensors" "$work/killed/adapter/adapter_model.safetensors"
cmp "$work/straight/adapter.gguf" "$work/killed/adapter.gguf"
echo "identical adapters after SIGKILL + --resume"
