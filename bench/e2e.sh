#!/usr/bin/env bash
# End-to-end LoRA fine-tuning throughput and memory: qlft against PyTorch + PEFT, one after the
# other in the same run, same model, same data, same shape of training step.
#
#   bench/e2e.sh [--steps N] [--warmup W] [--micro-batch B] [--threads T] [--model M.gguf]
#                [--data D.txt] [--torch-model M]
#                [--qlft path/to/qlft-finetune] [--python /opt/qlft-ref/bin/python]
#                [--kernels path/to/bench_kernels | --peak GFLOPS --f32-peak GFLOPS]
#                [--torch "bf16 fp32"] [--torch-extra "ARGS"] [--skip-torch]
#                [--qlft-precision "bf16 fp32"] [--qlft-profile DIR] [--qlft-out DIR]
#
# Needs the reference environment: `bash scripts/setup-reference.sh` creates the venv
# /opt/qlft-ref (torch, transformers, peft) and /opt/qlft-models/smollm2-135m-instruct-q4_1.gguf.
#
# Both sides: SmolLM2-135M-Instruct Q4_1 GGUF (qlft keeps the Q4_1 blocks; transformers
# dequantizes them to float32), tinyshakespeare as one document cut into rows of 512 tokens,
# LoRA r=16 alpha=32 dropout 0 on q,k,v,o,gate,up,down, bf16 autocast, micro-batch B (4) x 512,
# AdamW lr 2e-4, gradient clipping at 1.0, T threads (default 2). The first W steps (default 2)
# are warm-up and not timed; tokens/s is over the next N steps (default 8), optimizer included.
# Tokens per CPU-second (CPU time of the process over the same steps, all threads) is printed
# too: on a machine shared with other work it is the figure that does not depend on the load.
# Peak RSS is the whole process's (/usr/bin/time -v), model loading included.
# --torch-model gives the peer a model of the same shapes where it cannot read the GGUF itself
# (a Hugging Face directory, bench/make_shaped_model.py; scripts/cpu_check.sh on a lent host).
#
# --qlft-profile DIR: each qlft run writes its op profile (QLFT_PROFILE: host wall time per op,
# the steps after the first) to DIR/profile-qlft-<precision>.tsv, and its largest rows by name are
# printed. The instrumentation costs well under 1% of a step (docs/PERFORMANCE.md).
# --qlft-out DIR: each qlft run's stdout and stderr are kept as DIR/qlft-<precision>.out / .err
# (what the run's environment made it print: ONEDNN_VERBOSE's lines, say).
#
# --torch lists the PyTorch configurations to run: bf16 (autocast, the matched configuration)
# and fp32 (no autocast: on a CPU without AVX512-BF16 torch's bf16 GEMMs are emulated and fp32 is
# its faster choice, so an honest comparison includes it). Default: both.
#
# Prints every side, the ratios qlft / torch, the model FLOPs per token and the fraction of the
# machine's measured bf16 GEMM peak (from bench_kernels, or --peak) that each side reaches, and
# of the better of the bf16 and fp32 GEMM peaks. Peaks it measured itself it measures again at
# the end and prints their drift: above 5%, the sides ran at different speeds.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
steps=8
warmup=2
mb=4
threads=2
model=/opt/qlft-models/smollm2-135m-instruct-q4_1.gguf
torch_model=""
data=${QLFT_SHARED_DIR:-$root/../shared}/data/tinyshakespeare.txt
qlft=""
python=/opt/qlft-ref/bin/python
kernels=""
peak=""
f32_peak=""
cpu_peaks="0 0"
torch_cfgs="bf16 fp32"
qlft_cfgs="bf16"
torch_extra=""
skip_torch=0
profile_dir=""
out_dir=""
while (($#)); do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --micro-batch) mb=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --torch-model) torch_model=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --qlft) qlft=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --kernels) kernels=$2; shift 2 ;;
    --peak) peak=$2; shift 2 ;;
    --f32-peak) f32_peak=$2; shift 2 ;;
    --torch) torch_cfgs=$2; shift 2 ;;
    --qlft-precision) qlft_cfgs=$2; shift 2 ;;
    --torch-extra) torch_extra=$2; shift 2 ;;
    --skip-torch) skip_torch=1; shift ;;
    --qlft-profile) profile_dir=$2; shift 2 ;;
    --qlft-out) out_dir=$2; shift 2 ;;
    -h|--help) sed -n 2,39p "$0"; exit 0 ;;
    *) echo "e2e.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
