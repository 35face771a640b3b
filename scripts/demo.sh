#!/usr/bin/env bash
# The main job: install, build, and run qlft on the real stories260K model from shared/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "${QLFT_JOBS:-2}" --target qlft-finetune
shared=${QLFT_SHARED_DIR:-../shared}
model="$shared/models/stories260K.gguf"
[ -f "$model" ] || { echo "demo: $model not found (set QLFT_SHARED_DIR)"; exit 3; }
cli=build/tools/qlft-finetune/qlft-finetune
"$cli" inspect "$model"
