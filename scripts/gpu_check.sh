#!/usr/bin/env bash
# The device check for a lent GPU machine (never CI): the CUDA build's GPU tests on a real
# device, then bench/gpu_bench.sh (qlft and PyTorch+PEFT on the same card).
#
#   bash scripts/gpu_check.sh pack [BUILD]   here: BUILD (default build-gpu, -DQLFT_CUDA=ON) into
#                                            .gpu/bundle.tar.xz (binaries, the shared libraries
#                                            a bare CUDA image lacks, stories260K, Shakespeare)
#   bash scripts/gpu_check.sh run            there (run with carry [".gpu"]): logs under $OUT
#   bash scripts/gpu_check.sh profile        there: Nsight Compute's duration of 400 consecutive
#                                            kernels in the middle of a bf16 SmolLM2-shape step
#                                            (about two layers), summed per kernel name
#   bash scripts/gpu_check.sh memory         there: the GPU tests, then the device-memory planner
#                                            against the tracker on SmolLM2 shapes (fp32, bf16,
#                                            offload.params/optimizer=cpu) and the loss curves
#                                            against backend=cpu (test_cuda_autotune's
#                                            DISABLED_SmolLM2Shaped*)
#   bash scripts/gpu_check.sh offload        there: qlft alone, bf16 SmolLM2 shapes, resident vs
#                                            offload.params/optimizer=cpu (tokens/s, memory)
#   bash scripts/gpu_check.sh transfers      there: qlft alone on SmolLM2 shapes at micro-batch
#                                            1 x 128 (issue 18's done-when 1 shape), fp32 and
#                                            bf16, printing each step's host<->device traffic
#   bash scripts/gpu_check.sh context        there: issue 47's criterion 4 on Llama-3.1-8B
#                                            shapes (random weights made there), NF4, r 32 on all
#                                            seven, bf16, micro-batch 1, every layer checkpointed:
#                                            the planner's largest context for this card, one step
#                                            at it (planned device peak against the runtime's),
#                                            then offload.params=cpu against resident at seq 2048
#   bash scripts/gpu_check.sh size           there: the GPU tests, then issue 45's criterion 3:
#                                            Llama-3.1-8B shapes (random weights made there),
#                                            NF4, LoRA r 32 on all seven, bf16, seq 2048, against
#                                            PyTorch+PEFT on a bf16 base and on a bitsandbytes
#                                            NF4 base; then SmolLM2 shapes (MFU)
#
# The 98 MB SmolLM2 GGUF cannot travel (64 MiB per call), so the benchmark builds a
# SmolLM2-135M-shaped model with random weights there (bench/make_shaped_model.py).
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:?pack or run}

