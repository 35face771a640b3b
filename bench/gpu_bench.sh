#!/usr/bin/env bash
# GPU training benchmark (backend=cuda), ready for the first machine with a device; not run in CI.
#
#   bench/gpu_bench.sh [MODEL] [DATA] [STEPS]
#     MODEL  a GGUF file or a Hugging Face directory; default
#            /opt/qlft-models/smollm2-135m-instruct-q4_1.gguf (a machine that cannot be sent it
#            uses bench/make_shaped_model.py: same shapes, random weights)
#     DATA   default ../shared/data/tinyshakespeare.txt
#     STEPS  default 30 (the first 5 are warm-up and not counted)
#   bench/gpu_bench.sh --shape NAME [DATA] [STEPS]
#     a model of NAME's shapes (bench/make_shaped_model.py: smollm2-135m, llama-3.1-8b) with
#     random weights, made on this machine (nothing large travels) into /tmp/shaped-NAME
#   Env: QLFT_CUDA_BUILD (default build-cuda), PRECISION (bf16), MICRO_BATCH (8), SEQ (512),
#        LORA_R (16), PEER_BASES ("bfloat16"; "bfloat16 nf4" also runs PyTorch+PEFT on a
#        bitsandbytes NF4 base, the QLoRA / Unsloth baseline, where bitsandbytes imports),
#        QUANT (nf4), PEAK_TFLOPS (the device's dense bf16 peak; default from the device name
#        below), PEER_PYTHON (a python with torch + transformers + peft; default python3; set
#        PEER_PYTHON=none to skip the PyTorch+PEFT side), QLFT_EXTRA (more qlft-finetune
#        options, e.g. "--cuda.tf32 true").
#
# Reports tokens/s (mean over the counted steps, from metrics.jsonl), peak device memory
# (nvidia-smi memory.used sampled every 200 ms, and the runtime's own peak), and MFU:
#   model FLOPs per token = 4 * N + 6 * L * S * D
# (frozen quantized base: forward 2N plus the input gradient 2N; causal attention forward and
# backward 6 * S * D per layer; LoRA and recomputation under checkpointing not counted), divided
# by the device's dense bf16 tensor-core peak.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --shape ]; then
  shape=${2:?--shape NAME}
  shift 2
  model=/tmp/shaped-$shape
  [ -f "$model/config.json" ] || ${PEER_PYTHON:-python3} bench/make_shaped_model.py "$model" \
    --shape "$shape" >&2 || { echo "gpu_bench: could not make $model" >&2; exit 1; }
else
  model=${1:-/opt/qlft-models/smollm2-135m-instruct-q4_1.gguf}
  shift || true
fi
data=${1:-../shared/data/tinyshakespeare.txt}
steps=${2:-30}
build=${QLFT_CUDA_BUILD:-build-cuda}
precision=${PRECISION:-bf16}
mb=${MICRO_BATCH:-8}
seq=${SEQ:-512}
quant=${QUANT:-nf4}
lora_r=${LORA_R:-16}
peer_python=${PEER_PYTHON:-python3}
cli=$build/tools/qlft-finetune/qlft-finetune
command -v nvidia-smi >/dev/null || { echo "gpu_bench: nvidia-smi not found (no GPU here)" >&2; exit 77; }
[ -x "$cli" ] || { echo "gpu_bench: build $cli first (-DQLFT_CUDA=ON)" >&2; exit 1; }
"$cli" version | grep "cuda=1" >/dev/null || { echo "gpu_bench: $cli was built without CUDA" >&2; exit 1; }

name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [ -z "${PEAK_TFLOPS:-}" ]; then
  case "$name" in  # dense bf16 tensor-core peaks (vendor data sheets)
    *H200* | *H100*SXM* | *"H100 80GB HBM3"*) PEAK_TFLOPS=989 ;;
    *H100*PCIe* | *H100*) PEAK_TFLOPS=756 ;;
    *A100*) PEAK_TFLOPS=312 ;;
    *L40S*) PEAK_TFLOPS=362 ;;
    *A10G*) PEAK_TFLOPS=70 ;;
    *RTX\ 4090*) PEAK_TFLOPS=165 ;;
    *) echo "gpu_bench: unknown bf16 peak for '$name'; set PEAK_TFLOPS" >&2; exit 1 ;;
  esac
fi

out=$(mktemp -d)
export OUTDIR=$out
trap 'kill "$smi" 2>/dev/null || true; rm -rf "$out"' EXIT
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$out/smi.txt" &
smi=$!

"$cli" train --model "$model" --data "$data" --backend cuda --train.precision "$precision" \
  --quant.type "$quant" --train.micro_batch "$mb" --data.seq_len "$seq" --train.max_steps "$steps" \
  --train.save_every 0 --lora.r "$lora_r" --lora.alpha $((2 * lora_r)) \
  --train.output_dir "$out/run" ${QLFT_EXTRA:-} 2> "$out/train.log" || {
  tail -20 "$out/train.log" >&2
  exit 1
}
kill "$smi" 2>/dev/null || true

