#!/usr/bin/env bash
# ctest bindings_go: `go vet` + `go test ./...`, the struct layout compared with the C
# compiler's, the C example's fine-tune repeated from Go with a byte-identical adapter, and a
# real run's metrics records read through the package equal to the C API's (metrics_c_run).
# cgo finds this build through its build-tree qlft.pc ($PKG_CONFIG_PATH); the rpath for the
# test binaries comes from CGO_LDFLAGS, as a product's build would add it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/skip.sh"
src=$1
if ! command -v go > /dev/null; then
  qlft_skip toolchain-missing "go is not installed (scripts/setup.sh installs golang-go)"
fi
cd "$src/bindings/go"
export CGO_ENABLED=1
export GOPATH=${GOPATH:-${QLFT_BINDINGS_OUT:?}/gopath}  # CI may run without HOME
export PKG_CONFIG_PATH=${QLFT_PKG_CONFIG_PATH:?}
export CGO_LDFLAGS="-Wl,-rpath,${QLFT_LIB_DIR:?}"
export GOCACHE=${GOCACHE:-${QLFT_BINDINGS_OUT:?}/go-cache}
out=${QLFT_BINDINGS_OUT:?}/go
rm -rf "$out" && mkdir -p "$out"
"${QLFT_LAYOUT_C:?}" > "$out/layout_c.txt"
go vet ./...
model=${QLFT_SHARED_DIR:?}/models/stories260K.gguf
data=$QLFT_SHARED_DIR/data/tinyshakespeare.txt
# metrics_c_run (a FIXTURES_SETUP) wrote a real run's metrics.jsonl and the C API's reading of
# it; the tests read it through the binding, compare, and write their reading for the cmp below.
metrics=$QLFT_BINDINGS_OUT/metrics-run
if [[ -f $model && -f $data ]]; then
  [[ -s $metrics/metrics_c.txt ]] || {
    echo "FAIL: $metrics/metrics_c.txt is absent (ctest metrics_c_run writes it)"; exit 1; }
  export QLFT_METRICS_JSONL=$metrics/metrics.jsonl QLFT_METRICS_C_DUMP=$metrics/metrics_c.txt
  export QLFT_METRICS_GO_DUMP=$out/metrics_go.txt
fi
QLFT_LAYOUT_C_OUT=$out/layout_c.txt go test -count=1 ./...
go run ./cmd/qlft-layout > "$out/layout_go.txt"
diff -u "$out/layout_c.txt" "$out/layout_go.txt"
echo "layout: $(wc -l < "$out/layout_c.txt") lines identical (C vs Go)"
# The metrics and the adapter are always compared with metrics_c_run's and example_c_finetune's
# (FIXTURES_SETUP): without the data the test skips (fails with CI=true), it never passes
# uncompared.
[[ -f $model && -f $data ]] || qlft_skip shared-missing "$model or $data is absent"
cmp "$metrics/metrics_c.txt" "$out/metrics_go.txt"
echo "metrics: $(grep -c '\.step ' "$out/metrics_go.txt") records, every field equal (C vs Go)"
{
  go run ./cmd/qlft-finetune "$model" "$data" "$out/adapter" 4 1
  for f in adapter_model.safetensors adapter_config.json; do
    cmp "$QLFT_BINDINGS_OUT/c/$f" "$out/adapter/$f"
  done
  echo "adapter: byte-identical to the C example's"
}
echo OK