if [ "$mode" = pack ]; then
  set -e
  build=${2:-build-gpu}
  shared=${QLFT_SHARED_DIR:-../shared}
  stage=$(mktemp -d)
  mkdir -p "$stage/bin" "$stage/lib" "$stage/tools/qlft-finetune" "$stage/shared/models" \
    "$stage/shared/data"
  # Every GPU test binary the build made (test_cuda_*; the emulator's own tests are not built
  # with -DQLFT_CUDA=ON).
  for t in "$build"/tests/cuda/test_cuda_*; do
    [ -x "$t" ] && cp "$t" "$stage/bin/"
  done
  cp "$build/tools/qlft-finetune/qlft-finetune" "$stage/tools/qlft-finetune/"
  cp -L "$build/libqlft.so.0" "$stage/lib/"
  # Every non-system library the binaries need except the CUDA ones (the image has those).
  ldd "$stage"/bin/* "$stage/lib/libqlft.so.0" | awk '/=> \// {print $3}' | sort -u |
    grep -v -E 'libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|ld-linux|libcublas|libnccl|libcuda' |
    xargs -I{} cp -L {} "$stage/lib/"
  cp "$shared/models/stories260K.gguf" "$stage/shared/models/"
  cp "$shared/data/tinyshakespeare.txt" "$stage/shared/data/"
  mkdir -p .gpu
  tar -C "$stage" -cJf .gpu/bundle.tar.xz .
  rm -rf "$stage"
  ls -la .gpu/bundle.tar.xz
  exit 0
fi

case "$mode" in run | memory | offload | transfers | profile | size | context) ;; *) echo "gpu_check: pack, run, memory, offload, transfers, profile, size or context" >&2; exit 2 ;; esac
: "${OUT:?run it through the device tool}"
root=/tmp/qlft-gpu
mkdir -p "$root" && tar -C "$root" -xJf .gpu/bundle.tar.xz
cublas=$(find /usr/local /opt -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
# python (torch) keeps the image's own libraries: the peer runs without the bundle's path.
printf '#!/bin/sh\nunset LD_LIBRARY_PATH\nexec python3 "$@"\n' > /tmp/peer-python
chmod +x /tmp/peer-python
python3 bench/make_shaped_model.py /tmp/smol > "$OUT/make_model.log" 2>&1 &
make_model=$!
export LD_LIBRARY_PATH=$root/lib:$(dirname "${cublas:-/x}")
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/device.txt"
export QLFT_SHARED_DIR=$root/shared QLFT_REQUIRE_SHARED=1 QLFT_REQUIRE_GPU=1 QLFT_SOURCE_DIR=$PWD
if [ "$mode" = profile ]; then
  wait "$make_model" || tail -5 "$OUT/make_model.log"
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  s=$(date +%s)
  timeout 400 "$ncu" --launch-skip 6000 --launch-count 400 --metrics gpu__time_duration.sum --print-units base --csv \
    "$root/tools/qlft-finetune/qlft-finetune" train --model /tmp/smol \
    --data "$root/shared/data/tinyshakespeare.txt" --backend cuda --train.precision bf16 \
    --quant.type nf4 --train.micro_batch 8 --data.seq_len 512 --train.max_steps 2 \
    --train.save_every 0 --train.output_dir /tmp/profile > "$OUT/ncu.csv" 2> "$OUT/ncu.log"
  echo "ncu rc=$? $(( $(date +%s) - s ))s"
  python3 - "$OUT/ncu.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]; rows = rows[1:]
ki, mi, vi = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
tot = collections.defaultdict(float); cnt = collections.Counter()
for r in rows:
    if r[mi] != "gpu__time_duration.sum": continue
    name = r[ki].split("(")[0].split("<")[0][:60]
    tot[name] += float(r[vi].replace(",", "")); cnt[name] += 1
all_ns = sum(tot.values())
print(f"{sum(cnt.values())} kernels, {all_ns / 1e3:.0f} us of kernel time")
for n, t in sorted(tot.items(), key=lambda kv: -kv[1])[:18]:
    print(f"{t / 1e3:9.1f} us {100 * t / all_ns:5.1f}% {cnt[n]:4d}x {n}")
PY
  exit 0
fi
if [ "$mode" = offload ]; then
  # qlft alone, bf16, SmolLM2 shapes: resident, then offload.params=cpu + offload.optimizer=cpu.
  wait "$make_model" || tail -5 "$OUT/make_model.log"
  for extra in "" "--offload.params cpu --offload.optimizer cpu" "--offload.params cpu"; do
    echo "bf16 ${extra:-(resident)}:"
    QLFT_CUDA_BUILD=$root PEER_PYTHON=none QLFT_EXTRA="$extra" MICRO_BATCH=${MICRO_BATCH:-8} \
      timeout 200 bash bench/gpu_bench.sh /tmp/smol "$root/shared/data/tinyshakespeare.txt" \
      "${STEPS:-8}" 2>&1 | grep -E "tokens/s|peak device|runtime peak"
  done
  exit 0
fi
if [ "$mode" = context ]; then
  cli=$root/tools/qlft-finetune/qlft-finetune
  model=/tmp/shaped-llama-3.1-8b
  s=$(date +%s)
  [ -f "$model/config.json" ] || /tmp/peer-python bench/make_shaped_model.py "$model" \
    --shape llama-3.1-8b > "$OUT/make_8b.log" 2>&1 || { tail -5 "$OUT/make_8b.log"; exit 1; }
  echo "8B model made in $(( $(date +%s) - s ))s"
  # The budget: the card's memory less 2 GiB for the context and the driver.
  limit=$(( $(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1) - 2048 ))MiB
  plan=(--backend cuda --memory.limit "$limit" --lora.r 32 --lora.alpha 64 --quant.type nf4
        --train.precision bf16 --train.grad_checkpointing 1 --train.micro_batch 1)
  "$cli" estimate --model "$model" "${plan[@]}" > "$OUT/estimate.txt" 2>&1
  ctx=$(sed -n 's/^largest context within .* at micro-batch 1: \([0-9]*\) tokens.*/\1/p' "$OUT/estimate.txt")
  echo "memory.limit $limit: planned largest context ${ctx:-none}"
  [ -n "$ctx" ] || { cat "$OUT/estimate.txt"; exit 1; }
  "$cli" estimate --model "$model" "${plan[@]}" --data.seq_len "$ctx" > "$OUT/estimate_ctx.txt" 2>&1
  grep -E "^(device step|host step|checkpointed)" "$OUT/estimate_ctx.txt"
  # Enough text for one sequence of ctx tokens (random weights: any text serves).
  for i in 1 2 3 4 5 6; do cat "$root/shared/data/tinyshakespeare.txt"; done > /tmp/long.txt
  s=$(date +%s)
  timeout 540 "$cli" train --model "$model" --data /tmp/long.txt "${plan[@]}" --data.seq_len "$ctx" \
    --train.max_steps 1 --train.save_every 0 --train.output_dir /tmp/ctx-run > "$OUT/ctx_train.log" 2>&1
  echo "one step at $ctx tokens: rc=$? $(( $(date +%s) - s ))s"
  # The step's line: loss, the tracker's peaks by category ("mem_peak") beside the plan above.
  grep '"step"' /tmp/ctx-run/metrics.jsonl 2>/dev/null | head -c 4000; echo
  tail -3 "$OUT/ctx_train.log"
  for extra in "" "--offload.params cpu"; do
    echo "8B, seq 2048, ${extra:-(resident)}:"
    QLFT_CUDA_BUILD=$root PEER_PYTHON=none QLFT_EXTRA="$extra" LORA_R=32 SEQ=2048 MICRO_BATCH=1 \
      timeout 240 bash bench/gpu_bench.sh --shape llama-3.1-8b \
      "$root/shared/data/tinyshakespeare.txt" "${STEPS:-8}" 2>&1 | grep -E "tokens/s|peak device"
  done
  exit 0
