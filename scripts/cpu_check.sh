#!/usr/bin/env bash
# The CPU benchmark on a lent machine's host CPU (never CI): bench/e2e.sh, qlft against
# PyTorch+PEFT on 2 pinned cores, for a CPU class the session's own machine is not (issue 19:
# an AMX host when this machine is an AVX2-only Zen 3, say).
#
#   bash scripts/cpu_check.sh pack [BUILD]   here: BUILD (default build-bench, a CPU build with
#                                            bench_kernels) into .cpu/bundle.tar.xz: qlft-finetune,
#                                            bench_kernels, their non-system libraries,
#                                            /usr/bin/time, Shakespeare, the gguf Python package of
#                                            /opt/qlft-ref, and the SmolLM2 GGUF with its tensor
#                                            bytes patterned (bench/make_smollm2_pattern_gguf.py:
#                                            same header, tokenizer, types and shapes; xz packs it)
#   bash scripts/cpu_check.sh run [E2E ARGS]  there (run with carry [".cpu"]): lscpu, then
#                                            bench/e2e.sh pinned to two cores with the
#                                            machine's own python3 (torch, transformers, peft) as
#                                            the peer; E2E ARGS default to
#                                            "--warmup 1 --steps 4 --micro-batch 4". Logs under $OUT.
#   QLFT_CHECK_TESTS (pack): test binaries of BUILD_TESTS (default build) to bundle, default
#   "test_backend_gemm test_backend_ops test_backend_props test_quant_isa test_cpu_isa
#   test_vec_kernels test_amx_gemm" (none needs shared files); run executes each at the machine's own ISA into
#   $OUT/tests.log, so the kernels this CPU class selects (AMX, AVX512-BF16) pass their oracle
#   tests there too.
#   QLFT_CHECK_CORES: the CPUs both sides are pinned to (default: two CPUs after CPU 0 on
#   different physical cores, from lscpu -p).
#   QLFT_CHECK_CAPPED=1 adds a second e2e run capped at AVX-512 without native bf16
#   (QLFT_CPU_ISA=avx512 ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI, fp32 on both sides).
#   QLFT_CHECK_PROFILE=1: the qlft runs write their op profiles (e2e.sh --qlft-profile), packed
#   into $OUT/profiles.tgz (the device tool returns at most 8 files).
#   QLFT_CHECK_BASE=DIR (pack): also bundle DIR's qlft-finetune and libqlft (a build of the
#   revision to compare against, e.g. from `git archive`, configured as BUILD).
#   QLFT_CHECK_AB=N (run): then N rounds alternating that base build and this one, qlft alone
#   (e2e.sh --skip-torch with the first run's peaks), into $OUT/ab.log; QLFT_CHECK_AB_POLICY=1
#   adds a third side, this build with OMP_WAIT_POLICY unset. One call A/Bs a change on a CPU
#   class this machine is not.
#   QLFT_CHECK_KERNELS=REGEX (run): first bench_kernels' benchmarks matching REGEX, pinned, 2
#   threads, 3 repetitions, into $OUT/kernels.log (e.g. 'attention_(fwd|bwd)/512/1/' for the bf16
#   attention tiles, whole against the staircase's steps); QLFT_CHECK_KERNELS_CAPPED=REGEX the
#   same capped as QLFT_CHECK_CAPPED caps, into $OUT/kernels-capped.log.
#   QLFT_CHECK_TUNES='SPEC;SPEC;...' (run): then one qlft-only e2e run per SPEC with the backend
#   tuning QLFT_CPU_TUNE=SPEC ("-": the defaults) and its op profile, tokens/s, attention's
#   times (its tile products too) and the LoRA products' into $OUT/tunes.log; "capped:SPEC" runs capped (as QLFT_CHECK_CAPPED) in fp32.
#   QLFT_CHECK_TUNE_PEAKS / _PEAKS_CAPPED="--peak X --f32-peak Y" skip e2e.sh's peak probes (by
#   default the peaks this call's native / capped e2e run measured, where it ran).
#   QLFT_CHECK_DNNL=1 (run): then one qlft-only e2e run of 1 + 1 steps at the CPU's own ISA with
#   ONEDNN_VERBOSE=1, its oneDNN executions summed by kernel, layouts and shapes
#   (scripts/dnnl_verbose_summary.sh) into $OUT/dnnl.log: which kernel each GEMM of the step
#   gets there (AMX brgemm, gemm:jit) and its time.
#   QLFT_CHECK_NATIVE=0 (run) skips the e2e run at the CPU's own ISA (with QLFT_CHECK_CAPPED=1:
#   the capped one alone); QLFT_CHECK_TESTS_LAST=1 runs the test binaries after everything else.
#
# Where the machine's transformers cannot read the GGUF, the peer loads a SmolLM2-shaped float32
# Hugging Face directory instead (bench/make_shaped_model.py): the same shapes and FLOPs.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:?pack or run}
shift

