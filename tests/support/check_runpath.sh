#!/usr/bin/env bash
# ctest runpath_hygiene (issue 44): no binary this build makes or installs has an empty or a
# relative RUNPATH/RPATH entry (an empty entry is the current directory: a libgcc_s.so.1 there
# was loaded by the build tree's CLI). Entries must be absolute or start with $ORIGIN. Reads
# every ELF executable and shared object under BUILD_DIR (executables, libqlft, plugins, test
# binaries), then `cmake --install`s BUILD_DIR into a temporary prefix and reads those.
#   check_runpath.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/qlft-runpath.XXXXXX")
trap 'rm -rf "$work"' EXIT
bad=0 checked=0

# check FILE: prints and counts each bad entry of its dynamic section's RUNPATH and RPATH.
check() {
  local f=$1 line paths e
  line=$(readelf -d "$f" 2>/dev/null | grep -E '\((RUNPATH|RPATH)\)' || true)
  checked=$((checked + 1))
  [[ -z $line ]] && return 0
  while IFS= read -r l; do
    paths=${l#*\[}
    paths=${paths%\]*}
    # An empty list, a leading or trailing ':' or '::' are empty entries.
    if [[ -z $paths || $paths == :* || $paths == *: || $paths == *::* ]]; then
      echo "FAIL $f: empty entry in [$paths]"
      bad=$((bad + 1))
    fi
    local entries
    IFS=: read -ra entries <<<"$paths"
    for e in "${entries[@]}"; do
      [[ -z $e || $e == /* || $e == '$ORIGIN' || $e == '$ORIGIN/'* || $e == '${ORIGIN}'* ]] && continue
      echo "FAIL $f: relative entry '$e' in [$paths]"
      bad=$((bad + 1))
    done
  done <<<"$line"
}

# ELF files (by their magic) that are executables or shared objects, not relocatable objects.
scan() {
  local f
  while IFS= read -r -d '' f; do
    [[ $(head -c 4 "$f" | od -An -c | tr -d ' ') == 177ELF ]] || continue
    readelf -h "$f" 2>/dev/null | grep -qE 'Type:[[:space:]]+(EXEC|DYN)' || continue
    check "$f"
  done < <(find "$1" -type f \( -perm -u+x -o -name '*.so' -o -name '*.so.*' \) \
             -not -path '*/CMakeFiles/*' -print0)
}

scan "$build"
n_build=$checked
[[ $n_build -gt 0 ]] || { echo "FAIL: no ELF binary found under $build"; exit 1; }
# The build tree's CLI and library must be among them.
for need in "$build/libqlft.so" "$build/tools/qlft-finetune/qlft-finetune"; do
  [[ -e $need ]] || { echo "FAIL: $need is missing (build the whole tree first)"; exit 1; }
done

cmake --install "$build" --prefix "$work/prefix" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log"; echo "FAIL: cmake --install failed"; exit 1; }
checked=0
scan "$work/prefix"
[[ $checked -gt 0 ]] || { echo "FAIL: the install holds no ELF binary"; exit 1; }
echo "checked $n_build binaries in $build and $checked in its install: $bad bad entries"
[[ $bad == 0 ]]
