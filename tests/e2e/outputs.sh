#!/usr/bin/env bash
# Nothing a user owns is destroyed by the CLI's writers (issue 44, items 1, 3, 4, 5, 8, 10, 11):
# an output that names an input (after symlinks and hard links) is refused with exit 2 naming
# both and the input byte-identical; cleanup removes only qlft's own marked temporaries of dead
# writers (a killed export's leftover included), never a user's `*.tmp.<digits>`; the run lock
# is never written through a symlink and deleting it lets no second run in; --resume keeps the
# permissions of what it rewrites; `report --watch` stops with an error when it cannot write.
# usage: outputs.sh QLFT_FINETUNE SHARED_DIR
set -uo pipefail  # not -e: every check runs and reports
E2E_SMALL_BYTES=20000 source "$(dirname "${BASH_SOURCE[0]}")/e2e_common.sh"
args=(--model "$model" --data small.txt --quant.type keep --threads 1 --seed 5 --data.seq_len 64
      --train.micro_batch 2 --lora.r 4 --optim.lr 1e-3)
sum() { sha256sum "$1" | cut -d' ' -f1; }

# A finished run to export from and report on.
"$cli" train "${args[@]}" --train.max_steps 2 --train.output_dir run >/dev/null 2>train.err
check "a short run trains" $? train.err
ad=run/adapter

# --- item 1: export over the adapter's own weights --------------------------------------------
before=$(sum $ad/adapter_model.safetensors)
ln -s adapter/adapter_model.safetensors run/w.link
ln $ad/adapter_model.safetensors hard.safetensors
for out in $ad/adapter_model.safetensors run/w.link hard.safetensors run/adapter/../adapter; do
  fmt=gguf; [ "$out" = run/adapter/../adapter ] && fmt=peft
  "$cli" export --model "$model" --adapter $ad --format $fmt --out "$out" >/dev/null \
    2>export1.err && rc=0 || rc=$?
  [ $rc = 2 ] && grep -q -- "$out .*the --adapter" export1.err &&
    [ "$(sum $ad/adapter_model.safetensors)" = "$before" ]
  check "export --format $fmt --out $out refused (exit 2), the adapter byte-identical" $? \
    export1.err
done
"$cli" export --model "$model" --adapter $ad --format gguf --out $ad/adapter.gguf >/dev/null \
  2>export_ok.err && [ -s $ad/adapter.gguf ] && [ "$(sum $ad/adapter_model.safetensors)" = "$before" ]
check "export beside the adapter's files is fine" $? export_ok.err
rm -f $ad/adapter.gguf
cp "$model" m.gguf
before=$(sum m.gguf)
"$cli" export --model m.gguf --adapter $ad --format merged-gguf-f16 --out ./m.gguf >/dev/null \
  2>export_model.err && rc=0 || rc=$?
[ $rc = 2 ] && grep -q "the --model" export_model.err && [ "$(sum m.gguf)" = "$before" ]
check "merged export over the model refused (exit 2), the model byte-identical" $? export_model.err

# --- item 3: report over the run's metrics ------------------------------------------------------
before=$(sum run/metrics.jsonl)
for out in run/metrics.jsonl run/./metrics.jsonl run/checkpoint.safetensors; do
  "$cli" report run --out "$out" >/dev/null 2>report.err && rc=0 || rc=$?
  [ $rc = 2 ] && grep -q "$out is" report.err && [ "$(sum run/metrics.jsonl)" = "$before" ]
  check "report --out $out refused (exit 2), metrics byte-identical" $? report.err
done

# --- item 11: --watch that cannot write stops -----------------------------------------------------
touch afile
timeout 20 "$cli" report run --watch 1 --out afile/r.html >/dev/null 2>watch.err && rc=0 || rc=$?
[ $rc = 3 ] && grep -q "afile/r.html" watch.err
check "report --watch to an unwritable path stops with exit 3 (was: loops, 124)" $? watch.err
mkdir ro && chmod 555 ro
if ! touch ro/probe 2>/dev/null; then
  timeout 20 "$cli" report run --watch 1 --out ro/r.html >/dev/null 2>watch_ro.err && rc=0 || rc=$?
  [ $rc = 3 ] && grep -q "ro/r.html" watch_ro.err
  check "report --watch into a read-only directory stops with exit 3" $? watch_ro.err
else
  echo "skip --watch read-only directory: this user writes through mode 555 (root)"
fi
# A watch waiting for a run that has not started yet still waits (and stops on SIGTERM).
mkdir pending
"$cli" report pending --watch 1 >/dev/null 2>pending.err &
w=$!
sleep 1.5
kill -0 $w 2>/dev/null
check "report --watch waits for metrics.jsonl to appear" $? pending.err
kill $w 2>/dev/null; wait $w 2>/dev/null

# --- item 4: a user's *.tmp.<digits> files survive a run's cleanup --------------------------------
mkdir -p user/backup.tmp.1
echo thesis >user/backup.tmp.1/thesis.tex
echo notes >user/notes.tmp.2024
echo mine >user/checkpoint.safetensors.tmp.7
"$cli" train "${args[@]}" --train.max_steps 1 --train.output_dir user >/dev/null 2>user.err
[ "$(cat user/backup.tmp.1/thesis.tex)" = thesis ] && [ "$(cat user/notes.tmp.2024)" = notes ] &&
  [ "$(cat user/checkpoint.safetensors.tmp.7)" = mine ] && ! grep -q "left by a run" user.err
