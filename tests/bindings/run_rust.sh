#!/usr/bin/env bash
# ctest bindings_rust: `cargo test --offline`, the struct layout compared with the C compiler's,
# the C example's fine-tune repeated from Rust with a byte-identical adapter, and a real run's
# metrics records read through the crate equal to the C API's (metrics_c_run).
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
model=${QLFT_SHARED_DIR:?}/models/stories260K.gguf
data=$QLFT_SHARED_DIR/data/tinyshakespeare.txt
# metrics_c_run (a FIXTURES_SETUP) wrote a real run's metrics.jsonl and the C API's reading of
# it; the tests read it through the binding, compare, and write their reading for the cmp below.
metrics=$QLFT_BINDINGS_OUT/metrics-run
if [[ -f $model && -f $data ]]; then
  [[ -s $metrics/metrics_c.txt ]] || {
    echo "FAIL: $metrics/metrics_c.txt is absent (ctest metrics_c_run writes it)"; exit 1; }
  export QLFT_METRICS_JSONL=$metrics/metrics.jsonl QLFT_METRICS_C_DUMP=$metrics/metrics_c.txt
  export QLFT_METRICS_RUST_DUMP=$out/metrics_rust.txt
fi
QLFT_LAYOUT_C_OUT=$out/layout_c.txt cargo test --offline
cargo run --offline -q --example layout > "$out/layout_rust.txt"
diff -u "$out/layout_c.txt" "$out/layout_rust.txt"
echo "layout: $(wc -l < "$out/layout_c.txt") lines identical (C vs Rust)"
# The metrics and the adapter are always compared with metrics_c_run's and example_c_finetune's
# (FIXTURES_SETUP): without the data the test skips (fails with CI=true), it never passes
# uncompared.
[[ -f $model && -f $data ]] || qlft_skip shared-missing "$model or $data is absent"
cmp "$metrics/metrics_c.txt" "$out/metrics_rust.txt"
echo "metrics: $(grep -c '\.step ' "$out/metrics_rust.txt") records, every field equal (C vs Rust)"
{
  cargo run --offline -q --example finetune -- "$model" "$data" "$out/adapter" 4 1
  for f in adapter_model.safetensors adapter_config.json; do
    cmp "$QLFT_BINDINGS_OUT/c/$f" "$out/adapter/$f"
  done
  echo "adapter: byte-identical to the C example's"
}
echo OK
