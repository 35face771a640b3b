#!/usr/bin/env bash
# Every discovered gtest case gets the whole test environment (tests/CMakeLists.txt,
# qlft_discover_tests): reads ctest's own commands for the cases of three suites in BUILD_DIR (a
# unit suite, the C ABI suite and test_run_dir_inputs) and fails when one would run without
# QLFT_POISON_UNINIT=1 or OMP_WAIT_POLICY=passive (gtest_discover_tests once dropped every
# ENVIRONMENT entry after the first, unnoticed).
#   ctest_env_check.sh BUILD_DIR
set -euo pipefail
build=$1
cmds=$(cd "$build" && ctest -N -V -R '^(PlannerTest|RunInputs|ApiBasics)[A-Za-z]*\.' |
  grep 'Test command:' || true)
n=$(printf '%s\n' "$cmds" | grep -c 'Test command:' || true)
if [ "$n" -lt 3 ]; then
  echo "FAIL: found $n discovered cases of the checked suites in $build"
  exit 1
fi
for var in QLFT_POISON_UNINIT=1 OMP_WAIT_POLICY=passive; do
  bad=$(printf '%s\n' "$cmds" | grep -v -E -- "[ \"]$var[\" ]" | head -3 || true)
  if [ -n "$bad" ]; then
    echo "FAIL: discovered cases run without $var:"
    printf '%s\n' "$bad"
    exit 1
  fi
done
echo "ctest_env_check: $n discovered cases, each runs with QLFT_POISON_UNINIT=1 and OMP_WAIT_POLICY=passive"
