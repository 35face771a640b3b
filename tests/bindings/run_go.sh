#!/usr/bin/env bash
# ctest bindings_go: `go vet` + `go test ./...`, the struct layout compared with the C
# compiler's, and the C example's fine-tune repeated from Go with a byte-identical adapter.
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
QLFT_LAYOUT_C_OUT=$out/layout_c.txt go test -count=1 ./...
go run ./cmd/qlft-layout > "$out/layout_go.txt"
diff -u "$out/layout_c.txt" "$out/layout_go.txt"
echo "layout: $(wc -l < "$out/layout_c.txt") lines identical (C vs Go)"
model=${QLFT_SHARED_DIR:?}/models/stories260K.gguf
data=$QLFT_SHARED_DIR/data/tinyshakespeare.txt
# The adapter is always compared byte for byte with example_c_finetune's (its FIXTURES_SETUP):
# without the data the test skips (fails with CI=true), it never passes uncompared.
[[ -f $model && -f $data ]] || qlft_skip shared-missing "$model or $data is absent"
{
  go run ./cmd/qlft-finetune "$model" "$data" "$out/adapter" 4 1
  for f in adapter_model.safetensors adapter_config.json; do
    cmp "$QLFT_BINDINGS_OUT/c/$f" "$out/adapter/$f"
  done
  echo "adapter: byte-identical to the C example's"
}
echo OK
