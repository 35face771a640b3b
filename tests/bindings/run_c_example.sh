#!/usr/bin/env bash
# Runs examples/c/finetune (4 fp32 steps, one thread) into $QLFT_BINDINGS_OUT/c; the adapter
# written there is the reference for the Rust and Go fine-tunes. With a second argument NAME
# (the ASan/LSan build of the example) it writes to $QLFT_BINDINGS_OUT/NAME and must produce
# the same adapter bytes.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/skip.sh"
exe=$1
shared=${QLFT_SHARED_DIR:?}
model=$shared/models/stories260K.gguf
data=$shared/data/tinyshakespeare.txt
if [[ ! -f $model || ! -f $data ]]; then
  qlft_skip shared-missing "$model or $data is absent"
fi
name=${2:-c}
out=${QLFT_BINDINGS_OUT:?}/$name
rm -rf "$out"
mkdir -p "$(dirname "$out")"
"$exe" "$model" "$data" "$out" 4 1
test -s "$out/adapter_model.safetensors"
test -s "$out/adapter_config.json"
if [[ $name != c ]]; then
  cmp "$QLFT_BINDINGS_OUT/c/adapter_model.safetensors" "$out/adapter_model.safetensors"
fi
# A bad model path must fail with the status name and the path in the message.
if "$exe" /nonexistent/model.gguf "$data" "$out.bad" 1 1 2> "$out.err"; then
  echo "FAIL: a missing model file succeeded"; exit 1
fi
grep -q "QLFT_ERR_IO" "$out.err" && grep -q "/nonexistent/model.gguf" "$out.err" || {
  echo "FAIL: unexpected error text:"; cat "$out.err"; exit 1; }
echo "OK"