if [ "$mode" = pack ]; then
  build=${1:-build-bench}
  shared=${QLFT_SHARED_DIR:-../shared}
  ref=${QLFT_REF_VENV:-/opt/qlft-ref}
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/bin" "$stage/lib" "$stage/py" "$stage/data" "$stage/tests"
  cp "$build/tools/qlft-finetune/qlft-finetune" "$build/bench/bench_kernels" /usr/bin/time \
    "$stage/bin/"
  if [ -n "${QLFT_CHECK_BASE:-}" ]; then
    mkdir -p "$stage/base"
    cp "$QLFT_CHECK_BASE/tools/qlft-finetune/qlft-finetune" "$stage/base/"
    cp -L "$QLFT_CHECK_BASE/libqlft.so.0" "$stage/base/"
  fi
  for t in ${QLFT_CHECK_TESTS-test_backend_gemm test_backend_ops test_backend_props test_quant_isa test_cpu_isa test_vec_kernels test_amx_gemm}; do
    cp "${BUILD_TESTS:-build}/tests/$t" "$stage/tests/"
  done
  ldd "$stage"/bin/qlft-finetune "$stage"/bin/bench_kernels "$stage"/tests/* 2>/dev/null |
    awk '/=> \// {print $3}' | sort -u |
    grep -v -E 'libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|ld-linux' |
    xargs -I{} cp -L {} "$stage/lib/"
  # With its dist-info: transformers reads gguf's version from the package metadata and refuses
  # the GGUF without it (InvalidVersion 'N/A'), falling back to the shaped float32 directory.
  cp -r "$ref"/lib/python3*/site-packages/gguf "$ref"/lib/python3*/site-packages/gguf-*.dist-info \
    "$stage/py/"
  "$ref/bin/python" bench/make_smollm2_pattern_gguf.py \
    "${QLFT_SMOLLM2:-/opt/qlft-models/smollm2-135m-instruct-q4_1.gguf}" "$stage/data/smollm2.gguf"
  cp "$shared/data/tinyshakespeare.txt" "$stage/data/"
  mkdir -p .cpu
  tar -C "$stage" -cf - . | xz -9 -T2 > .cpu/bundle.tar.xz
  ls -la .cpu/bundle.tar.xz
  exit 0
fi

[ "$mode" = run ] || { echo "cpu_check: pack or run" >&2; exit 2; }
: "${OUT:?run it through the device tool}"
root=/tmp/qlft-cpu
mkdir -p "$root" && tar -C "$root" -xJf .cpu/bundle.tar.xz
[ -x /usr/bin/time ] || cp "$root/bin/time" /usr/bin/time
lscpu > "$OUT/lscpu.txt"
grep -E '^(Model name|CPU\(s\)|Flags)' "$OUT/lscpu.txt" | cut -c1-400
# The peer keeps the machine's own libraries; the bundle's gguf package is on its path. (e2e.sh
# alone reads OMP_WAIT_POLICY=default, libgomp would reject it.)
printf '#!/bin/sh\nunset LD_LIBRARY_PATH\n[ "$OMP_WAIT_POLICY" != default ] || unset OMP_WAIT_POLICY\nexport PYTHONPATH=%s/py\nexec python3 "$@"\n' "$root" \
  > "$root/peer-python"
chmod +x "$root/peer-python"
"$root/peer-python" -c 'import torch, transformers, peft; print("peer:", torch.__version__, transformers.__version__, peft.__version__)'
model=$root/data/smollm2.gguf
torch_model=()
if ! "$root/peer-python" -c "import sys; from transformers import AutoConfig; AutoConfig.from_pretrained('$root/data', gguf_file='smollm2.gguf')" \
  > "$OUT/gguf_probe.log" 2>&1; then
  echo "transformers cannot read the GGUF here (gguf_probe.log): the peer loads an HF directory"
  "$root/peer-python" bench/make_shaped_model.py "$root/hf" --dtype float32 > "$OUT/make_model.log" 2>&1
  torch_model=(--torch-model "$root/hf")
