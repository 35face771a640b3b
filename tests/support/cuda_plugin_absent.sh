#!/usr/bin/env bash
# The CUDA backend is a plugin (libqlft-cuda.so, src/backend/cuda_plugin.h). Where it cannot be
# loaded (absent, or a library it needs missing: here a fake plugin whose dependency is on no
# search path, as on a machine without the CUDA libraries) the same libqlft trains with
# backend=cpu, says cuda=0 in `version`, and refuses backend=cuda with an error naming the plugin
# file, the missing library and QLFT_CUDA_PLUGIN (dist.backend=nccl, which needs backend=cuda,
# takes the same path: DistComm.UnknownBackendIsAnError). Where the build made
# the real plugin (HAVE_PLUGIN=1) the CLI finds it beside libqlft with no variable set: cuda=1.
# usage: cuda_plugin_absent.sh QLFT_FINETUNE SHARED_DIR FAKE_PLUGIN HAVE_PLUGIN
set -euo pipefail
cli=$1 shared=$2 fake=$3 have_plugin=$4
model="$shared/models/stories260K.gguf"
text="$shared/data/tinyshakespeare.txt"
source "$(dirname "$0")/skip.sh"
[ -f "$model" ] && [ -f "$text" ] || qlft_skip shared-missing "shared data not found ($model, $text)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
head -c 20000 "$text" >"$work/data.txt"
train() {
  "$cli" train --model "$model" --data "$work/data.txt" --threads 1 --data.seq_len 32 \
    --train.max_steps 1 --train.output_dir "$work/out-$RANDOM" "$@"
}

# The fake plugin's dependency is really missing (else the test below proves nothing).
if ldd "$fake" | grep -q 'libqlft_fake_cudart.so => /'; then
  echo "the fake plugin's dependency was found: $(ldd "$fake")" >&2
  exit 1
fi

export QLFT_CUDA_PLUGIN=$fake
"$cli" version | tee "$work/version.txt"
grep -q ' cuda=0 ' "$work/version.txt" || { echo "version does not say cuda=0" >&2; exit 1; }
train --backend cpu >"$work/cpu.txt" 2>&1 || { cat "$work/cpu.txt"; echo "backend=cpu failed" >&2; exit 1; }
grep -q '^step 1' "$work/cpu.txt" || { cat "$work/cpu.txt"; echo "backend=cpu ran no step" >&2; exit 1; }
echo "backend=cpu trains without the CUDA libraries"
for what in "--backend cuda" "--backend cuda --dist.backend nccl"; do
  # shellcheck disable=SC2086
  if train $what >"$work/out.txt" 2>"$work/err.txt"; then
    echo "train $what succeeded without the CUDA libraries" >&2
    exit 1
  fi
  cat "$work/err.txt"
  grep -qF "$fake" "$work/err.txt" || { echo "the error does not name the plugin file" >&2; exit 1; }
  grep -q "libqlft_fake_cudart.so" "$work/err.txt" ||
    { echo "the error does not name the missing library" >&2; exit 1; }
  grep -q "QLFT_CUDA_PLUGIN" "$work/err.txt" || { echo "the error does not say how to point at it" >&2; exit 1; }
  ! grep -q '^step ' "$work/out.txt" || { echo "a step ran before the error" >&2; exit 1; }
done
QLFT_CUDA_PLUGIN=$work/none/libqlft-cuda.so train --backend cuda >"$work/out.txt" 2>"$work/err.txt" &&
  { echo "backend=cuda succeeded with no plugin" >&2; exit 1; }
grep -q "No such file" "$work/err.txt" || { cat "$work/err.txt"; echo "no dlopen reason for an absent plugin" >&2; exit 1; }
echo "backend=cuda without the CUDA libraries: clear errors"

if [ "$have_plugin" = 1 ]; then
  unset QLFT_CUDA_PLUGIN
  "$cli" version | grep -q ' cuda=1 ' || { "$cli" version; echo "the built plugin is not found beside libqlft" >&2; exit 1; }
  echo "the plugin beside libqlft loads: cuda=1"
fi
