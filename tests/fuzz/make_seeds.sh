#!/usr/bin/env bash
# Builds the seed corpora of the fuzz targets into <build>/fuzz-seeds/<target>/ from the real files
# in ../shared and the repo's fixtures (never committed), plus the hand-picked seeds committed in
# tests/fuzz/seeds/<target>/. Multi-file targets get their parts joined by "\n--qlft-file--\n"
# (see fuzz_common.h). Usage: make_seeds.sh BUILD_DIR [SHARED_DIR]
set -uo pipefail
build=${1:?usage: make_seeds.sh BUILD_DIR [SHARED_DIR]}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
shared=${2:-${QLFT_SHARED_DIR:-$root/../shared}}
fx=$root/tests/reference/fixtures
out=$build/fuzz-seeds
rm -rf "$out"
sep=$'\n--qlft-file--\n'

put() {  # put TARGET NAME < bytes
  mkdir -p "$out/$1"
  cat >"$out/$1/$2"
}
join_files() {  # join_files FILE... : parts separated by the separator line
  local first=1
  for f in "$@"; do
    ((first)) || printf '%s' "$sep"
    first=0
    if [ -f "$f" ]; then cat "$f"; fi
  done
}
have() { [ -f "$1" ]; }

for t in fuzz_gguf fuzz_safetensors fuzz_safetensors_index fuzz_hf_model fuzz_tokenizer_json \
  fuzz_tokenizer_text fuzz_records fuzz_config_yaml fuzz_checkpoint fuzz_cli_args \
  fuzz_output_guard; do
  mkdir -p "$out/$t"
  [ -d "$here/seeds/$t" ] && cp "$here/seeds/$t"/* "$out/$t/" 2>/dev/null || true
done

# GGUF: every fixture GGUF and the real model / vocabularies.
for f in "$fx"/*/*.gguf "$shared"/models/*.gguf "$shared"/tokenizer-vectors/*.gguf; do
  have "$f" && put fuzz_gguf "$(basename "$f")" <"$f"
done
# A truncated real model: exercises the size checks quickly.
have "$shared/models/stories260K.gguf" && head -c 4096 "$shared/models/stories260K.gguf" | put fuzz_gguf head4k.gguf

# safetensors: the small fixture files.
find "$fx" -name '*.safetensors' -size -200k | while read -r f; do
  put fuzz_safetensors "$(echo "${f#$fx/}" | tr / _)" <"$f"
done

# Sharded set: index | shard 1 | shard 2.
s=$fx/formats/sharded
join_files "$s/model.safetensors.index.json" "$s/model-00001-of-00002.safetensors" \
  "$s/model-00002-of-00002.safetensors" | put fuzz_safetensors_index sharded

# HF model directories: config.json | model.safetensors.
for d in "$fx"/model/syn_llama "$fx"/model/syn_qwen2 "$fx"/quant/tiny_llama_nf4 "$fx"/quant/tiny_llama_int8; do
  have "$d/config.json" && join_files "$d/config.json" "$d/model.safetensors" | put fuzz_hf_model "$(basename "$d")"
done

# tokenizer.json | tokenizer_config.json.
for d in "$fx"/tokenizer/*/; do
  have "$d/tokenizer.json" && join_files "$d/tokenizer.json" "$d/tokenizer_config.json" |
    put fuzz_tokenizer_json "$(basename "$d")"
done

# Encode/decode: first byte picks vocabulary (bit 0) and parse_special (bit 1).
i=0
for f in "$shared"/tokenizer-vectors/*.inp; do
  have "$f" || continue
  for sel in 0 1 2 3; do
    { printf "\\x0$sel"; head -c 1500 "$f"; } | put fuzz_tokenizer_text "inp$i-$sel"
  done
  i=$((i + 1))
done
for f in "$shared"/data/tinyshakespeare.txt "$shared"/data/tinystories-sample.txt; do
  have "$f" && { printf '\x01'; head -c 2000 "$f"; } | put fuzz_tokenizer_text "$(basename "$f")"
done

# Data reader: first byte picks extension (bits 0-1), format (2-3), skip_bad (4), small limit (5).
have "$shared/data/identity.json" && { printf '\x01'; head -c 3000 "$shared/data/identity.json"; } | put fuzz_records identity.json
have "$shared/data/identity.json" && { printf '\x29'; head -c 3000 "$shared/data/identity.json"; } | put fuzz_records identity-alpaca.json
have "$shared/data/tinyshakespeare.txt" && { printf '\x02'; head -c 2000 "$shared/data/tinyshakespeare.txt"; } | put fuzz_records shakespeare.txt

# Config: the documented defaults of every key as one YAML file.
if [ -f "$root/docs/CONFIG.md" ]; then
  grep '^| `' "$root/docs/CONFIG.md" | awk -F'|' '{gsub(/`/,"",$2); gsub(/`/,"",$4); gsub(/^ +| +$/,"",$2); gsub(/^ +| +$/,"",$4); if ($4 != "") print $2 ": \"" $4 "\""}' |
    put fuzz_config_yaml defaults.yaml
fi

# Checkpoint: a real one written by the target itself after one training step.
if [ -x "$build/tests/fuzz/fuzz_checkpoint" ]; then
  ASAN_OPTIONS=detect_leaks=0 QLFT_FUZZ_WRITE_CHECKPOINT="$out/fuzz_checkpoint/real.safetensors" OMP_NUM_THREADS=1 \
    "$build/tests/fuzz/fuzz_checkpoint" >/dev/null 2>&1 || echo "make_seeds: no checkpoint seed" >&2
fi

for t in "$out"/*; do echo "seeds: $(basename "$t"): $(ls "$t" | wc -l) files"; done
