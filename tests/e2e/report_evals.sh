#!/usr/bin/env bash
# Every evaluation a run makes is in its metrics.jsonl and its report (issue 43): `train`
# evaluates before training and after its last step and prints both; those two values must be
# the first and the last evaluation records, and report.html must list them. A run with
# train.eval_every that evaluates at its last step logs that evaluation once (no repeat).
# usage: report_evals.sh QLFT_FINETUNE SHARED_DIR
set -euo pipefail
E2E_SMALL_BYTES=20000 source "$(dirname "${BASH_SOURCE[0]}")/e2e_common.sh"
fail() { echo "FAIL: $*"; exit 1; }

# train OUT [settings...]: a 6-step stories260K run with a held-out split.
train() {
  local out=$1
  shift
  "$cli" train --model "$model" --data small.txt --quant.type keep --threads 2 --seed 3 \
    --data.seq_len 64 --train.micro_batch 2 --lora.r 4 --train.max_steps 6 \
    --data.eval_fraction 0.1 --train.output_dir "$out" "$@" >"$out.out" 2>"$out.err" ||
    { cat "$out.err"; fail "train $out"; }
}
# The printed evaluation ("eval loss before: 3.1234 ...") and a logged one, to 4 decimals.
printed() { sed -n "s/^eval loss $1: *\([0-9.]*\).*/\1/p" "$2"; }
logged() { sed -n 's/.*"eval_loss": \([0-9.]*\).*/\1/p' <<<"$1" | xargs printf '%.4f'; }

# Evaluations only before and after: two evaluation records, step 0 first and step 6 last.
train run
before=$(printed before run.out)
after=$(printed after run.out)
[ -n "$before" ] && [ -n "$after" ] || fail "train printed no evaluations: $(cat run.out)"
first=$(head -n 1 run/metrics.jsonl)
last=$(tail -n 1 run/metrics.jsonl)
[[ $first == '{"step": 0, "eval_loss": '* ]] || fail "first record is not the evaluation before training: $first"
[[ $last == '{"step": 6, "eval_loss": '* ]] || fail "last record is not the evaluation after step 6: $last"
[ "$(logged "$first")" = "$before" ] || fail "logged $(logged "$first"), printed before $before"
[ "$(logged "$last")" = "$after" ] || fail "logged $(logged "$last"), printed after $after"
[ "$(grep -c '"eval_loss"' run/metrics.jsonl)" = 2 ] || fail "not 2 evaluations logged"
# The report, written at the end of train and again by `report`, lists both.
for pass in train report; do
  [ $pass = report ] && { "$cli" report run >/dev/null || fail "report"; }
  grep -q "<th>evaluations</th><td>step 0: $before, step 6: $after (" run/report.html ||
    fail "$pass: report.html does not list step 0: $before and step 6: $after:
$(grep -o '<th>eval[^/]*' run/report.html)"
  [ "$(grep -c 'data-series="eval_loss" cx=' run/report.html)" = 2 ] ||
    fail "$pass: report.html does not draw 2 evaluation points"
done

# train.eval_every 3: evaluations at steps 3 and 6 in the step records; the one after training
# is step 6's (not evaluated again, not logged twice).
train every --train.eval_every 3
[ "$(grep -c '"eval_loss"' every/metrics.jsonl)" = 3 ] ||
  fail "eval_every 3: not 3 evaluations (before, 3, 6): $(grep -o '"step": [0-9]*, "[a-z_]*' every/metrics.jsonl)"
[ "$(logged "$(tail -n 1 every/metrics.jsonl)")" = "$(printed after every.out)" ] ||
  fail "eval_every 3: the evaluation after training is not step 6's"
grep -q "<th>evaluations</th><td>step 0: [0-9.]*, step 3: [0-9.]*, step 6: [0-9.]* (" \
  every/report.html || fail "eval_every 3: report does not list steps 0, 3 and 6"
echo "report_evals: ok"
