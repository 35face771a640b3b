#!/usr/bin/env bash
# NVMe offload: peak RSS and step time of the same fine-tune with base weights and optimizer
# state in memory (offload.* = none) and in files under offload.dir (offload.* = nvme).
#
#   bench/offload_rss.sh [--qlft path/to/qlft-finetune] [--model M.gguf] [--data D.txt]
#                        [--steps N] [--seq S] [--dir OFFLOAD_DIR] [--optim NAME]
#
# Defaults: SmolLM2-135M-Instruct Q4_1 (quant.type keep), tinyshakespeare, seq 256, micro-batch 1,
# 3 steps, AdamW, offload.dir = $TMPDIR or /tmp. Peak RSS is the whole process's
# (/usr/bin/time -v: model loading included; the GGUF mapping counts in it both ways). The
# offloaded bytes are what the resident run's tracker counts as weights and optimizer state;
# "left resident" is offloaded minus the RSS drop: the NVMe run's unit and state buffers (the
# largest unit, e.g. a tied fp32 embedding that the head needs whole, bounds it from below).
# Step time: the mean of the CLI's per-step tok/s over the run, and the wall time of each run.
# Asserted (exit 1 otherwise): the RSS drop is at least the offloaded bytes minus what the NVMe
# run's own tracker holds in unit and state buffers (its weights and optimizer rows), less
# QLFT_OFFLOAD_RSS_SLACK_MIB (default 4: allocator behaviour; docs/PERFORMANCE.md records drops
# of 89.1-89.3 MiB against 79.6), and the losses of both runs are identical.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
qlft=""
model=/opt/qlft-models/smollm2-135m-instruct-q4_1.gguf
data=${QLFT_SHARED_DIR:-$root/../shared}/data/tinyshakespeare.txt
steps=3
seq=256
dir=${TMPDIR:-/tmp}
optim=adamw
while [ $# -gt 0 ]; do
  case "$1" in
    --qlft) qlft=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --optim) optim=$2; shift 2 ;;
    -h|--help) sed -n 2,16p "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
source "$here/find_cli.sh"
[ -r "$model" ] || { echo "model $model not found" >&2; exit 1; }
[ -r "$data" ] || { echo "data $data not found" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "/usr/bin/time (GNU time) is needed" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

# MiB from the CLI's memory table ("weights  171.4 MiB  171.4 MiB": the measured column).
mib_of() {
  awk -v row="$1" '$1 == row { v = $(NF-1); u = $NF;
    if (u == "GiB") v *= 1024; else if (u == "KiB") v /= 1024; else if (u == "B") v /= 1048576;
    print v; exit }' "$2"
}

for mode in none nvme; do
  /usr/bin/time -v "$qlft" train --model "$model" --data "$data" --quant.type keep \
    --data.seq_len "$seq" --train.micro_batch 1 --train.accumulation 1 \
    --train.max_steps "$steps" --optim.name "$optim" --train.output_dir "$work/out-$mode" \
    --offload.params "$mode" --offload.optimizer "$mode" --offload.dir "$dir" \
    >"$work/$mode.out" 2>"$work/$mode.err" || {
    echo "the $mode run failed:" >&2; tail -20 "$work/$mode.err" >&2; exit 1; }
done

rss() { awk '/Maximum resident set size/ { printf "%.1f", $NF / 1024 }' "$work/$1.err"; }
wall() { awk -F': ' '/Elapsed \(wall clock\)/ { n = split($2, p, ":"); s = 0;
  for (i = 1; i <= n; ++i) s = s * 60 + p[i]; printf "%.1f", s }' "$work/$1.err"; }
cpu() { awk '/User time|System time/ { s += $NF } END { printf "%.1f", s }' "$work/$1.err"; }
step_s() { awk -v seq="$seq" '/^step / { for (i = 1; i < NF; ++i) if ($i == "tok/s") { t += seq / $(i+1); n++ } }
  END { if (n) printf "%.2f", t / n; else print "n/a" }' "$work/$1.err" "$work/$1.out"; }
losses() { awk '/^step / { for (i = 1; i < NF; ++i) if ($i == "loss") printf "%s ", $(i+1) }' "$work/$1.err" "$work/$1.out"; }

w=$(mib_of weights "$work/none.out")
o0=$(mib_of optimizer "$work/none.out")
o1=$(mib_of optimizer "$work/nvme.out")
r0=$(rss none)
r1=$(rss nvme)
echo "model            $model (quant.type keep), seq $seq, micro-batch 1, $steps steps, $optim"
echo "io               offload.dir $dir"
echo "offloaded        weights $w MiB + optimizer state $o0 MiB (resident run's tracker)"
printf "state buffers    %.2f MiB (optimizer, NVMe run)\n" "$o1"
awk -v a="$r0" -v b="$r1" -v w="$w" -v o="$o0" 'BEGIN {
  d = a - b; off = w + o;
  printf "peak RSS         none %.1f MiB, nvme %.1f MiB: drop %.1f MiB\n", a, b, d;
  printf "left resident    %.1f MiB of the %.1f MiB offloaded (unit and state buffers)\n", off - d, off }'
echo "step time        none $(step_s none) s, nvme $(step_s nvme) s (mean over steps, from tok/s)"
echo "wall / CPU       none $(wall none) s / $(cpu none) s, nvme $(wall nvme) s / $(cpu nvme) s"
echo "losses none      $(losses none)"
echo "losses nvme      $(losses nvme)"
[ "$(losses none)" = "$(losses nvme)" ] || { echo "FAIL: the losses differ" >&2; exit 1; }
w1=$(mib_of weights "$work/nvme.out")
awk -v a="$r0" -v b="$r1" -v w="$w" -v o="$o0" -v w1="$w1" -v o1="$o1" \
    -v slack="${QLFT_OFFLOAD_RSS_SLACK_MIB:-4}" 'BEGIN {
  need = w + o - w1 - o1 - slack;
  printf "asserted         drop %.1f MiB >= %.1f + %.1f - %.1f - %.2f - %.1f (slack) = %.1f MiB\n",
         a - b, w, o, w1, o1, slack, need;
  exit !(a - b >= need) }' || { echo "FAIL: the RSS drop is below the bound" >&2; exit 1; }