fi
if [ "$mode" = transfers ]; then
  wait "$make_model" || tail -5 "$OUT/make_model.log"
  for precision in fp32 bf16; do
    "$root/tools/qlft-finetune/qlft-finetune" train --model /tmp/smol \
      --data "$root/shared/data/tinyshakespeare.txt" --backend cuda --train.precision "$precision" \
      --quant.type nf4 --train.micro_batch 1 --data.seq_len 128 --train.max_steps 4 \
      --train.save_every 0 --train.output_dir "/tmp/transfers-$precision" > /dev/null 2>&1 ||
      echo "train ($precision) failed"
    echo "$precision, micro-batch 1 x 128:"
    grep -o '"step": [0-9]*\|"h2d_bytes": [0-9]*, "d2h_bytes": [0-9]*, "device_syncs": [0-9]*' \
      "/tmp/transfers-$precision/metrics.jsonl" | paste - -
  done
  exit 0
fi
# SKIP_TESTS=1: straight to the mode's benchmark (the tests passed in an earlier call).
for tb in "$root"/bin/test_cuda_*; do
  [ -n "${SKIP_TESTS:-}" ] && break
  t=$(basename "$tb")
  s=$(date +%s)
  timeout 200 "$tb" > "$OUT/$t.log" 2>&1
  echo "$t rc=$? $(( $(date +%s) - s ))s $(grep -c '^\[       OK' "$OUT/$t.log") ok"
  grep -E '^\[  (FAILED|SKIPPED) ' "$OUT/$t.log" | sort -u | head -20