check "user files named *.tmp.<digits> are kept by the run's cleanup" $? user.err

# A run file that is a hard link to the data: metrics.jsonl is rewritten in place on --resume.
mkdir hl && ln small.txt hl/metrics.jsonl
before=$(sum small.txt)
"$cli" train "${args[@]}" --train.max_steps 1 --train.output_dir hl --resume >/dev/null \
  2>hl.err && rc=0 || rc=$?
[ $rc = 2 ] && grep -q "hl/metrics.jsonl is the --data" hl.err && [ "$(sum small.txt)" = "$before" ]
check "a run whose metrics.jsonl is a hard link to --data is refused (exit 2), the data kept" $? \
  hl.err

# --- item 5: the lock ------------------------------------------------------------------------------
echo precious >victim.txt
mkdir locked && ln -s ../victim.txt locked/.qlft.lock
"$cli" train "${args[@]}" --train.max_steps 1 --train.output_dir locked >/dev/null 2>lock.err &&
  rc=0 || rc=$?
[ $rc = 2 ] && grep -q "symbolic link" lock.err && [ "$(cat victim.txt)" = precious ]
check "a symlinked .qlft.lock is refused (exit 2), its target untouched" $? lock.err

"$cli" train "${args[@]}" --train.max_steps 100000 --train.output_dir busy >/dev/null 2>busy1.err &
holder=$!
for _ in $(seq 500); do [ -s busy/metrics.jsonl ] && break; sleep 0.02; done
rm -f busy/.qlft.lock
"$cli" train "${args[@]}" --train.max_steps 2 --train.output_dir busy --overwrite >/dev/null \
  2>busy2.err && rc=0 || rc=$?
kill -0 "$holder" 2>/dev/null && alive=0 || alive=1
kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null
[ $rc = 2 ] && [ $alive = 0 ] && grep -q "in use by another run" busy2.err
check "with .qlft.lock deleted, a second --overwrite run is refused (exit 2)" $? busy2.err

# --- item 8: a killed export's temporary is removed by the next export ----------------------------
# QLFT_TEST_CRASH_AT=2: SIGKILL at the first write after the temporary is made.
mkdir exp
echo user >exp/m.gguf.tmp.99  # a user's file of the temporaries' form: never removed
kill_export() {  # kill_export FORMAT OUT
  QLFT_TEST_CRASH_AT=2 "$cli" export --model "$model" --adapter $ad --format "$1" --out "$2" \
    >/dev/null 2>/dev/null
}
temps() { ls -d exp/m.gguf.tmp.* exp/pe.tmp.* 2>/dev/null | grep -v 'tmp\.99$' | tr '\n' ' '; }
kill_export merged-gguf-f16 exp/m.gguf
first=$(temps)
kill_export merged-gguf-f16 exp/m.gguf
second=$(temps)
kill_export peft exp/pe
third=$(temps)
[ -n "$first" ] && [ $(echo $first | wc -w) = 1 ] && [ $(echo $second | wc -w) = 1 ] &&
  [ "$first" != "$second" ] && [ $(echo $third | wc -w) = 2 ]
check "a killed export leaves one temporary, the next killed one removes it (got: $first| $second| $third)" $?
"$cli" export --model "$model" --adapter $ad --format merged-gguf-f16 --out exp/m.gguf >/dev/null \
  2>exp1.err &&
  "$cli" export --model "$model" --adapter $ad --format peft --out exp/pe >/dev/null 2>exp2.err
rc=$?
[ $rc = 0 ] && [ -z "$(temps)" ] && [ "$(cat exp/m.gguf.tmp.99)" = user ] && [ -s exp/m.gguf ] &&
  [ -s exp/pe/adapter_model.safetensors ]
ok=$?
check "the next exports remove the killed ones' temporaries and keep the user's (left: $(temps))" \
  $ok exp1.err

# --- item 10: --resume keeps the permissions of what it rewrites ----------------------------------
"$cli" train "${args[@]}" --train.max_steps 2 --train.output_dir modes >/dev/null 2>modes1.err
chmod 600 modes/checkpoint.safetensors modes/adapter.gguf modes/adapter/* modes/metrics.jsonl
chmod 700 modes/adapter
"$cli" train "${args[@]}" --train.max_steps 3 --train.output_dir modes --resume >/dev/null \
  2>modes2.err
rc=$?
perms=$(stat -c '%a' modes/checkpoint.safetensors modes/adapter.gguf modes/adapter/* \
  modes/metrics.jsonl modes/adapter | sort -u | tr '\n' ' ')
[ $rc = 0 ] && [ "$perms" = "600 700 " ]
check "--resume keeps 0600 files and a 0700 adapter directory (got: $perms)" $? modes2.err

[ $fails = 0 ] && echo "all passed" || echo "$fails failed"
exit $((fails > 0))
