#!/usr/bin/env bash
# qlft-finetune tokenize against llama.cpp's vocabulary test vectors (shared/tokenizer-vectors:
# vocabulary-only GGUF files, which tokenize must load without tensors): every case is written
# to a file and tokenized with --file, so the file's bytes must be taken exactly (cases end in
# "\n", "\t\n", "   \n"); --no-bos gives llama.cpp's ids without special tokens (the .out files),
# the default adds BOS as the vocabulary says. A missing model is named once, not "x: x: ...".
#
#   cli_tokenize.sh path/to/qlft-finetune [SHARED_DIR]
set -euo pipefail
cli=$1
shared=${QLFT_SHARED_DIR:-${2:-$(cd "$(dirname "$0")/../../.." && pwd)/shared}}
vec=$shared/tokenizer-vectors
# shellcheck source=../support/skip.sh
source "$(dirname "$0")/../support/skip.sh"
[ -f "$vec/ggml-vocab-deepseek-coder.gguf.inp" ] ||
  qlft_skip shared-missing "$vec not found (set QLFT_SHARED_DIR)"
work=$(mktemp -d /tmp/qlft-cli-tokenize.XXXXXX)
trap 'rm -rf "$work"' EXIT
fails=0
sep=$'\n__ggml_vocab_test__\n'

for name in llama-spm gpt-2 deepseek-coder; do
  gguf=$vec/ggml-vocab-$name.gguf
  inp=$(cat "$gguf.inp"; printf x)  # the x keeps the file's final newlines
  inp=${inp%x}
  mapfile -t want <"$gguf.out"
  n=0
  while [[ "$inp" == *"$sep"* ]]; do
    printf '%s' "${inp%%"$sep"*}" >"$work/case"
    inp=${inp#*"$sep"}
    got=$("$cli" tokenize --model "$gguf" --file "$work/case" --ids --no-bos)
    exp=$(echo ${want[$n]})  # normalize spacing
    if [ "$got" != "$exp" ]; then
      echo "FAIL $name case $n: $(od -c "$work/case" | head -2 | tr -s ' ')" >&2
      echo "  got:  $got" >&2
      echo "  want: $exp" >&2
      fails=$((fails + 1))
    fi
    n=$((n + 1))
  done
  [ "$n" = "${#want[@]}" ] || { echo "FAIL $name: $n cases, ${#want[@]} lines" >&2; fails=$((fails + 1)); }
  echo "$name: $n cases through --file"
done

# Default: BOS as the vocabulary says (llama-spm and deepseek-coder: add_bos_token).
printf 'Hello' >"$work/hello"
for name in llama-spm deepseek-coder; do
  gguf=$vec/ggml-vocab-$name.gguf
  plain=$("$cli" tokenize --model "$gguf" --file "$work/hello" --ids --no-bos)
  with=$("$cli" tokenize --model "$gguf" --file "$work/hello" --ids)
  first=${with%% *}
  if [ "$with" != "$first $plain" ] || [ "$first" = "${plain%% *}" ]; then
    echo "FAIL $name: default '$with' is not BOS + '$plain'" >&2
    fails=$((fails + 1))
  fi
done

# An error names the path once.
set +e
err=$("$cli" tokenize --model "$work/no-such.gguf" --text a 2>&1 >/dev/null)
rc=$?
set -e
if [ "$rc" = 0 ] || [ "$(grep -o "no-such.gguf" <<<"$err" | wc -l)" != 1 ]; then
  echo "FAIL missing model: rc $rc, '$err'" >&2
  fails=$((fails + 1))
fi

if [ "$fails" != 0 ]; then
  echo "$fails failed" >&2
  exit 1
fi
echo "cli_tokenize: all passed"
