#!/usr/bin/env bash
# dist.backend=mpi where the MPI plugin is not installed (QLFT_MPI_PLUGIN pointing at a file that
# does not exist): the CLI fails with an error naming the plugin file, the loader's reason and
# how to provide it, before training anything. usage: plugin_absent.sh QLFT_FINETUNE SHARED_DIR
set -euo pipefail
cli=$1 shared=$2
model="$shared/models/stories260K.gguf"
text="$shared/data/tinyshakespeare.txt"
source "$(dirname "$0")/../support/skip.sh"
[ -f "$model" ] && [ -f "$text" ] || qlft_skip shared-missing "shared data not found ($model, $text)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
head -c 20000 "$text" >"$work/data.txt"
missing="$work/not-installed/libqlft-mpi.so"
if QLFT_MPI_PLUGIN=$missing "$cli" train --model "$model" --data "$work/data.txt" --threads 1 \
  --data.seq_len 32 --train.max_steps 1 --dist.backend mpi --train.output_dir "$work/out" \
  >"$work/out.txt" 2>"$work/err.txt"; then
  echo "train with dist.backend=mpi succeeded without the MPI plugin" >&2
  exit 1
fi
cat "$work/err.txt"
grep -qF "$missing" "$work/err.txt" || { echo "the error does not name the plugin file" >&2; exit 1; }
grep -q "No such file" "$work/err.txt" || { echo "the error lacks dlopen's reason" >&2; exit 1; }
grep -q "QLFT_MPI_PLUGIN" "$work/err.txt" || { echo "the error does not say how to point at it" >&2; exit 1; }
! grep -q '^step ' "$work/err.txt" || { echo "a step ran before the error" >&2; exit 1; }
echo "dist.backend=mpi without the plugin: clear error"