done
if [ "$mode" = size ]; then
  # The 8B model is made on this machine (16 GB of bf16 safetensors on its disk; nothing travels).
  wait "$make_model" || tail -5 "$OUT/make_model.log"
  s=$(date +%s)
  echo "Llama-3.1-8B shapes, NF4, r 32, bf16, seq 2048, micro-batch ${MICRO_BATCH_8B:-1}:"
  QLFT_CUDA_BUILD=$root PEER_PYTHON=/tmp/peer-python PEER_BASES="bfloat16 nf4" LORA_R=32 \
    SEQ=2048 MICRO_BATCH=${MICRO_BATCH_8B:-1} timeout 420 bash bench/gpu_bench.sh \
    --shape llama-3.1-8b "$root/shared/data/tinyshakespeare.txt" "${STEPS:-10}" 2>&1 |
    tee "$OUT/gpu_bench_8b.log"
  echo "8B bench $(( $(date +%s) - s ))s"
  echo "SmolLM2 shapes, NF4, r 16, bf16, seq 512, micro-batch 8 (qlft alone):"
  QLFT_CUDA_BUILD=$root PEER_PYTHON=none timeout 120 bash bench/gpu_bench.sh /tmp/smol \
    "$root/shared/data/tinyshakespeare.txt" "${STEPS:-10}" 2>&1 | grep -E "tokens/s|MFU|launches"
  exit 0
fi
if [ "$mode" = memory ]; then
  wait "$make_model" || tail -5 "$OUT/make_model.log"
  s=$(date +%s)
  QLFT_SMOL_DIR=/tmp/smol timeout 300 "$root/bin/test_cuda_autotune" --gtest_also_run_disabled_tests \
    --gtest_filter='*SmolLM2Shaped*' > "$OUT/smol_memory.log" 2>&1
  echo "SmolLM2-shaped memory rc=$? $(( $(date +%s) - s ))s"
  grep -E 'micro-batch|step [0-9]:|FAILED|OK \]|Failure|Expected|Which is|actual' "$OUT/smol_memory.log" | head -60
  exit 0
fi
s=$(date +%s)
wait "$make_model" || tail -5 "$OUT/make_model.log"
mkdir -p "$OUT/bench"
GPU_BENCH_KEEP=$OUT/bench QLFT_CUDA_BUILD=$root PEER_PYTHON=/tmp/peer-python MICRO_BATCH=${MICRO_BATCH:-8} \
  timeout 300 bash bench/gpu_bench.sh /tmp/smol "$root/shared/data/tinyshakespeare.txt" \
  "${STEPS:-10}" 2>&1 | tee "$OUT/gpu_bench.log"
echo "bench $(( $(date +%s) - s ))s"
# fp32 GEMMs, exact and on TF32 tensor cores (qlft only).
for extra in "" "--cuda.tf32 true"; do
  echo "fp32 ${extra:-(exact)}:"
  QLFT_CUDA_BUILD=$root PEER_PYTHON=none PRECISION=fp32 QLFT_EXTRA="$extra" \
    MICRO_BATCH=${MICRO_BATCH:-8} timeout 200 bash bench/gpu_bench.sh /tmp/smol \
    "$root/shared/data/tinyshakespeare.txt" "${STEPS:-10}" 2>&1 | grep -E "tokens/s|MFU"
done
grep -o "\"h2d_bytes\": [0-9]*, \"d2h_bytes\": [0-9]*, \"device_syncs\": [0-9]*" "$OUT/bench/qlft_metrics.jsonl" | head -3
