#!/usr/bin/env bash
# ctest bindings_installed (issue 20, "Done when" 2): install this build with
# `cmake --install --prefix`, MOVE the prefix elsewhere (it must be relocatable), then build the
# programs of tests/bindings/consumer, copied out of the source tree, against it:
#   C through pkg-config, C through CMake's find_package(qlft CONFIG), a Rust binary crate
#   (path dependency on bindings/rust, cargo --offline) and a Go module (replace directive to
#   bindings/go, GOPROXY=off).
# Each must run without LD_LIBRARY_PATH, load libqlft.so from the moved prefix, carry no
# RUNPATH entry into the source or build tree (nor an empty one), and print the same greedy
# generation. Caches (cargo target, Go build cache) live in the build directory.
#   run_installed.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/skip.sh"
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
shared=${QLFT_SHARED_DIR:?}
model=$shared/models/stories260K.gguf
[[ -f $model ]] || qlft_skip shared-missing "$model is absent"
cache=${QLFT_BINDINGS_OUT:?}/installed-cache
mkdir -p "$cache"
work=$(mktemp -d "${TMPDIR:-/tmp}/qlft-installed.XXXXXX")
trap 'rm -rf "$work"' EXIT
unset LD_LIBRARY_PATH QLFT_LIB_DIR PKG_CONFIG_LIBDIR CMAKE_PREFIX_PATH
fail() { echo "FAIL: $*"; exit 1; }

cmake --install "$build" --prefix "$work/staging" > "$work/install.log"
mv "$work/staging" "$work/prefix"
P=$work/prefix
pc=$(find "$P" -name qlft.pc -path '*/pkgconfig/*')
[[ -n $pc ]] || fail "no qlft.pc under the prefix"
export PKG_CONFIG_PATH=$(dirname "$pc")
libdir=$(realpath "$(pkg-config --variable=libdir qlft)")
[[ $libdir == "$P"/* && -f $libdir/libqlft.so ]] || fail "pkg-config libdir $libdir is not in $P"
[[ $(realpath "$(pkg-config --variable=includedir qlft)")/qlft.h -ef $P/include/qlft.h ]] ||
  fail "pkg-config includedir does not hold qlft.h"
if grep -rlF -e "$src" -e "$build" -e "$work/staging" "$P/include" "$(dirname "$pc")" \
  "$libdir/cmake"; then
  fail "installed files above name the source tree, the build tree or the install prefix"
fi

# RUNPATH of an ELF file: no empty entry, nothing under the source or build tree; $2 (if
# given) must be among the entries.
check_runpath() {
  local rp
  rp=$(readelf -d "$1" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
  echo "$(basename "$1"): RUNPATH [$rp]"
  [[ :$rp: != *::* || -z $rp ]] || fail "$1 has an empty RUNPATH entry"
  [[ $rp != *"$src"* && $rp != *"$build"* ]] || fail "$1 has a RUNPATH into the qlft tree"
  if [[ -n ${2:-} ]]; then
    local e found=0 IFS=:
    for e in $rp; do
      e=${e//'$ORIGIN'/$(dirname "$1")}
      [[ $(realpath -m "$e") == "$2" ]] && found=1
    done
    [[ $found == 1 ]] || fail "$1 has no RUNPATH to $2"
  fi
}
check_runpath "$libdir/libqlft.so"
check_runpath "$P/bin/qlft-finetune" "$libdir"
"$P/bin/qlft-finetune" version

prompt="Once upon a time"
# Runs a product: it must resolve libqlft.so to the moved prefix and print the reference text.
run_product() {
  local name=$1 exe=$2
  check_runpath "$exe" "$libdir"
  [[ $(ldd "$exe" | awk '$1 == "libqlft.so.0" { print $3 }') -ef $libdir/libqlft.so.0 ]] ||
    fail "$name does not resolve libqlft.so.0 to $libdir"
  "$exe" "$model" "$prompt" 24 > "$work/$name.out"
  grep -q "^qlft $(pkg-config --modversion qlft)\$" "$work/$name.out" || fail "$name: no version"
  grep -E '^(text|ids|finish): ' "$work/$name.out" > "$work/$name.text" || fail "$name: no text"
  grep -qE '^ids:( [0-9]+)+$' "$work/$name.text" || fail "$name: no streamed ids"
  if [[ -f $work/reference.text ]]; then
    diff -u "$work/reference.text" "$work/$name.text" || fail "$name generated other text"
  else
    [[ $(grep '^text: ' "$work/$name.text" | wc -c) -gt 12 ]] || fail "$name generated nothing"
    cp "$work/$name.text" "$work/reference.text"
  fi
  echo "$name: OK ($(head -c 300 "$work/$name.text" | tr '\n' ' '))"
}

# C, pkg-config.
cp -r "$src/tests/bindings/consumer" "$work/consumer"
cc -std=c99 -Wall -Wextra -Werror -pedantic -o "$work/c-pkg-config" "$work/consumer/c/main.c" \
  $(pkg-config --cflags --libs qlft) -Wl,-rpath,"$(pkg-config --variable=libdir qlft)"
run_product c-pkg-config "$work/c-pkg-config"

# C, CMake find_package.
cmake -S "$work/consumer/c" -B "$work/c-cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$P" > "$work/c-cmake.log" || { cat "$work/c-cmake.log"; exit 1; }
cmake --build "$work/c-cmake" > "$work/c-cmake-build.log" ||
  { cat "$work/c-cmake-build.log"; exit 1; }
run_product c-cmake "$work/c-cmake/qlft-consumer"

skipped=()
# Rust: the product's build.rs adds the RUNPATH from DEP_QLFT_LIBDIR.
export PATH=$PATH:${CARGO_HOME:-$HOME/.cargo}/bin
if command -v cargo > /dev/null; then
  sed -i "s|QLFT_CRATE_PATH|$src/bindings/rust|" "$work/consumer/rust/Cargo.toml"
  (cd "$work/consumer/rust" &&
    CARGO_TARGET_DIR=$cache/cargo-target cargo build --offline -q)
  run_product rust "$cache/cargo-target/debug/qlft-consumer"
else
  skipped+=(rust)
fi

# Go: cgo takes the flags from qlft.pc; the RUNPATH is the product build's CGO_LDFLAGS.
if command -v go > /dev/null; then
  sed -i "s|QLFT_GO_PATH|$src/bindings/go|" "$work/consumer/go/go.mod"
  (cd "$work/consumer/go" &&
    GOPROXY=off GOFLAGS=-mod=mod CGO_ENABLED=1 GOCACHE=$cache/go-cache GOPATH=$cache/gopath \
      CGO_LDFLAGS="-Wl,-rpath,$(pkg-config --variable=libdir qlft)" \
      go build -o "$work/go-consumer" .)
  run_product go "$work/go-consumer"
else
  skipped+=(go)
fi

if ((${#skipped[@]})); then
  qlft_skip toolchain-missing "${skipped[*]} toolchain(s) absent (scripts/setup.sh installs them)"
fi
echo OK