find_exe() {  # first existing build output among the usual build directories
  for d in "$root"/build-bench "$root"/build "$root"/build-*; do
    [ -x "$d/$1" ] && { echo "$d/$1"; return; }
  done
  return 0  # nothing found: empty output (set -e must not end the script here)
}
[ -n "$qlft" ] || qlft=$(find_exe tools/qlft-finetune/qlft-finetune)
[ -n "$kernels" ] || kernels=$(find_exe bench/bench_kernels)
if [ -z "$qlft" ] || [ -z "$kernels" ]; then
  # A fresh machine: install the build dependencies and build the CLI and the kernel benchmark
  # (the peaks) in build-bench, so setup-reference.sh + this script is all it takes.
  echo "== building qlft-finetune and bench_kernels in $root/build-bench"
  bash "$root/scripts/setup.sh"
  cmake -S "$root" -B "$root/build-bench" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DQLFT_BUILD_BENCH=ON >/dev/null
  cmake --build "$root/build-bench" -j "$(nproc)" --target qlft-finetune bench_kernels >/dev/null
  [ -n "$qlft" ] || qlft=$root/build-bench/tools/qlft-finetune/qlft-finetune
  [ -n "$kernels" ] || kernels=$root/build-bench/bench/bench_kernels
fi
for f in "$model" "$data" "$qlft" "$python" ${torch_model:+"$torch_model"}; do
  [ -e "$f" ] || {
    echo "e2e.sh: missing $f (the model and venv: bash scripts/setup-reference.sh)" >&2
    exit 2
  }
done

# Spinning OpenMP workers would steal the cores of whatever else runs; both sides get the same.
# OMP_WAIT_POLICY=default leaves it unset for both: GNU OpenMP's own default (spin a while, then
# sleep), what a program that sets nothing gets (docs/PERFORMANCE.md, "OpenMP's wait policy":
# passive looked 5-17% slower for qlft on a lent VM host, nil for torch).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
[ "$OMP_WAIT_POLICY" != default ] || unset OMP_WAIT_POLICY
work=$(mktemp -d /tmp/qlft-e2e.XXXXXX)
trap 'rm -rf "$work"' EXIT

echo "== machine"
echo "date:    $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "cpu:     $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores visible), $(free -g | awk '/Mem:/{print $2}') GiB"
echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min) at start"
echo "threads: $threads, OMP_WAIT_POLICY=${OMP_WAIT_POLICY-unset}, micro-batch $mb x 512, steps: $warmup warm-up + $steps timed"

# The GEMM peaks into $work/$1 (bench_kernels' probe alone).
probe_peaks() {
  QLFT_BENCH_THREADS=$threads "$kernels" --benchmark_filter='^$' >"$work/$1" 2>&1 || true
  grep 'GEMM peak' "$work/$1" | sed 's/^/  /'
}
peak_of() { sed -n "s/^$1 GEMM peak.*: \([0-9.]*\) GFLOP\/s\$/\1/p" "$work/$2"; }
probed=0
if [ -z "$peak" ]; then
  if [ -n "$kernels" ]; then
    echo "== GEMM peaks ($kernels, nothing else benchmarked)"
    probe_peaks peak.txt
    probed=1
    peak=$(peak_of bf16 peak.txt)
    f32_peak=$(peak_of fp32 peak.txt)
    cpu_peaks=$(sed -n 's/^GEMM peaks per CPU-second.*: bf16 \([0-9.]*\) fp32 \([0-9.]*\) GFLOP\/s$/\1 \2/p' "$work/peak.txt")
  else
    echo "e2e.sh: no bench_kernels found and no --peak given: MFU not computed" >&2
  fi
fi
peak=${peak:-0}
f32_peak=${f32_peak:-0}

