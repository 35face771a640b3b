#!/usr/bin/env bash
# The layering of the source tree, checked from the sources (ctest layers_check; its self-test,
# layers_check_detects, shows every rule can fail). This file is the one place the room order is
# written; docs/ARCHITECTURE.md's layer table lists the rooms in this order.
#
#   src/ rooms, lowest first. A file in a room may include its own room and any room left of it,
#   never one to its right (so the include graph between rooms is acyclic):
ORDER=(core arch quant formats config backend model optim parallel tokenizer data train report api)
#   cuda/src and cuda/plugin (the CUDA backend and its plugin entry) sit at the backend level:
CUDA_LEVEL=backend
#   cuda/emu (the CUDA emulator) includes nothing from src/: it is a shim of CUDA's own headers.
#   Only api/ and config/ see the string-keyed settings (config/config.h); every other room takes
#   its typed part of RunSpec (config/run_spec.h).
CONFIG_SEERS=(api config)
#   No file under src/ or cuda/ is longer than MAX_LINES.
MAX_LINES=700
#
# usage: check_layers.sh [ROOT]   (ROOT: the repository, default this script's ../..)
#        check_layers.sh --self-test
# Prints each offending include (file:line: include, and the rule) or file, and exits 1 if any.
set -euo pipefail

declare -A RANK=()
for i in "${!ORDER[@]}"; do RANK[${ORDER[$i]}]=$i; done
rank_of() {  # the index of room $1 in ORDER, or -1 (into the variable r: no subshell per include)
  r=-1
  [ -n "$1" ] && r=${RANK[$1]:--1}
  return 0
}

check() {
  local root=$1 bad=0 f rel room level inc target trank lrank n
  cd "$root"
  [ -d src ] || { echo "check_layers: no src/ under $root" >&2; return 2; }
  # Every directory directly under src/ must be a room of ORDER.
  for d in src/*/; do
    room=$(basename "$d")
    rank_of "$room"
    if [ "$r" -lt 0 ]; then
      echo "src/$room/: a room that is not in the order (add it to ORDER in tests/support/check_layers.sh and to docs/ARCHITECTURE.md's layer table)"
      bad=1
    fi
  done
  while IFS= read -r -d '' f; do
    rel=${f#./}
    case $rel in
      src/*) room=${rel#src/}; room=${room%%/*}; level=$room ;;
      cuda/emu/*) room=cuda/emu; level="" ;;
      cuda/*) room=cuda; level=$CUDA_LEVEL ;;
      *) continue ;;
    esac
    n=$(wc -l <"$f")
    if [ "$n" -gt "$MAX_LINES" ]; then
      echo "$rel: $n lines (more than $MAX_LINES)"
      bad=1
    fi
    rank_of "$level"
    lrank=$r
    # "#include "x/..."" lines, with their line numbers.
    while IFS=: read -r ln inc; do
      inc=${inc#*\"}
      inc=${inc%%\"*}
      case $inc in
        ../*|*/../*)
          echo "$rel:$ln: #include \"$inc\": a relative path out of the directory hides the room"
          bad=1
          continue ;;
      esac
      target=${inc%%/*}
      [ "$target" = "$inc" ] && continue  # same directory
      rank_of "$target"
      trank=$r
      [ "$trank" -lt 0 ] && continue  # not a src/ room (a system or cuda-local header)
      if [ "$room" = cuda/emu ]; then
        echo "$rel:$ln: #include \"$inc\": cuda/emu includes nothing from src/"
        bad=1
      elif [ "$trank" -gt "$lrank" ]; then
        if [ "$room" = cuda ]; then
          echo "$rel:$ln: #include \"$inc\": cuda/ sits at the $CUDA_LEVEL level; $target/ is above it"
        else
          echo "$rel:$ln: #include \"$inc\": $room/ is below $target/ (order: ${ORDER[*]})"
        fi
        bad=1
      elif [ "$inc" = config/config.h ] && [[ " ${CONFIG_SEERS[*]} " != *" $room "* ]]; then
        echo "$rel:$ln: #include \"$inc\": only ${CONFIG_SEERS[*]} see Config; take the typed part of config/run_spec.h"
        bad=1
      fi
    done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" || true)
  done < <(find ./src ./cuda -type f \( -name '*.h' -o -name '*.hpp' -o -name '*.c' -o -name '*.cpp' \
             -o -name '*.cu' -o -name '*.cuh' \) -print0 2>/dev/null | sort -z)
  return $bad
}

# A small tree with one breach of each rule (and legal includes beside them): every breach must be
# reported by name, and the tree without them must pass.
self_test() {
  local t out fails=0
  t=$(mktemp -d)
  trap 'rm -rf "$t"' RETURN
  mkdir -p "$t"/src/{core,backend,model,api,config,train} "$t"/cuda/src "$t"/cuda/emu/src
  printf '#include "core/error.h"\n#include "backend/backend.h"\n' >"$t/src/model/ok.cpp"
  printf '#include "config/config.h"\n#include "train/trainer.h"\n' >"$t/src/api/ok.cpp"
  printf '#include "backend/backend.h"\n#include "check.h"\n' >"$t/cuda/src/ok.cu"
  printf '#include <cuda_runtime.h>\n#include "emu_internal.h"\n' >"$t/cuda/emu/src/ok.cpp"
  if ! out=$(check "$t" 2>&1); then
    echo "self-test: a clean tree was refused:"; echo "$out"; return 1
  fi
  printf '#include "model/model.h"\n' >"$t/src/backend/up.cpp"           # upward
  printf '#include "train/trainer.h"\n' >"$t/cuda/src/up.cu"              # cuda above backend
  printf '#include "core/half.h"\n' >"$t/cuda/emu/src/src.cpp"            # emu into src/
  printf '  #  include "config/config.h"\n' >"$t/src/train/cfg.cpp"       # Config outside api
  printf '#include "../model/model.h"\n' >"$t/src/core/rel.cpp"           # relative escape
  mkdir -p "$t/src/newroom"                                               # a room not in ORDER
  : >"$t/src/newroom/x.h"
  for i in $(seq 701); do echo "// $i"; done >"$t/src/core/long.cpp"    # 701 lines
  out=$(check "$t" 2>&1) && { echo "self-test: a broken tree passed"; return 1; }
  for want in 'src/backend/up.cpp:1: #include "model/model.h": backend/ is below model/' \
              'cuda/src/up.cu:1: #include "train/trainer.h": cuda/ sits at the backend level' \
              'cuda/emu/src/src.cpp:1: #include "core/half.h": cuda/emu includes nothing from src/' \
              'src/train/cfg.cpp:1: #include "config/config.h": only api config see Config' \
              'src/core/rel.cpp:1: #include "../model/model.h": a relative path' \
              'src/newroom/: a room that is not in the order' \
              'src/core/long.cpp: 701 lines (more than 700)'; do
    if ! grep -qF -- "$want" <<<"$out"; then
      echo "self-test: not reported: $want"; fails=1
    fi
  done
  if [ "$(grep -c . <<<"$out")" -ne 7 ]; then
    echo "self-test: expected exactly 7 findings, got:"; echo "$out"; fails=1
  fi
  [ $fails = 0 ] && echo "self-test: every rule reports its breach (7 of 7), a clean tree passes"
  return $fails
}

if [ "${1:-}" = --self-test ]; then
  self_test
  exit
fi
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
if check "$root"; then
  echo "layers: every include between rooms runs downward (${ORDER[*]}; cuda/ at $CUDA_LEVEL," \
       "cuda/emu apart), no file over $MAX_LINES lines"
else
  exit 1
fi
