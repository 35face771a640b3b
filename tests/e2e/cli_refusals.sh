#!/usr/bin/env bash
# The CLI refuses what it does not understand and says what is wrong (issue 16), and an adapter
# is evaluated on the base it was trained on (issue 15). Each check is a defect the issue found:
# stray words after an option, export over its own input, invalid UTF-8 in a .txt, YAML
# duplicate keys, a data directory holding the output directory, a .gguf given as a PEFT
# directory, a text file given as the model, optim.eps 0, a diverged run exiting 0 with NaN in
# metrics.jsonl, seq_len above the context and generation cut at it without a word.
# usage: cli_refusals.sh QLFT_FINETUNE SHARED_DIR
set -uo pipefail  # not -e: every check runs and reports
source "$(dirname "${BASH_SOURCE[0]}")/e2e_common.sh"
args=(--model "$model" --quant.type keep --threads 1 --seed 5 --data.seq_len 64
      --train.micro_batch 2 --lora.r 4)
run() {  # run LOG CMD...: runs, stderr+stdout to LOG, sets rc
  "$@" >"$1.out" 2>"$1.err" && rc=0 || rc=$?
}
r() { local log=$1; shift; "$cli" "$@" >"$log.out" 2>"$log.err" && rc=0 || rc=$?; }

# --- stray words --------------------------------------------------------------------------------
cp small.txt b.txt
r pos1 train "${args[@]}" --data small.txt b.txt --train.output_dir o1
[ $rc = 2 ] && grep -q "unexpected argument 'b.txt' after --data small.txt" pos1.err && [ ! -e o1 ]
check "train --data a.txt b.txt refused" $? pos1.err
r pos2 train "${args[@]}" --data small.txt --lora.r 4 16 --train.output_dir o1
[ $rc = 2 ] && grep -q "unexpected argument '16' after --lora.r 4" pos2.err
check "--lora.r 4 16 refused" $? pos2.err
r pos3 generate --model "$model" --prompt Once upon a time
[ $rc = 2 ] && grep -q "unexpected argument 'upon'" pos3.err
check "generate --prompt Once upon a time refused" $? pos3.err

# --- a trained adapter for the checks below -----------------------------------------------------
r train train "${args[@]}" --data small.txt --train.max_steps 3 --train.output_dir run \
  --data.eval_fraction 0.1
[ $rc = 0 ] && grep -q '"quant.type": "keep"' run/adapter/qlft_base_config.json
check "train records how its base was stored (quant.type keep)" $? train.err

# --- eval/generate use the base as trained unless told otherwise (issue 15) ---------------------
loss() { sed -n 's/^loss \([0-9.]*\).*/\1/p;s/.*loss[: ]*\([0-9.][0-9.]*\).*/\1/p' "$1" | head -1; }
r ev_default eval --model "$model" --data small.txt --adapter run/adapter --threads 1 \
  --data.seq_len 64 --data.eval_fraction 0.1
r ev_keep eval --model "$model" --data small.txt --adapter run/adapter --threads 1 \
  --data.seq_len 64 --data.eval_fraction 0.1 --quant.type keep
r ev_nf4 eval --model "$model" --data small.txt --adapter run/adapter --threads 1 \
  --data.seq_len 64 --data.eval_fraction 0.1 --quant.type nf4
d=$(cat ev_default.out) k=$(cat ev_keep.out) n=$(cat ev_nf4.out)
[ -n "$d" ] && [ "$d" = "$k" ] && [ "$d" != "$n" ]
check "eval --adapter defaults to the trained base (= keep: '$d', nf4: '$n')" $? ev_default.err
r gen_default generate --model "$model" --adapter run/adapter --prompt "ROMEO:" --max-tokens 12 \
  --threads 1
r gen_keep generate --model "$model" --adapter run/adapter --prompt "ROMEO:" --max-tokens 12 \
  --threads 1 --quant.type keep
[ -s gen_default.out ] && cmp -s gen_default.out gen_keep.out
check "generate --adapter defaults to the trained base" $? gen_default.err

# --- export over its own input ------------------------------------------------------------------
cp "$model" m.gguf
sum=$(md5sum <m.gguf)
r exp export --model m.gguf --adapter run/adapter --format merged-gguf-f16 --out m.gguf
[ $rc = 2 ] && grep -q "m.gguf is the --model (m.gguf" exp.err && [ "$(md5sum <m.gguf)" = "$sum" ]
check "export --out equal to --model refused, the model untouched" $? exp.err
r exp2 export --model m.gguf --adapter run/adapter --format peft --out run/adapter
[ $rc = 2 ] && grep -q "run/adapter is the --adapter (run/adapter" exp2.err
check "export --out equal to --adapter refused" $? exp2.err

