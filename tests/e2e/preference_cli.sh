#!/usr/bin/env bash
# A DPO run through the CLI logs TRL's preference metrics where users read them (issue 49):
# every step record of metrics.jsonl carries rewards_chosen / _rejected / _margins /
# _accuracies and logps_chosen / _rejected (and no nll_loss or kl, which DPO does not log), the
# step line prints the same margin and accuracy, the margin is the chosen minus the rejected
# reward, step 1's rewards are 0 (the adapter's B starts at 0: the policy is the reference), the
# run learns the pairs (the last margin > 0), and report.html draws the margins and accuracies.
# usage: preference_cli.sh QLFT_FINETUNE SHARED_DIR
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/e2e_common.sh"
fail() { echo "FAIL: $*"; exit 1; }
stories="$shared/data/tinystories-sample.txt"
[ -f "$stories" ] || qlft_skip shared-missing "$stories not found (set QLFT_SHARED_DIR)"

# Pairs: a story's first sentence as the prompt, its second as the chosen answer, the second's
# words reversed as the rejected one (lines with quotes or backslashes left out: no escaping).
awk 'BEGIN { first = 1 }
  /<\|endoftext\|>/ { first = 1; next }
  first && !/["\\]/ {
    first = 0
    i = index($0, ". "); if (i == 0) next
    rest = substr($0, i + 2); j = index(rest, ". "); if (j == 0) next
    second = substr(rest, 1, j); n = split(second, w, " "); rev = w[n]
    for (k = n - 1; k >= 1; --k) rev = rev " " w[k]
    printf "{\"prompt\": \"%s\", \"chosen\": \" %s\", \"rejected\": \" %s\"}\n", substr($0, 1, i), second, rev
    if (++pairs == 64) exit
  }
  { first = 0 }' "$stories" >pairs.jsonl
[ "$(wc -l <pairs.jsonl)" = 64 ] || fail "pairs.jsonl has $(wc -l <pairs.jsonl) pairs, not 64"

"$cli" train --model "$model" --data pairs.jsonl --quant.type keep --threads 2 --seed 3 \
  --train.objective dpo --pref.beta 0.1 --optim.lr 2e-3 --sched.name constant \
  --train.micro_batch 8 --train.max_steps 12 --train.output_dir run >run.out 2>run.err ||
  { cat run.err; fail "train"; }

# value KEY LINE: the number logged under KEY in a record (empty when absent).
value() { sed -n "s/.*\"$1\": \([-0-9.eE+]*\).*/\1/p" <<<"$2"; }
steps=0
while IFS= read -r rec; do
  [[ $rec == *'"loss": '* ]] || continue
  steps=$((steps + 1))
  for k in rewards_chosen rewards_rejected rewards_margins rewards_accuracies logps_chosen logps_rejected; do
    [ -n "$(value "$k" "$rec")" ] || fail "step $steps: no $k in $rec"
  done
  for k in nll_loss kl; do
    [ -z "$(value "$k" "$rec")" ] || fail "step $steps: DPO logged $k: $rec"
  done
  c=$(value rewards_chosen "$rec") r=$(value rewards_rejected "$rec") m=$(value rewards_margins "$rec")
  awk -v c="$c" -v r="$r" -v m="$m" 'BEGIN { d = c - r - m; exit !(d < 1e-9 && d > -1e-9) }' ||
    fail "step $steps: margin $m is not chosen $c - rejected $r"
  # The step line prints the logged margin and accuracy (4 and 2 decimals).
  a=$(value rewards_accuracies "$rec")
  want=$(printf 'step %d/12 loss [0-9.]* margin %.4f acc %.2f ' "$steps" "$m" "$a")
  grep -q "^$want" run.err || fail "step $steps: no step line '$want' in: $(grep "^step $steps/" run.err)"
  if [ $steps = 1 ]; then
    for v in "$c" "$r" "$m"; do
      awk -v v="$v" 'BEGIN { exit !(v < 1e-6 && v > -1e-6) }' || fail "step 1: a reward is $v, not 0"
    done
  fi
  last_margin=$m
done <run/metrics.jsonl
[ $steps = 12 ] || fail "$steps step records, not 12"
awk -v m="$last_margin" 'BEGIN { exit !(m > 0) }' || fail "the last margin is $last_margin: DPO did not learn"
grep -q "Preference margin" run/report.html || fail "report.html draws no margin"
grep -q "Preference accuracy" run/report.html || fail "report.html draws no accuracy"
echo "ok   12 DPO steps logged TRL's metrics (last margin $last_margin)"
