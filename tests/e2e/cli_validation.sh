#!/usr/bin/env bash
# What the CLI checks before it works, and what it says (issue 44, items 9, 12, 13, 14):
#   SIGHUP (a closed terminal) checkpoints and exits 130 like SIGTERM, with save_every 0;
#   `version extra` / `config-doc extra` are refused (exit 2);
#   a bad offload.dir, a missing --adapter and a lora.init_from that is no adapter are refused
#   before the model and the data load (no "data:" line, exit 3);
#   lora.alpha 24.5 is reported as 24.5; an absurd elapsed_s shows as years, not 300 digits;
#   a chat record without an assistant turn fails with its line and reason under on_error=fail,
#   and "no usable training records" says why under skip; CRLF .txt files train on the same
#   tokens as LF ones; `inspect` prints the family, its HF class and its deltas from Llama.
# Each check is a defect the issue found. usage: cli_validation.sh QLFT_FINETUNE SHARED_DIR
set -uo pipefail  # not -e: every check runs and reports
source "$(dirname "${BASH_SOURCE[0]}")/e2e_common.sh"
args=(--model "$model" --quant.type keep --threads 1 --seed 5 --data.seq_len 64
      --train.micro_batch 2 --lora.r 4)
r() { local log=$1; shift; "$cli" "$@" >"$log.out" 2>"$log.err" && rc=0 || rc=$?; }

# --- item 9: SIGHUP ------------------------------------------------------------------------------
"$cli" train "${args[@]}" --data small.txt --train.max_steps 100000 --train.output_dir hup \
  >hup.out 2>hup.err &
pid=$!
for _ in $(seq 1 3000); do  # up to 30 s for the first step
  n=$(grep -c '"loss"' hup/metrics.jsonl 2>/dev/null || true)
  [ "${n:-0}" -ge 2 ] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.01
done
kill -HUP "$pid"
wait "$pid" && rc=0 || rc=$?
[ $rc = 130 ] && [ -s hup/checkpoint.safetensors ] && grep -q "cancelled; checkpoint written" hup.err
check "SIGHUP saves a checkpoint and exits 130 (save_every 0; rc $rc)" $? hup.err
r hup_resume train "${args[@]}" --data small.txt --train.max_steps 3 --train.output_dir hup \
  --resume
grep -q "resumed from" hup_resume.err
check "the run stopped by SIGHUP resumes" $? hup_resume.err

# --- item 12: stray words after commands that take none ---------------------------------------
r ver version extra
[ $rc = 2 ] && grep -q "version takes no arguments, got 'extra'" ver.err && [ ! -s ver.out ]
check "version extra refused (exit 2)" $? ver.err
r cdoc config-doc extra
[ $rc = 2 ] && grep -q "config-doc takes no arguments" cdoc.err && [ ! -s cdoc.out ]
check "config-doc extra refused (exit 2)" $? cdoc.err
r ver_ok version
[ $rc = 0 ] && [ -s ver_ok.out ]
check "version still prints" $? ver_ok.err

# --- item 13: what a run needs is checked before the model and data load ----------------------
r offl train "${args[@]}" --data small.txt --train.max_steps 1 --train.output_dir o_offl \
  --optim.name paged_adamw8bit --offload.dir "$work/no-such-dir"
[ $rc = 3 ] && grep -q "offload.dir '$work/no-such-dir' is not a directory" offl.err &&
  ! grep -q "^data:" offl.err
check "a missing offload.dir is refused before the data loads (exit 3)" $? offl.err
r adp eval --model "$model" --data small.txt --adapter "$work/no-adapter" --threads 1 \
  --data.seq_len 64 --data.eval_fraction 0.1
[ $rc = 3 ] && grep -q "no-adapter" adp.err && ! grep -q "^data:" adp.err
check "a missing --adapter is refused before the data loads (exit 3)" $? adp.err
mkdir -p empty_adapter
# The model named does not exist either: the adapter is what is checked first.
r adp2 generate --model "$work/absent.gguf" --adapter "$work/empty_adapter" --prompt Once
[ $rc = 3 ] && grep -q "empty_adapter/adapter_config.json" adp2.err && ! grep -q absent.gguf adp2.err
check "generate --adapter without adapter_config.json is refused before the model (exit 3)" $? \
  adp2.err

# --- item 14: messages --------------------------------------------------------------------------
r alpha train "${args[@]}" --data small.txt --train.max_steps 2 --train.output_dir o_alpha \
  --lora.alpha 24.5
[ $rc = 0 ] && grep -q '"lora_alpha": 24.5' o_alpha/metrics.jsonl &&
  grep -q "alpha 24.5," o_alpha/report.html && ! grep -q "alpha 0," o_alpha/report.html
check "lora.alpha 24.5 is logged and reported as 24.5" $? alpha.err

mkdir -p farrun
printf '%s\n' '{"step": 1, "loss": 2.5, "elapsed_s": 1e300, "run": {"total_steps": 10}}' \
  >farrun/metrics.jsonl
r far report farrun
[ $rc = 0 ] && grep -q "years" farrun/report.html && ! grep -qE '[0-9]{40}' farrun/report.html
check "elapsed_s 1e300 shows in years, not as a 300-digit time" $? far.err

