# shellcheck shell=bash
# Sourced by the shell tests: the only way they skip (tests/support/skip_guard.sh rejects a raw
# `exit 77`). usage: qlft_skip CATEGORY MESSAGE
# Exits 77 (ctest: skipped) for a category listed in tests/support/expected_skips.txt; in strict
# mode (CI=true, QLFT_REQUIRE_SHARED=1 or QLFT_STRICT_SKIPS=1) any other category exits 1, and
# QLFT_REQUIRE_GPU=1 makes "no-gpu" exit 1 too.
# Resolved when sourced: the caller may cd before it skips.
qlft_skip_list="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/expected_skips.txt"
qlft_skip() {
  local category=$1 msg=$2 list=$qlft_skip_list
  local listed=0 strict=0
  if grep -Eq "^${category}([[:space:]]|\$)" "$list"; then listed=1; fi
  if [ "${CI:-}" = true ] || [ "${QLFT_REQUIRE_SHARED:-0}" = 1 ] ||
     [ "${QLFT_STRICT_SKIPS:-0}" = 1 ]; then strict=1; fi
  if { [ "$strict" = 1 ] && [ "$listed" = 0 ]; } ||
     { [ "$category" = no-gpu ] && [ "${QLFT_REQUIRE_GPU:-0}" = 1 ]; }; then
    echo "FAIL: skip for '$category' is not allowed here (not in $list, strict mode): $msg"
    exit 1
  fi
  echo "SKIP [$category]: $msg"
  exit 77
}
