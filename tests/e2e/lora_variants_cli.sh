#!/usr/bin/env bash
# DoRA and a PiSSA start through the CLI (issue 49): train exits 0, the PEFT adapter carries what
# PEFT reads (use_dora and one lora_magnitude_vector per adapted projection; a PiSSA start as the
# converted rank-2r adapter, r and lora_alpha doubled), a DoRA run says it wrote no llama.cpp
# adapter (that format has no magnitude) and writes none, a PiSSA run writes one, and `generate
# --adapter` reads each back (the DoRA adapter through use_dora).
# usage: lora_variants_cli.sh QLFT_FINETUNE SHARED_DIR
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/e2e_common.sh"

run() {  # run NAME ARGS...: a 3-step fine-tune into NAME/
  local name=$1
  shift
  "$cli" train --model "$model" --data small.txt --data.seq_len 64 --threads 2 --seed 3 \
    --lora.r 4 --lora.alpha 8 --train.max_steps 3 --train.output_dir "$name" "$@" \
    >"$name.out" 2>"$name.err"
}

st=0
run dora --lora.use_dora true || st=$?
check "DoRA train exits 0" $st dora.err
check "DoRA adapter_config says use_dora" "$(grep -c '"use_dora": true' dora/adapter/adapter_config.json | grep -qx 1; echo $?)"
# 7 projections x stories260K's 5 layers, each with its magnitude (the safetensors header's names)
n=$(grep -ao 'lora_magnitude_vector' dora/adapter/adapter_model.safetensors | wc -l)
check "one magnitude per adapted projection (35, got $n)" "$([ "$n" = 35 ]; echo $?)"
check "no llama.cpp adapter for DoRA, and the run says so" \
  "$([ ! -e dora/adapter.gguf ] && grep -q 'no llama.cpp adapter' dora.out; echo $?)" dora.out
st=0
"$cli" generate --model "$model" --adapter dora/adapter --prompt "Once upon" \
  --generate.max_tokens 8 >dora.gen 2>&1 || st=$?
check "generate reads the DoRA adapter" $st dora.gen

st=0
run pissa --lora.init pissa || st=$?
check "PiSSA train exits 0" $st pissa.err
check "PiSSA exports PEFT's converted rank-2r adapter (r 8, lora_alpha 16)" \
  "$(grep -q '"r": 8' pissa/adapter/adapter_config.json && grep -q '"lora_alpha": 16' pissa/adapter/adapter_config.json; echo $?)" pissa/adapter/adapter_config.json
check "PiSSA writes the llama.cpp adapter" "$([ -s pissa/adapter.gguf ]; echo $?)"
st=0
"$cli" generate --model "$model" --adapter pissa/adapter --prompt "Once upon" \
  --generate.max_tokens 8 >pissa.gen 2>&1 || st=$?
check "generate reads the PiSSA export" $st pissa.gen
[ "$fails" = 0 ]