# --- data ---------------------------------------------------------------------------------------
printf 'good line one\n\nsecond \xff\xfe doc\n' >bad.txt
r utf train "${args[@]}" --data bad.txt --train.max_steps 1 --train.output_dir o2
[ $rc = 4 ] && grep -q "bad.txt:3: byte 0xff is not valid UTF-8" utf.err
check "invalid UTF-8 in a .txt refused naming file:line" $? utf.err
mkdir datadir && cp small.txt datadir/
r own train "${args[@]}" --data datadir --train.max_steps 1 --train.output_dir datadir/
[ $rc = 2 ] && grep -q "is train.output_dir" own.err && [ "$(ls -A datadir)" = small.txt ]
check "a data directory that is the output directory refused, nothing written" $? own.err

# --- settings -----------------------------------------------------------------------------------
printf 'lora:\n  r: 4\nthreads: 1\nlora:\n  r: 16\n' >dup.yaml
r dup train "${args[@]}" --data small.txt --config dup.yaml --train.output_dir o3
[ $rc = 2 ] && grep -q "dup.yaml:5: lora.r is set twice (first at line 2)" dup.err
check "a YAML duplicate key refused naming both lines" $? dup.err
r eps train "${args[@]}" --data small.txt --optim.eps 0 --train.output_dir o4
[ $rc = 2 ] && grep -q "optim.eps must be in 1e-30..1" eps.err
check "optim.eps 0 refused" $? eps.err
r big train "${args[@]}" --data small.txt --train.max_steps 1e0 --train.output_dir o5
[ $rc = 0 ]
check "an integer in exponent notation accepted (--train.max_steps 1e0)" $? big.err

# --- messages -----------------------------------------------------------------------------------
r gg generate --model "$model" --adapter run/adapter.gguf --prompt x
[ $rc = 2 ] && grep -q "adapter.gguf: not a directory; an adapter here is a PEFT directory" gg.err
check "--adapter x.gguf says it wants a PEFT directory" $? gg.err
r txtmodel inspect small.txt
[ $rc != 0 ] && grep -q "small.txt: not a model" txtmodel.err && ! grep -q "config.json: cannot open" txtmodel.err
check "a text file as the model is called what it is" $? txtmodel.err
r ctx train "${args[@]}" --data small.txt --data.seq_len 4096 --train.max_steps 1 \
  --train.output_dir o6
grep -q "data.seq_len 4096 is longer than the model's context" ctx.err
check "seq_len above the model's context warned" $? ctx.err
r genctx generate --model "$model" --prompt "Once" --max-tokens 5000 --threads 1
grep -q "generation stops at the model's context" genctx.err
check "generation cut at the context warned" $? genctx.err

# --- resume on other data names what differs ---------------------------------------------------
r res1 train "${args[@]}" --data small.txt --train.max_steps 4 --train.save_every 2 \
  --train.output_dir resumed --data.seed 1
r res2 train "${args[@]}" --data small.txt --train.max_steps 4 --train.output_dir resumed \
  --data.seed 2 --resume
[ $rc = 2 ] && grep -q "data.seed: 1 in the checkpoint, 2 now" res2.err
check "resume with another data.seed names it" $? res2.err
head -c 30000 small.txt >shorter.txt
r res3 train "${args[@]}" --data shorter.txt --train.max_steps 4 --train.output_dir resumed \
  --data.seed 1 --resume
[ $rc = 2 ] && grep -q "training rows (the data, data.seq_len.*): [0-9]* in the checkpoint, [0-9]* now" res3.err
check "resume on other data names the row counts" $? res3.err

# --- a diverged run -----------------------------------------------------------------------------
r nan train "${args[@]}" --data small.txt --train.max_steps 30 --optim.lr 10 \
  --optim.weight_decay 10 --train.save_every 5 --train.output_dir div
[ $rc = 6 ] && grep -q "training diverged" nan.err && [ ! -e div/adapter ] &&
  grep -q '"loss": null' div/metrics.jsonl && grep -q '"nonfinite": true' div/metrics.jsonl &&
  python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' div/metrics.jsonl
check "a diverged run exits 6, no adapter, metrics.jsonl valid JSON with null" $? nan.err

[ $fails = 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "CLI refusals: all checks passed"
