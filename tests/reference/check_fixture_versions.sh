#!/usr/bin/env bash
# ctest reference_fixture_versions (issue 23): every fixture directory names the versions of the
# peers that made it, and they are the versions scripts/setup-reference.sh pins (so running that
# script, then the generator, recreates the fixture).
#   check_fixture_versions.sh SOURCE_DIR [FIXTURES_DIR [SETUP_SCRIPT]]
# Checks, without Python (the suite has none):
#  - each directory under FIXTURES_DIR holds VERSIONS.json, written by tests/reference/
#    fixture_versions.py, naming an existing generator and at least one peer;
#  - every peer recorded has a pin and its release (torch's +cuXXX local tag dropped) equals it;
#  - every tests/reference/gen_*.py is named by some VERSIONS.json (none writes without one);
#  - the SmolLM2 model's recorded SHA-256, where a fixture read it, is the pinned one.
# VERSIONS.json is read line by line in the layout fixture_versions.py writes (json.dump, indent 1:
# one `"name": "value"` per line inside the "peers" / "inputs" objects).
#   check_fixture_versions.sh --detects SOURCE_DIR
# (ctest reference_fixture_versions_detects) proves the check fails on a copy of the fixtures'
# VERSIONS.json files with one fault each: a version off its pin, a peer without a pin, a missing
# file, a wrong model SHA-256.
set -euo pipefail
if [ "$1" = --detects ]; then
  src=$2 self=$(readlink -f "$0")
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  fresh() {  # fresh: $work/f holds every fixture dir with only its VERSIONS.json
    rm -rf "$work/f" && mkdir "$work/f"
    for v in "$src"/tests/reference/fixtures/*/VERSIONS.json; do
      d=${v%/VERSIONS.json} && mkdir "$work/f/${d##*/}" && cp "$v" "$work/f/${d##*/}/"
    done
  }
  expect_fail() {  # expect_fail WHAT PATTERN
    if out=$(bash "$self" "$src" "$work/f" 2>&1); then echo "FAIL: not detected: $1"; exit 1; fi
    grep -q -- "$2" <<<"$out" || { echo "FAIL: $1: no '$2' in: $out"; exit 1; }
    echo "ok: detected: $1"
  }
  fresh
  bash "$self" "$src" "$work/f" >/dev/null || { echo "FAIL: the unmodified copy does not pass"; exit 1; }
  sed -i 's/^  "torch": "2\./  "torch": "1./' "$work"/f/*/VERSIONS.json
  expect_fail "torch off its pin" "made with torch 1."
  fresh
  sed -i 's/^  "numpy": /  "numpy-fork": /' "$work"/f/*/VERSIONS.json
  expect_fail "an unpinned peer" "peer numpy-fork .* is not pinned"
  fresh
  rm "$work/f/optim/VERSIONS.json"
  expect_fail "a missing VERSIONS.json" "optim: no VERSIONS.json"
  fresh
  sed -i 's/^\(  "smollm2-135m-instruct-q4_1.gguf": "\)./\1x/' "$work/f/smollm2/VERSIONS.json"
  expect_fail "a wrong model SHA-256" "with SHA-256 x"
  exit 0
fi
src=$1
fixtures=${2:-$src/tests/reference/fixtures}
setup=${3:-$src/scripts/setup-reference.sh}
errors=0
fail() { echo "FAIL: $*"; errors=$((errors + 1)); }

# ---- the pins ------------------------------------------------------------------------------
declare -A pin=()
inside=0
while IFS= read -r line; do
  s=${line%%#*}
  s=$(echo "$s" | xargs)  # trim
  case "$s" in
    'pins=(') inside=1 ;;
    ')') inside=0 ;;
    smollm2_pkg=*==*) s=${s#smollm2_pkg=}; pin[${s%%==*}]=${s##*==} ;;
    smollm2_name=*) smollm2_name=${s#smollm2_name=} ;;
    smollm2_sha256=*) smollm2_sha256=${s#smollm2_sha256=} ;;
    *==*) ((inside)) && pin[${s%%==*}]=${s##*==} ;;
  esac
done <"$setup"
((${#pin[@]} >= 5)) || { echo "FAIL: only ${#pin[@]} pins read from $setup"; exit 1; }
: "${smollm2_name:?no smollm2_name in $setup}" "${smollm2_sha256:?no smollm2_sha256 in $setup}"

# ---- each fixture directory ----------------------------------------------------------------
# obj FILE KEY: the `"name": "value"` pairs of the one-level object KEY, as `name value` lines.
obj() {
  awk -v key="\"$2\": {" '
    index($0, key) == 2 { if ($0 ~ /{},?$/) exit; on = 1; next }
    on && /^ *}/ { exit }
    on { gsub(/[",]/, ""); sub(/:/, ""); print $1, $2 }' "$1"
}
named=" "
ndirs=0
for dir in "$fixtures"/*/; do
  dir=${dir%/}
  name=${dir##*/}
  ndirs=$((ndirs + 1))
  before=$errors
  v=$dir/VERSIONS.json
  [ -f "$v" ] || { fail "$name: no VERSIONS.json (run its generator with /opt/qlft-ref)"; continue; }
  gen=$(sed -n 's/^ "generator": "\(.*\)",$/\1/p' "$v")
  [ -n "$gen" ] && [ -f "$src/$gen" ] || fail "$name: VERSIONS.json names no existing generator ('$gen')"
  named+="${gen##*/} "
  npeers=0
  while read -r peer ver; do
    npeers=$((npeers + 1))
    if [ -z "${pin[$peer]+x}" ]; then
      fail "$name: peer $peer $ver is not pinned in ${setup##*/}"
    elif [ "${ver%%+*}" != "${pin[$peer]}" ]; then
      fail "$name: made with $peer $ver, ${setup##*/} pins ${pin[$peer]}"
    fi
  done < <(obj "$v" peers)
  ((npeers > 0)) || fail "$name: VERSIONS.json records no peer"
  while read -r file sha; do
    [ "$file" != "$smollm2_name" ] || [ "$sha" = "$smollm2_sha256" ] ||
      fail "$name: read $file with SHA-256 $sha, ${setup##*/} pins $smollm2_sha256"
  done < <(obj "$v" inputs)
  ((errors > before)) || echo "ok: $name ($npeers peers, $gen)"
done
((ndirs > 0)) || fail "no fixture directory under $fixtures"

# ---- every generator records its versions --------------------------------------------------
for g in "$src"/tests/reference/gen_*.py; do
  g=${g##*/}
  [[ $named == *" $g "* ]] || fail "$g: no fixture directory's VERSIONS.json names it"
done

((errors == 0)) || { echo "$errors problem(s)"; exit 1; }
echo "ok: $ndirs fixture directories match the pins in ${setup##*/}"
