#!/usr/bin/env bash
# ctest bindings_rust: `cargo test --offline`, the struct layout compared with the C compiler's,
# and the C example's fine-tune repeated from Rust with a byte-identical adapter.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/skip.sh"
src=$1
export PATH=$PATH:${CARGO_HOME:-$HOME/.cargo}/bin
if ! command -v cargo > /dev/null; then
  qlft_skip toolchain-missing "cargo is not installed (scripts/setup.sh installs it)"
fi
cd "$src/bindings/rust"
export CARGO_TARGET_DIR=${QLFT_BINDINGS_OUT:?}/rust-target
out=$QLFT_BINDINGS_OUT/rust
rm -rf "$out" && mkdir -p "$out"
"${QLFT_LAYOUT_C:?}" > "$out/layout_c.txt"
QLFT_LAYOUT_C_OUT=$out/layout_c.txt cargo test --offline
cargo run --offline -q --example layout > "$out/layout_rust.txt"
diff -u "$out/layout_c.txt" "$out/layout_rust.txt"
echo "layout: $(wc -l < "$out/layout_c.txt") lines identical (C vs Rust)"
model=${QLFT_SHARED_DIR:?}/models/stories260K.gguf
data=$QLFT_SHARED_DIR/data/tinyshakespeare.txt
# The adapter is always compared byte for byte with example_c_finetune's (its FIXTURES_SETUP):
# without the data the test skips (fails with CI=true), it never passes uncompared.
[[ -f $model && -f $data ]] || qlft_skip shared-missing "$model or $data is absent"
{
  cargo run --offline -q --example finetune -- "$model" "$data" "$out/adapter" 4 1
  for f in adapter_model.safetensors adapter_config.json; do
    cmp "$QLFT_BINDINGS_OUT/c/$f" "$out/adapter/$f"
  done
  echo "adapter: byte-identical to the C example's"
}
echo OK