fi
cores=${QLFT_CHECK_CORES:-$(lscpu -p=CPU,CORE | grep -v '^#' | awk -F, '$1 > 0 && !seen[$2]++ {print $1}' | head -2 | paste -sd,)}
[[ $cores == *,* ]] || cores=0,1
echo "pinned to CPUs $cores"
export LD_LIBRARY_PATH=$root/lib
run_tests() {
  for t in "$root"/tests/*; do
    [ -x "$t" ] || continue
    echo "== $(basename "$t") at this CPU's ISA"
    OMP_WAIT_POLICY=passive QLFT_POISON_UNINIT=1 taskset -c "$cores" "$t" --gtest_brief=1 ||
      echo "FAILED: $(basename "$t")"
  done 2>&1 | tee "$OUT/tests.log" | grep -E '^(==|FAILED|\[  (PASSED|FAILED|SKIPPED))' || true
}
# bench_kernels' benchmarks matching $1 into $OUT/$2.
kernels() {
  # OMP_WAIT_POLICY=default (e2e.sh's word for libgomp's own default) is unset for libgomp.
  local wait_env=(env OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}")
  [ "${OMP_WAIT_POLICY:-}" != default ] || wait_env=(env -u OMP_WAIT_POLICY)
  "${wait_env[@]}" QLFT_BENCH_THREADS=2 taskset -c "$cores" \
    "$root/bin/bench_kernels" --benchmark_filter="$1" --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true 2>&1 | tee "$OUT/$2" | grep -E 'median|rror' || true
}
[ "${QLFT_CHECK_TESTS_LAST:-0}" = 1 ] || run_tests
[ -z "${QLFT_CHECK_KERNELS:-}" ] || kernels "$QLFT_CHECK_KERNELS" kernels.log
if [ -n "${QLFT_CHECK_KERNELS_CAPPED:-}" ]; then
  echo "== capped to AVX-512 without native bf16"
  QLFT_CPU_ISA=avx512 ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI kernels "$QLFT_CHECK_KERNELS_CAPPED" \
    kernels-capped.log
fi
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--warmup 1 --steps 4 --micro-batch 4)
e2e() {
  taskset -c "$cores" bash bench/e2e.sh --model "$model" "${torch_model[@]}" \
    --data "$root/data/tinyshakespeare.txt" --python "$root/peer-python" \
    --qlft "$root/bin/qlft-finetune" --kernels "$root/bin/bench_kernels" "$@"
}
profiles=$root/profiles
# The GEMM peaks an e2e run of this call measured ($1: its log under $OUT), as e2e.sh's
# "--peak X --f32-peak Y"; nothing when there is none.
peaks_of() {
  [ -f "$OUT/$1" ] || return 0
  sed -n 's/^RESULT .*"bf16_peak_gflops": \([0-9.]*\), "f32_peak_gflops": \([0-9.]*\).*/--peak \1 --f32-peak \2/p' "$OUT/$1"
}
prof_args() { [ "${QLFT_CHECK_PROFILE:-0}" = 1 ] && echo "--qlft-profile $profiles/$1" || true; }
# shellcheck disable=SC2046  # prof_args is two words or none
[ "${QLFT_CHECK_NATIVE:-1}" = 0 ] || e2e "${args[@]}" $(prof_args native) 2>&1 | tee "$OUT/e2e.log"
if [ "${QLFT_CHECK_CAPPED:-0}" = 1 ]; then
  # shellcheck disable=SC2046
  QLFT_CPU_ISA=avx512 ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI e2e "${args[@]}" --qlft-precision fp32 \
    --torch fp32 $(prof_args capped) 2>&1 | tee "$OUT/e2e-capped.log"