printf '%s\n' '{"messages": [{"role": "user", "content": "hello"}]}' >noasst.jsonl
r noasst train "${args[@]}" --data noasst.jsonl --train.max_steps 1 --train.output_dir o_noasst
[ $rc = 4 ] && grep -q "noasst.jsonl:1: no token to train on" noasst.err
check "a chat record without an assistant turn names its line and reason (exit 4)" $? noasst.err
r noasst2 train "${args[@]}" --data noasst.jsonl --train.max_steps 1 --train.output_dir o_noasst2 \
  --data.on_error skip
[ $rc = 4 ] && grep -q "no usable training records (1 read, 1 dropped: 1 no_trained_tokens" \
  noasst2.err && grep -q "noasst.jsonl:1" noasst2.err
check "no usable training records says why (on_error=skip)" $? noasst2.err

sed 's/$/\r/' small.txt >crlf.txt
r lf train "${args[@]}" --data small.txt --train.max_steps 1 --train.output_dir o_lf
r crlf train "${args[@]}" --data crlf.txt --train.max_steps 1 --train.output_dir o_crlf
lf_line=$(grep "^data:" lf.err) crlf_line=$(grep "^data:" crlf.err)
[ -n "$lf_line" ] && [ "$lf_line" = "$crlf_line" ]
check "a CRLF .txt gives the same records and tokens as LF ('$lf_line' / '$crlf_line')" $? crlf.err
cmp -s o_lf/adapter/adapter_model.safetensors o_crlf/adapter/adapter_model.safetensors
check "and the same adapter" $?

# --- estimate from config.json alone (issue 47): no weights, a plan and the largest context ------
mkdir -p cfg_only
cat >cfg_only/config.json <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
 "intermediate_size": 688, "num_hidden_layers": 4, "num_attention_heads": 8,
 "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 4096,
 "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false,
 "torch_dtype": "bfloat16"}
JSON
r cfgonly estimate --model cfg_only --memory.limit 64MiB --lora.r 8
[ $rc = 0 ] && grep -q "^largest micro-batch within memory.limit 64MiB" cfgonly.out &&
  grep -Eq "^largest context within memory.limit 64MiB at micro-batch 1: [0-9]+ tokens, needing" \
    cfgonly.out
check "estimate plans from config.json alone and prints the largest context" $? cfgonly.out
r cfgtrain train --model cfg_only --data small.txt --train.max_steps 1 --train.output_dir o_cfg
[ $rc != 0 ] && grep -q "no model.safetensors" cfgtrain.err
check "training from config.json alone is refused naming what is missing (rc $rc)" $? cfgtrain.err

# --- train.offload_checkpoints=auto chooses offload where the context needs it (issue 47) --------
# Llama-3.1-8B's config.json, backend cuda (planned on any machine), 80 GiB, bf16, every layer
# checkpointed: 20,000 tokens fit without offload (none chosen); 200,000 do not (chosen, and the
# largest context, with the host memory it needs, is past what offload off reaches).
pc="$(cd "$(dirname "${BASH_SOURCE[0]}")/../planner_configs" && pwd)"
long=(estimate --model "$pc/llama-3.1-8b" --backend cuda --memory.limit 80GiB --lora.r 32
  --train.precision bf16 --train.grad_checkpointing 1 --train.micro_batch 1)
r lc_short "${long[@]}" --data.seq_len 20000
r lc_off "${long[@]}" --data.seq_len 200000 --train.offload_checkpoints off
r lc_auto "${long[@]}" --data.seq_len 200000
ctx() { sed -n 's/^largest context within .*: \([0-9]*\) tokens, needing .*/\1/p' "$1"; }
[ $rc = 0 ] && ! grep -q "pinned host memory" lc_short.out &&
  grep -q "^checkpointed layer inputs in pinned host memory (train.offload_checkpoints auto" \
    lc_auto.out &&
  grep -Eq "^largest context .*: [0-9]+ tokens, needing .* of host memory \(peak RSS\), checkpointed layer inputs offloaded to it$" \
    lc_auto.out &&
  [ "$(ctx lc_auto.out)" -ge 200000 ] && [ "$(ctx lc_auto.out)" -gt "$(ctx lc_off.out)" ]
check "offload_checkpoints=auto engages for 200,000 tokens of 8B, not 20,000 ($(ctx lc_off.out) off, $(ctx lc_auto.out) auto)" $? lc_auto.out

# --- inspect names the architecture and how it differs from Llama (issue 48) ---------------------
# The expected facts are the fixtures' config.json keys: syn_mistral sliding_window 5 on its 2
# layers, syn_qwen3 q_norm / k_norm and tie_word_embeddings true.
fam="$(cd "$(dirname "${BASH_SOURCE[0]}")/../reference/fixtures/families" && pwd)"
r insm inspect "$fam/syn_mistral"
[ $rc = 0 ] && grep -q "^architecture    mistral (MistralForCausalLM)$" insm.out &&
  grep -q "^deltas          sliding window 5 on 2 of 2 layers$" insm.out
check "inspect prints mistral's class and its sliding window" $? insm.out
r insq inspect "$fam/syn_qwen3.gguf"
[ $rc = 0 ] && grep -q "^architecture    qwen3 (Qwen3ForCausalLM)$" insq.out &&
  grep -q "^deltas          q/k RMSNorm per head, tied head$" insq.out
check "inspect prints qwen3's q/k norms and tied head (GGUF)" $? insq.out

echo "$fails failed"
[ $fails = 0 ]
