#!/usr/bin/env bash
# Source rules of the CUDA backend (see cuda/src/check.h), checked by grep so they hold in CPU-only
# CI too:
#  1. no cudaMalloc* / cudaFree outside allocator.cu (device memory is accounted);
#  2. every <<<...>>> launch is followed within 2 lines by QLFT_CUDA_CHECK(cudaGetLastError());
#  3. every call of a cuda* / cublasLt* function is wrapped in QLFT_CUDA_CHECK, QLFT_CUDA_WARN or
#     QLFT_CUBLAS_CHECK / QLFT_CUBLAS_WARN on the same line, or assigns its status to a
#     `cudaError_t` / `cublasStatus_t` that the code then inspects, or passed straight to a
#     file-local `void cuda(cudaError_t, ...)` checker. Allowed bare: the error-string
#     helpers and `(void)cudaGetLastError()` (clearing a sticky error already handled).
# Comments are ignored. Exit 0 when clean, 1 with the offending lines otherwise.
set -uo pipefail
dir=${1:?usage: check_cuda_sources.sh cuda/src}
fail=0
report() {
  echo "check_cuda_sources: $1" >&2
  fail=1
}

shopt -s nullglob
files=("$dir"/*.cu "$dir"/*.cuh "$dir"/*.h "$dir"/*.cpp)
[ ${#files[@]} -gt 0 ] || { echo "check_cuda_sources: no sources in $dir" >&2; exit 1; }

for f in "${files[@]}"; do
  base=$(basename "$f")
  # Strip // comments, keep line numbers.
  code=$(sed -e 's://.*$::' "$f")

  if [ "$base" != allocator.cu ]; then
    while IFS= read -r hit; do
      [ -n "$hit" ] && report "$base:$hit: raw device allocation outside allocator.cu"
    done < <(printf '%s\n' "$code" | grep -nE '\bcuda(Malloc|MallocManaged|MallocAsync|MallocHost|Free|FreeAsync|FreeHost)\b' || true)
  fi

  # Rule 2: launches.
  mapfile -t lines < <(printf '%s\n' "$code")
  for i in "${!lines[@]}"; do
    if [[ "${lines[$i]}" == *'<<<'* ]]; then
      next="${lines[$((i + 1))]:-} ${lines[$((i + 2))]:-}"
      if [[ "$next" != *'QLFT_CUDA_CHECK(cudaGetLastError())'* ]]; then
        report "$base:$((i + 1)): kernel launch not followed by QLFT_CUDA_CHECK(cudaGetLastError())"
      fi
    fi
  done

  # Rule 3: every call wrapped.
  local_checker=$(printf '%s\n' "$code" | grep -E 'void cuda\(cudaError_t' || true)
  while IFS= read -r hit; do
    [ -z "$hit" ] && continue
    num=${hit%%:*}
    text=${hit#*:}
    # Each call on the line must be preceded directly by a checking macro or an inspected status.
    rest="$text"
    while [[ "$rest" =~ (cuda|cublasLt)[A-Z][A-Za-z0-9_]*[[:space:]]*\( ]]; do
      call=${BASH_REMATCH[0]}
      name=${call%%(*}
      name=${name%% *}
      before=${rest%%"$call"*}
      rest=${rest#*"$call"}
      case "$name" in
        cudaGetErrorName | cudaGetErrorString | cublasLtGetStatusString) continue ;;
      esac
      if [[ "$before" =~ (QLFT_CUDA_CHECK|QLFT_CUDA_WARN|QLFT_CUBLAS_CHECK|QLFT_CUBLAS_WARN)\($ ]]; then
        continue
      fi
      # A call wrapped onto the line after its macro (clang-format): `QLFT_CUDA_CHECK(` ends the
      # previous line and nothing precedes the call on this one.
      prev="${lines[$((num - 2))]:-}"
      if [[ "$before" =~ ^[[:space:]]*$ && "$prev" =~ (QLFT_CUDA_CHECK|QLFT_CUDA_WARN|QLFT_CUBLAS_CHECK|QLFT_CUBLAS_WARN)\([[:space:]]*$ ]]; then
        continue
      fi
      if [[ "$before" =~ (cudaError_t|cublasStatus_t)[[:space:]]+[A-Za-z_][A-Za-z0-9_]*[[:space:]]*=[[:space:]]*$ ]]; then
        continue
      fi
      # A file-local checker `void cuda(cudaError_t e, ...)` that throws (comm_nccl.cu) counts
      # as a check when the file defines it.
      if [[ -n "$local_checker" && "$before" =~ (^|[^A-Za-z0-9_])cuda\($ ]]; then
        continue
      fi
      if [[ "$name" == cudaGetLastError && "$before" =~ \(void\)$ ]]; then
        continue
      fi
      report "$base:$num: unchecked call $name(...)"
    done
  done < <(printf '%s\n' "$code" | grep -nE '(cuda|cublasLt)[A-Z][A-Za-z0-9_]*[[:space:]]*\(' || true)
done

if [ $fail -ne 0 ]; then
  echo "check_cuda_sources: FAILED" >&2
  exit 1
fi
echo "check_cuda_sources: ${#files[@]} files clean"