fi
if [ "${QLFT_CHECK_AB:-0}" -gt 0 ]; then
  [ -x "$root/base/qlft-finetune" ] || { echo "cpu_check: no base build (pack with QLFT_CHECK_BASE)" >&2; exit 2; }
  peaks=$(peaks_of e2e.log)
  sides="base new"
  [ "${QLFT_CHECK_AB_POLICY:-0}" != 1 ] || sides="base new new-unset"
  for r in $(seq 1 "$QLFT_CHECK_AB"); do
    for side in $sides; do
      bin=$root/bin/qlft-finetune lib=$root/lib policy=${OMP_WAIT_POLICY:-passive}
      [ "$side" != base ] || { bin=$root/base/qlft-finetune; lib=$root/base:$root/lib; }
      [ "$side" != new-unset ] || policy=default
      # shellcheck disable=SC2086  # peaks: four words
      tps=$(LD_LIBRARY_PATH=$lib OMP_WAIT_POLICY=$policy e2e "${args[@]}" --skip-torch $peaks \
        --qlft "$bin" 2>&1 | sed -n 's/^RESULT {"sides": \[{"name": "[^"]*", "tps": \([0-9.]*\).*/\1/p') ||
        true
      echo "round $r $side: ${tps:-failed} tokens/s ($(date -u +%H:%M:%S))"
    done
  done | tee "$OUT/ab.log"
fi
if [ -n "${QLFT_CHECK_TUNES:-}" ]; then
  # Each spec a qlft-only e2e run (QLFT_CPU_TUNE=spec, "-" for none) with its op profile; a spec
  # "capped:SPEC" runs capped, in fp32. Peaks: QLFT_CHECK_TUNE_PEAKS and _PEAKS_CAPPED ("--peak X
  # --f32-peak Y"), else e2e.sh measures them each run.
  IFS=';' read -ra tunes <<< "$QLFT_CHECK_TUNES"
  mkdir -p "$profiles"
  i=0
  for tune in "${tunes[@]}"; do
    i=$((i + 1))
    spec=${tune#capped:}
    [ "$spec" != - ] || spec=
    rm -rf "$profiles/tune$i"
    # shellcheck disable=SC2086  # the peaks: four words or none
    res=$(
      extra=()
      peaks=${QLFT_CHECK_TUNE_PEAKS:-$(peaks_of e2e.log)}
      if [[ $tune == capped:* ]]; then
        export QLFT_CPU_ISA=avx512 ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI
        extra=(--qlft-precision fp32)
        peaks=${QLFT_CHECK_TUNE_PEAKS_CAPPED:-$(peaks_of e2e-capped.log)}
      fi
      QLFT_CPU_TUNE="$spec" e2e "${args[@]}" "${extra[@]}" --skip-torch $peaks \
        --qlft-profile "$profiles/tune$i" 2>&1 | tee "$profiles/tune$i.log" |
        sed -n 's/^RESULT {"sides": \[{"name": "[^"]*", "tps": \([0-9.]*\).*/\1/p'
    ) || true
    # The profile's GEMM and attention self times (attention's own and its tile products', by
    # name) and the LoRA products' totals (by path): this host's speed drifts between runs, so a
    # tuning's effect is read against its own run's GEMM time.
    att=$(awk -F'\t' 'NF == 5 && $1 ~ /\/lora_grads$/ {lg += $3} NF == 5 && $1 ~ /\/lora_down$/ {ld += $3}
      NF == 3 && $1 ~ /^gemm\./ {g += $2} NF == 3 && $1 ~ /^(attention|tile_)/ {a = a sprintf("%s %s ms; ", $1, $2)}
      END {printf "gemm %.0f ms (LoRA: lora_grads %.0f, lora_down %.0f); %s", g, lg, ld, a}' \
      "$profiles/tune$i"/*.tsv 2>/dev/null)
    echo "tune $i [$tune]: ${res:-failed} tokens/s; $att($(date -u +%H:%M:%S))"
  done | tee "$OUT/tunes.log"
fi
if [ "${QLFT_CHECK_DNNL:-0}" = 1 ]; then
  # shellcheck disable=SC2086  # the peaks: four words or none
  ONEDNN_VERBOSE=1 e2e --warmup 1 --steps 1 --micro-batch 4 --skip-torch \
    ${QLFT_CHECK_TUNE_PEAKS:-$(peaks_of e2e.log)} --qlft-out "$root/dnnl" > "$root/dnnl-e2e.log" 2>&1 ||
    echo "cpu_check: the verbose run failed (tail of $root/dnnl-e2e.log below)"
  tail -3 "$root/dnnl-e2e.log"
  bash scripts/dnnl_verbose_summary.sh "$root/dnnl/qlft-bf16.out" 60 > "$OUT/dnnl.log" 2>&1 || true
  head -12 "$OUT/dnnl.log"
fi
[ "${QLFT_CHECK_TESTS_LAST:-0}" != 1 ] || run_tests
[ ! -d "$profiles" ] || tar -C "$profiles" -czf "$OUT/profiles.tgz" .