total=$((warmup + steps))
qlft_args=()
for cfg in $qlft_cfgs; do
  echo "== qlft, $cfg ($qlft)"
  prof=""
  [ -z "$profile_dir" ] || prof=$(mkdir -p "$profile_dir" && cd "$profile_dir" && pwd)/profile-qlft-$cfg.tsv
  QLFT_PROFILE=$prof /usr/bin/time -v -o "$work/qlft-$cfg.time" "$qlft" train --model "$model" --data "$data" \
    --train.output_dir "$work/qlft-$cfg" --threads "$threads" --quant.type keep \
    --lora.r 16 --lora.alpha 32 --lora.dropout 0 --data.seq_len 512 --data.separator none \
    --data.eval_fraction 0 --train.micro_batch "$mb" --train.accumulation 1 \
    --train.max_steps "$total" --train.precision "$cfg" --optim.name adamw --optim.lr 2e-4 \
    --optim.max_grad_norm 1 >"$work/qlft-$cfg.out" 2>"$work/qlft-$cfg.err" &
  tpid=$!
  # CPU time of the qlft process when step W and the last step are logged: tokens per
  # CPU-second is the figure that survives other work on a shared machine.
  cpu_w="" cpu_n="" qpid=""
  while kill -0 "$tpid" 2>/dev/null; do
    [ -n "$qpid" ] || qpid=$(pgrep -P "$tpid" | head -1 || true)
    n=0
    [ -f "$work/qlft-$cfg/metrics.jsonl" ] && n=$(wc -l <"$work/qlft-$cfg/metrics.jsonl")
    if [ -n "$qpid" ] && [ -r "/proc/$qpid/stat" ]; then
      ticks=$(awk '{print $14 + $15}' "/proc/$qpid/stat" 2>/dev/null || true)
      if [ -n "$ticks" ] && [ -z "$cpu_w" ] && ((n >= warmup)); then cpu_w=$ticks; fi
      if [ -n "$ticks" ] && [ -z "$cpu_n" ] && ((n >= total)); then cpu_n=$ticks; fi
    fi
    sleep 0.2
  done
  status=0
  wait "$tpid" || status=$?
  [ -z "$out_dir" ] || { mkdir -p "$out_dir" && cp "$work/qlft-$cfg.out" "$work/qlft-$cfg.err" "$out_dir/"; }
  [ "$status" = 0 ] || { echo "qlft ($cfg) failed:" >&2; tail -20 "$work/qlft-$cfg.err" >&2; exit 1; }
  cpu_s=""
  [ -n "$cpu_w" ] && [ -n "$cpu_n" ] && cpu_s=$(awk -v a="$cpu_w" -v b="$cpu_n" -v t="$(getconf CLK_TCK)" 'BEGIN{printf "%.3f", (b - a) / t}')
  grep -h '^step ' "$work/qlft-$cfg.err" | sed 's/^/  /'
  # The CLI's memory report (predicted and measured per category, process peak RSS).
  sed -n '/^adapter:/,$p' "$work/qlft-$cfg.out" | tail -n +2 | sed 's/^/  /'
  grep -h 'predicted memory peak' "$work/qlft-$cfg.err" | sed 's/^/  /' || true
  if [ -n "$prof" ]; then
    echo "  op profile ($prof), self time by name, largest first:"
    sed -n '/^by name/,$p' "$prof" | head -16 | sed 's/^/    /'
  fi
  qlft_args+=(--qlft "qlft $cfg:$work/qlft-$cfg/metrics.jsonl:$work/qlft-$cfg.time:${cpu_s:-0}")
done

torch_args=()
if ! ((skip_torch)); then
  for cfg in $torch_cfgs; do
    echo "== PyTorch + PEFT, $cfg ($python bench/peer_torch.py --precision $cfg $torch_extra)"
    # shellcheck disable=SC2086
    /usr/bin/time -v -o "$work/torch-$cfg.time" "$python" "$here/peer_torch.py" --model "${torch_model:-$model}" \
      --data "$data" --seq 512 --micro-batch "$mb" --steps "$steps" --warmup "$warmup" \
      --threads "$threads" --r 16 --alpha 32 --precision "$cfg" $torch_extra \
      >"$work/torch-$cfg.out" 2>"$work/torch-$cfg.err" || {
      echo "torch ($cfg) failed:" >&2; tail -20 "$work/torch-$cfg.err" >&2; exit 1; }
    grep -ah '^torch step' "$work/torch-$cfg.err" | sed 's/^/  /'
    torch_args+=(--torch "torch $cfg:$work/torch-$cfg.out:$work/torch-$cfg.time")
  done
fi

echo "load:    $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min) at the end"
if ((probed)); then
  # Probed again after both sides: on a host whose speed drifts (a lent VM's moved by a third
  # within minutes, docs/PERFORMANCE.md, "Subnormals in attention") sides measured minutes apart
  # ran at different speeds, and the ratios below say so only through this.
  echo "== GEMM peaks again, at the end"
  probe_peaks peak-end.txt
  awk -v b0="$peak" -v f0="$f32_peak" -v b1="$(peak_of bf16 peak-end.txt)" \
    -v f1="$(peak_of fp32 peak-end.txt)" 'BEGIN {
      d = 0
      if (b0 > 0 && b1 > 0) d = (b1 - b0) / b0
      if (f0 > 0 && f1 > 0 && (f1 - f0) / f0 * (f1 - f0) / f0 > d * d) d = (f1 - f0) / f0
      printf "  drift of the peaks over the run: %+.1f%%%s\n", 100 * d,
        (d > 0.05 || d < -0.05) ? " (more than 5%: the sides ran at different speeds)" : ""
    }'
fi
# shellcheck disable=SC2086  # cpu_peaks is two numbers, split on purpose
"$python" "$here/e2e_report.py" --model "$model" --seq 512 --warmup "$warmup" --threads "$threads" \
  "${qlft_args[@]}" "${torch_args[@]}" \
  --peak "$peak" --f32-peak "$f32_peak" --cpu-peaks ${cpu_peaks:-0 0} --r 16