info=$("$cli" inspect "$model")
N=$(awk '/^parameters/ {print $2}' <<< "$info")
L=$(awk '/^layers/ {print $2}' <<< "$info")
D=$(awk '/^dim/ {print $2}' <<< "$info")

awk -v N="$N" -v L="$L" -v D="$D" -v S="$seq" -v peak="$PEAK_TFLOPS" -v name="$name" \
    -v smi="$out/smi.txt" '
  BEGIN { m = 0; while ((getline l < smi) > 0) if (l + 0 > m) m = l + 0 }
  {
    match($0, /"step": [0-9]+/); step = substr($0, RSTART + 8, RLENGTH - 8) + 0
    match($0, /"tokens": [0-9]+/); tok = substr($0, RSTART + 10, RLENGTH - 10) + 0
    match($0, /"elapsed_s": [0-9.]+/); el = substr($0, RSTART + 13, RLENGTH - 13) + 0
    match($0, /"memory_peak_bytes": [0-9]+/); mp = substr($0, RSTART + 21, RLENGTH - 21) + 0
    if (step == 5) { t0 = el; k0 = tokens }
    tokens += tok; last = el; lastk = tokens; peakrt = mp
  }
  END {
    tps = (lastk - k0) / (last - t0)
    fpt = 4 * N + 6 * L * S * D
    printf "device          %s (bf16 peak %d TFLOP/s)\n", name, peak
    printf "tokens/s        %.0f (steps 6..end)\n", tps
    printf "FLOPs/token     %.3g (4N + 6LSD, N=%d L=%d S=%d D=%d)\n", fpt, N, L, S, D
    printf "MFU             %.2f%%\n", 100 * tps * fpt / (peak * 1e12)
    printf "peak device mem %d MiB (nvidia-smi), runtime peak %.1f MiB\n", m, mp / 1048576
    printf "QLFT tps=%.1f mfu=%.4f smi_mib=%d\n", tps, tps * fpt / (peak * 1e12), m > (ENVIRON["OUTDIR"] "/qlft.txt")
    printf "%.6g\n", fpt > (ENVIRON["OUTDIR"] "/fpt.txt")
  }' "$out/run/metrics.jsonl"
[ -n "${GPU_BENCH_KEEP:-}" ] && cp "$out/run/metrics.jsonl" "$GPU_BENCH_KEEP/qlft_metrics.jsonl"

# ---- PyTorch + PEFT on the same device: bf16 base weights (bitsandbytes 4-bit where installed
# is not used: the comparison is the plain bf16 LoRA a PEFT user runs first), LoRA r 16 on all
# seven projections, autocast bf16, fused AdamW, same data and shapes.
# Kernel launches the host submitted per step (metrics.jsonl "launches", where the build counts them).
grep -o '"launches": [0-9]*' "$out/run/metrics.jsonl" | tail -1 | sed 's/.*: /launches\/step    /'
[ "$peer_python" = none ] && exit 0
for base in ${PEER_BASES:-bfloat16}; do
  if [ "$base" = nf4 ] && ! "$peer_python" -c "import bitsandbytes" 2>/dev/null; then
    echo "torch+peft nf4  skipped: bitsandbytes does not import here"
    continue
  fi
  "$peer_python" bench/peer_torch.py --device cuda --model "$model" --data "$data" --seq "$seq" \
    --micro-batch "$mb" --warmup 5 --steps $((steps - 5)) --base-dtype "$base" --precision bf16 \
    --r "$lora_r" --alpha $((2 * lora_r)) > "$out/peer.txt" 2> "$out/peer.log" ||
    { tail -20 "$out/peer.log" >&2; exit 1; }
  res=$(sed -n 's/^RESULT //p' "$out/peer.txt")
  [ -n "${GPU_BENCH_KEEP:-}" ] && echo "$res" > "$GPU_BENCH_KEEP/peer_result_$base.json"
  "$peer_python" - "$res" "$(cat "$out/fpt.txt")" "$PEAK_TFLOPS" "$(cat "$out/qlft.txt")" "$base" <<'PY'
import json, sys
r = json.loads(sys.argv[1]); fpt = float(sys.argv[2]); peak = float(sys.argv[3])
q = dict(kv.split("=") for kv in sys.argv[4].split()[1:])
tps = r["tokens_per_s"]
print(f"torch+peft {sys.argv[5]:<9s} {tps:.0f} tokens/s, MFU {100 * tps * fpt / (peak * 1e12):.2f}%, "
      f"peak device mem {r['peak_device_bytes'] / 2**20:.0f} MiB (torch {r['torch']})")
print(f"qlft / torch+peft {sys.argv[5]}: tokens/s {float(q['tps']) / tps:.3f}x")
PY
done
