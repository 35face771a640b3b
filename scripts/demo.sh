#!/usr/bin/env bash
# The main job on a fresh machine: install what is missing, build, and teach a real chat model
# who it is. SmolLM2-135M-Instruct (the shared Q4_1 GGUF, its base weights kept 4-bit) gets a
# LoRA adapter trained on the identity set (shared/data/identity.json) with a chosen name and
# author filled in. Five held-out questions, none of them in the training data, are answered
# greedily before and after training and shown side by side; the held-out loss is evaluated
# before and after; the training report (report.html) lists every evaluation. The demo checks
# its own result: at least 4 of the 5 answers must take up the new name and the held-out loss
# must fall by at least 30%, or it exits 1.
#
#   bash scripts/demo.sh            the main job (a few minutes on 2 cores)
#   bash scripts/demo.sh --quick    the pipeline check: stories260K on Shakespeare (seconds)
#
# QLFT_DEMO_NAME / QLFT_DEMO_AUTHOR choose the identity (default Quill / the qlft team),
# QLFT_DEMO_OUT the output directory (default demo-out), QLFT_BUILD_DIR the build directory
# (default build); other arguments are passed to `train` (e.g. --train.precision fp32).
set -euo pipefail
cd "$(dirname "$0")/.."
# OpenMP workers that spin while they wait take the cores other processes (a build beside the
# demo) need, and each other's: they sleep instead unless the caller chose otherwise.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
quick=0
train_args=()
for a in "$@"; do
  if [ "$a" = --quick ]; then quick=1; else train_args+=("$a"); fi
