#!/usr/bin/env bash
# The run directory (train.output_dir) as a unit nothing can corrupt (issue 16, done-when 1):
# refused outputs (empty, a file in the way, read-only) before the model loads with the real
# reason; missing parents created; a second concurrent run refused naming the holder's pid; a
# rerun without --resume refused (--overwrite replaces); a disk that fills mid-run stops the run
# keeping the last checkpoint, and --resume then gives the uninterrupted run's adapter; SIGKILL
# at every write and rename of every save leaves a consistent adapter directory, and --resume
# leaves no temporary file and one valid metrics record per step, with the same adapter bytes.
# usage: run_dir.sh QLFT_FINETUNE SHARED_DIR [dir|kill]  (default: both; ctest runs each alone)
set -uo pipefail  # not -e: every check runs and reports
cli=$(realpath "$1")
shared=$(realpath "$2")
section=${3:-all}
model="$shared/models/stories260K.gguf"
text="$shared/data/tinyshakespeare.txt"
source "$(dirname "${BASH_SOURCE[0]}")/../support/skip.sh"
[ -f "$model" ] && [ -f "$text" ] || qlft_skip shared-missing "$model or $text not found"
work=$(mktemp -d)
mounts=()
cleanup() {
  for m in "${mounts[@]}"; do umount "$m" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
# The first 40 KB of the text: every run here tokenizes its data, and the kill sweep runs ~80.
head -c 40000 "$text" >"$work/small.txt"
args=(--model "$model" --data "$work/small.txt" --quant.type keep --threads 1 --seed 5 --data.seq_len 64
      --train.micro_batch 2 --lora.r 4 --optim.lr 1e-3)
fails=0
check() {  # check NAME CONDITION-RESULT(0/1) [details file]
  if [ "$2" = 0 ]; then echo "ok   $1"; else
    echo "FAIL $1"; [ -n "${3:-}" ] && sed 's/^/     /' "$3"; fails=$((fails + 1)); fi
}
# "refused before the model loads": the data line is printed after the model and data load.
refused_early() { ! grep -q '^data: ' "$1"; }
# One complete record per step 1..n, each line valid JSON (no NaN), nothing else.
metrics_ok() {  # metrics_ok FILE N
  python3 - "$1" "$2" <<'EOF'
import json, sys
lines = open(sys.argv[1]).read().split("\n")
assert lines[-1] == "", "the file does not end with a complete line"
steps = [json.loads(l)["step"] for l in lines[:-1]]
assert steps == list(range(1, int(sys.argv[2]) + 1)), steps
EOF
}
# The PEFT directory is absent or whole (config, weights and base record together).
adapter_consistent() {
  local d=$1/adapter
  [ ! -e "$d" ] && return 0
  [ -f "$d/adapter_config.json" ] && [ -f "$d/adapter_model.safetensors" ] &&
    [ -f "$d/qlft_base_config.json" ] &&
    [ "$(ls "$d" | wc -l)" = 3 ] && python3 -c 'import json,sys; json.load(open(sys.argv[1]))' \
      "$d/adapter_config.json"
}
leftovers() { find "$1" \( -name '*.tmp.*' -o -name '*.old.*' \) | head -5; }

cd "$work"
if [ "$section" != kill ]; then
# --- refused outputs ---------------------------------------------------------------------------
mkdir empty_cwd
(cd empty_cwd && "$cli" train "${args[@]}" --train.max_steps 2 --train.output_dir "" \
  >/dev/null 2>"$work/empty.err") && rc=0 || rc=$?
[ $rc = 2 ] && grep -q "train.output_dir is empty" empty.err && refused_early empty.err &&
  [ -z "$(ls -A empty_cwd)" ]
check "empty train.output_dir refused, nothing written" $? empty.err

echo data >afile
"$cli" train "${args[@]}" --train.max_steps 2 --train.output_dir afile/run >/dev/null \
  2>file.err && rc=0 || rc=$?
[ $rc = 3 ] && grep -q "afile: exists and is not a directory" file.err && refused_early file.err
check "a file in the output path refused with the real reason" $? file.err

"$cli" train "${args[@]}" --train.max_steps 2 --train.output_dir deep/er/run >/dev/null \
  2>deep.err && rc=0 || rc=$?
[ $rc = 0 ] && [ -f deep/er/run/adapter/adapter_model.safetensors ]
check "missing parents created" $? deep.err

ro_reason=""
mkdir ro
if mount -t tmpfs -o size=1m,ro tmpfs ro 2>/dev/null; then
  mounts+=("$work/ro"); ro_reason="Read-only file system"
elif [ "$(id -u)" != 0 ]; then
  chmod 555 ro; ro_reason="Permission denied"
fi
if [ -n "$ro_reason" ]; then
  for out in ro ro/new/run; do
    "$cli" train "${args[@]}" --train.max_steps 2 --train.output_dir "$out" >/dev/null \
      2>ro.err && rc=0 || rc=$?
    [ $rc = 3 ] && grep -q "$ro_reason" ro.err && refused_early ro.err
    check "read-only output ($out) refused: $ro_reason" $? ro.err
  done
else
  echo "skip read-only output: root without mount permission (chmod does not bind root)"
fi

# --- one run per directory ---------------------------------------------------------------------
"$cli" train "${args[@]}" --train.max_steps 400 --train.output_dir busy >/dev/null 2>busy1.err &
holder=$!
for _ in $(seq 500); do [ -s busy/metrics.jsonl ] && break; sleep 0.02; done
"$cli" train "${args[@]}" --train.max_steps 2 --train.output_dir busy >/dev/null 2>busy2.err &&
  rc=0 || rc=$?
kill "$holder" 2>/dev/null || true
wait "$holder" 2>/dev/null || true
[ $rc = 2 ] && grep -q "in use by another run (pid $holder" busy2.err && refused_early busy2.err
check "a second run into a busy directory refused naming pid $holder" $? busy2.err
python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' busy/metrics.jsonl
check "the first run's metrics.jsonl is intact" $?

"$cli" train "${args[@]}" --train.max_steps 2 --train.output_dir done >/dev/null 2>/dev/null
cp done/checkpoint.safetensors ckpt.before
"$cli" train "${args[@]}" --train.max_steps 3 --train.output_dir done >/dev/null 2>rerun.err &&
  rc=0 || rc=$?
[ $rc = 2 ] && grep -q "holds a run" rerun.err && grep -q -- "--resume" rerun.err &&
  cmp -s ckpt.before done/checkpoint.safetensors && refused_early rerun.err
check "a rerun without --resume refused, the finished run untouched" $? rerun.err
"$cli" train "${args[@]}" --train.max_steps 3 --train.output_dir done --overwrite >/dev/null \
  2>over.err && metrics_ok done/metrics.jsonl 3
check "--overwrite replaces the run (3 fresh records)" $? over.err

# --- the uninterrupted reference ---------------------------------------------------------------
ref=(--train.max_steps 12 --train.save_every 2)
"$cli" train "${args[@]}" "${ref[@]}" --train.output_dir straight >/dev/null 2>straight.err
same_adapter() {
  cmp -s straight/adapter/adapter_model.safetensors "$1/adapter/adapter_model.safetensors" &&
    cmp -s straight/adapter.gguf "$1/adapter.gguf"
}

# --- the disk fills mid-run --------------------------------------------------------------------
# A tmpfs with room for one checkpoint: the first save fits, the second (its new file beside the
# old one) does not.
mkdir full
if mount -t tmpfs -o size=4m tmpfs full 2>/dev/null; then
  mounts+=("$work/full")
  mkdir full/run
  avail=$(df --output=avail -B1 full | tail -1)
  head -c $((avail - 480 * 1024)) /dev/zero >full/filler
  "$cli" train "${args[@]}" "${ref[@]}" --train.output_dir full/run >/dev/null 2>full.err &&
    rc=0 || rc=$?
  [ $rc = 3 ] && grep -q "stopped after step 4: .*checkpoint.safetensors.*No space left" full.err &&
    grep -q "checkpoint of step 2 is kept in full/run" full.err && [ -z "$(leftovers full)" ] &&
    metrics_ok full/run/metrics.jsonl 4
  check "disk full: the run stops at the failed save and keeps the last checkpoint" $? full.err
  rm -f full/filler
  # The kept checkpoint resumes to the uninterrupted run's adapter.
  "$cli" train "${args[@]}" "${ref[@]}" --train.output_dir full/run --resume >/dev/null \
    2>full_resume.err && grep -q "resumed from" full_resume.err &&
    metrics_ok full/run/metrics.jsonl 12 && same_adapter full/run && [ -z "$(leftovers full)" ]
  check "after the disk is freed, --resume gives the uninterrupted adapter" $? full_resume.err
else
  echo "skip disk full: cannot mount a tmpfs here (needs root)"
fi
# metrics.jsonl on a device that is always full (/dev/full): the first record fails, the run
# stops there and writes no checkpoint for a step its metrics do not hold.
mkdir devfull && ln -s /dev/full devfull/metrics.jsonl
"$cli" train "${args[@]}" "${ref[@]}" --train.output_dir devfull --resume >/dev/null \
  2>devfull.err && rc=0 || rc=$?
[ $rc = 3 ] && grep -q "stopped after step 1: .*metrics.jsonl: write failed: No space left" \
  devfull.err && grep -q "no checkpoint was written" devfull.err &&
  [ ! -e devfull/checkpoint.safetensors ]
check "a failed metrics write stops the run at once" $? devfull.err

fi
if [ "$section" != dir ]; then
# --- SIGKILL at every write and rename of every save --------------------------------------------
kill_args=(--train.max_steps 2 --train.save_every 1)
"$cli" train "${args[@]}" "${kill_args[@]}" --train.output_dir kref >/dev/null 2>/dev/null
n=1
while :; do
  rm -rf k
  # (through an inner shell, which reports the kill into k.err instead of the test's log)
  bash -c '"$@" 2>k.err; exit $?' _ env QLFT_TEST_CRASH_AT=$n "$cli" train "${args[@]}" \
    "${kill_args[@]}" --train.output_dir k >/dev/null 2>&1 && rc=0 || rc=$?
  [ $rc = 0 ] && break
  [ $rc = 137 ] || { check "crash point $n: killed (rc $rc)" 1 k.err; break; }
  adapter_consistent k || { check "crash point $n: adapter directory consistent" 1; ls -R k; }
  "$cli" train "${args[@]}" "${kill_args[@]}" --train.output_dir k --resume >/dev/null \
    2>k_resume.err || { check "crash point $n: resume" 1 k_resume.err; }
  [ -z "$(leftovers k)" ] || { check "crash point $n: no temporary files after resume" 1; leftovers k; }
  metrics_ok k/metrics.jsonl 2 || check "crash point $n: one record per step" 1 k/metrics.jsonl
  cmp -s kref/adapter/adapter_model.safetensors k/adapter/adapter_model.safetensors &&
    cmp -s kref/adapter.gguf k/adapter.gguf || check "crash point $n: same adapter bytes" 1
  n=$((n + 1))
done
[ $n -gt 20 ]
check "SIGKILL at each of $((n - 1)) crash points: consistent, resumable, identical" $?
fi

[ $fails = 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "run directory: all checks passed"
