#!/usr/bin/env bash
# The main job on a fresh machine: install what is missing, build, fine-tune a LoRA adapter on
# the real stories260K model (NF4 base, paged 8-bit AdamW, gradient checkpointing) with
# Shakespeare, show the held-out loss before and after, and generate with the adapter.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "${QLFT_JOBS:-2}" --target qlft-finetune
shared=${QLFT_SHARED_DIR:-../shared}
model="$shared/models/stories260K.gguf"
data="$shared/data/tinyshakespeare.txt"
for f in "$model" "$data"; do
  [ -f "$f" ] || { echo "demo: $f not found (set QLFT_SHARED_DIR)"; exit 3; }
done
cli=build/tools/qlft-finetune/qlft-finetune
out=${QLFT_DEMO_OUT:-demo-out}

"$cli" inspect "$model"
echo
"$cli" train --model "$model" --data "$data" --train.output_dir "$out" \
  --quant.type nf4 --lora.r 8 --lora.alpha 16 --optim.name paged_adamw8bit --optim.lr 3e-3 \
  --sched.name cosine --sched.warmup_steps 10 --data.seq_len 128 --data.eval_fraction 0.02 \
  --train.micro_batch 4 --train.accumulation 4 --train.max_steps 200 \
  --train.grad_checkpointing 1 "$@"
echo
echo "--- generation with the adapter ---"
"$cli" generate --model "$model" --adapter "$out/adapter" --prompt "ROMEO:" --max-tokens 80
