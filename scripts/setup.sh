#!/usr/bin/env bash
# Installs every build and test dependency of qlft from Debian packages. Idempotent: packages
# already present are not touched, so a second run costs a few dpkg queries.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libopenblas-openmp-dev libdnnl-dev
  nlohmann-json3-dev libcli11-dev libyaml-cpp-dev libpcre2-dev liburing-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # Distributed training (src/parallel, tests/dist): the MPI communicator and mpirun.
  libopenmpi-dev openmpi-bin
  golang-go
  # Sanitizer and fuzz stages (scripts/sanitize.sh, scripts/fuzz.sh): clang with its sanitizer
  # and libFuzzer runtimes, llvm-symbolizer for readable reports, LLVM's TSan-aware libomp.
  clang llvm libclang-rt-dev libomp-dev
  # The training report's render test (tests/e2e/report_chromium.sh): headless Chromium.
  chromium
)
# The Rust bindings need cargo; Debian's (rustc 1.63) suffices where rustup's is absent.
command -v cargo >/dev/null 2>&1 || [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ] || packages+=(cargo)

missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all Debian packages present"
fi

if [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: CUDA toolkit found at /usr/local/cuda ($(/usr/local/cuda/bin/nvcc --version | tail -1))"
else
  echo "setup: no CUDA toolkit at /usr/local/cuda; the CUDA build will be skipped"
fi