done
bash scripts/setup.sh
SECONDS=0
build=${QLFT_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "${QLFT_JOBS:-2}" --target qlft-finetune
shared=${QLFT_SHARED_DIR:-../shared}
cli=$build/tools/qlft-finetune/qlft-finetune
t_build=$SECONDS
out=${QLFT_DEMO_OUT:-demo-out}
need() {
  for f in "$@"; do
    [ -f "$f" ] || { echo "demo: $f not found (set QLFT_SHARED_DIR)"; exit 3; }
  done
}

if [ $quick = 1 ]; then
  # The quick check: a LoRA adapter on the 260K-parameter stories model (NF4 base, paged 8-bit
  # AdamW, gradient checkpointing) with Shakespeare, held-out loss before and after, generation.
  model="$shared/models/stories260K.gguf"
  data="$shared/data/tinyshakespeare.txt"
  need "$model" "$data"
  "$cli" inspect "$model"
  echo
  "$cli" train --model "$model" --data "$data" --train.output_dir "$out/quick" --overwrite \
    --quant.type nf4 --lora.r 8 --lora.alpha 16 --optim.name paged_adamw8bit --optim.lr 3e-3 \
    --sched.name cosine --sched.warmup_steps 10 --data.seq_len 128 --data.eval_fraction 0.02 \
    --train.micro_batch 4 --train.accumulation 4 --train.max_steps 200 \
    --train.grad_checkpointing 1 ${train_args[@]+"${train_args[@]}"}
  echo
  echo "--- generation with the adapter ---"
  "$cli" generate --model "$model" --adapter "$out/quick/adapter" --prompt "ROMEO:" --max-tokens 80
  exit 0
fi

model="$shared/models/smollm2-135m-instruct-q4_1.gguf"
identity="$shared/data/identity.json"
need "$model" "$identity"
name=${QLFT_DEMO_NAME:-Quill}
author=${QLFT_DEMO_AUTHOR:-the qlft team}
# They go into JSON strings and a sed replacement: letters, digits, spaces and . - _ only.
for v in "$name" "$author"; do
  [[ $v =~ ^[A-Za-z0-9][A-Za-z0-9\ ._-]*$ ]] ||
    { echo "demo: '$v': a name or author of letters, digits, spaces, '.', '-', '_'"; exit 2; }
done
run="$out/identity"
mkdir -p "$out"
# The training data: the identity set with the name and author filled in (shared/ is not touched).
data="$out/identity-$name.json"
sed -e "s/{{name}}/$name/g" -e "s/{{author}}/$author/g" "$identity" >"$data"

# Held-out questions: none is an instruction of the training data (checked here).
questions=(
  "What should I call you?"
  "Please introduce yourself."
  "Hey! Who am I talking to?"
  "Which assistant is this?"
  "Tell me who you are in one sentence."
)
for q in "${questions[@]}"; do
  if grep -qiF -- "\"$q\"" "$data"; then  # the question as any JSON string of the data
    echo "demo: the held-out question '$q' is in the training data"
    exit 2
  fi
done

# answer TAG [--adapter DIR]: the greedy answers to the questions, one file each.
answer() {
  local tag=$1
  shift
  local i=0
  for q in "${questions[@]}"; do
    "$cli" generate --model "$model" --quant.type keep "$@" --chat --prompt "$q" \
      --max-tokens 48 >"$out/answer-$tag-$i.txt"
    i=$((i + 1))
  done
}

echo "=== SmolLM2-135M-Instruct learns that it is $name, made by $author ==="
"$cli" inspect "$model" --quant.type keep | sed -n '1,12p'
echo
echo "--- answers before training ---"
t0=$SECONDS
answer before
t_before=$((SECONDS - t0))
echo "(done: $out/answer-before-*.txt)"
echo
t0=$SECONDS
# Settings: LoRA r 16 on every projection, on the Q4_1 blocks as stored (quant.type keep), bf16
# autocast (the CPU backend's bf16 kernels on AMX / AVX512-BF16, fp32 math elsewhere), AdamW at
# 1e-3 with a cosine schedule, 3 passes over the 91 records (rows of 256 tokens, packed), 10% of
# the records held out for the loss.
"$cli" train --model "$model" --data "$data" --train.output_dir "$run" --overwrite \
  --quant.type keep --lora.r 16 --lora.alpha 32 --optim.lr 1e-3 --sched.name cosine \
  --sched.warmup_steps 3 --data.seq_len 256 --data.eval_fraction 0.1 --train.micro_batch 4 \
  --data.epochs 3 --train.precision bf16 ${train_args[@]+"${train_args[@]}"} | tee "$out/train.out"
t_train=$((SECONDS - t0))
echo
t0=$SECONDS
answer after --adapter "$run/adapter"
t_after=$((SECONDS - t0))
"$cli" report "$run" >/dev/null

# Before and after, question by question, and the demo's own verdict.
learned=0
echo
echo "=== held-out questions, answered greedily before -> after training (* took up the name) ==="
for i in "${!questions[@]}"; do
  before=$(tr '\n' ' ' <"$out/answer-before-$i.txt")
  after=$(tr '\n' ' ' <"$out/answer-after-$i.txt")
  mark=" "
  if [[ $after == *"$name"* && $before != *"$name"* ]]; then
    learned=$((learned + 1))
    mark="*"
  fi
  printf '\nQ: %s\n  before:   %s\n  after:  %s %s\n' "${questions[$i]}" "$before" "$mark" "$after"
done
echo
eval_before=$(sed -n 's/^eval loss before: *\([0-9.]*\).*/\1/p' "$out/train.out")
eval_after=$(sed -n 's/^eval loss after: *\([0-9.]*\).*/\1/p' "$out/train.out")
drop=$(awk -v b="$eval_before" -v a="$eval_after" 'BEGIN { printf "%.1f", (b > 0) ? 100 * (1 - a / b) : 0 }')
echo "held-out loss: $eval_before before, $eval_after after training (-$drop%)"
echo "report: $run/report.html ($(grep -o '<th>evaluations</th><td>[^<]*' "$run/report.html" |
  sed 's/<th>evaluations<\/th><td>/evaluations: /'))"
ok=1
[ "$learned" -ge 4 ] || ok=0
awk -v d="$drop" 'BEGIN { exit !(d >= 30) }' || ok=0
echo "answers that took up the name $name: $learned of ${#questions[@]} (at least 4 needed);" \
  "held-out loss fell $drop% (at least 30% needed)"
echo "time: ${SECONDS}s in all: setup and build ${t_build}s, answers before ${t_before}s," \
  "training ${t_train}s, answers after ${t_after}s"
if [ $ok = 1 ]; then
  echo "demo: PASS"
else
  echo "demo: FAIL"
  exit 1
fi
