#!/usr/bin/env bash
# ctest skip_guard (issue 23): the guards that keep a skip from hiding a failure work.
#   skip_guard.sh SOURCE_DIR PROBE TEST_API_MODEL SHARED_DIR
# 1. No test skips by another route than QLFT_SKIP / qlft_skip (no raw GTEST_SKIP, no `exit 77`).
# 2. The shell guard (skip.sh) and the C++ guard (QLFT_SKIP, run as whole processes): an unlisted
#    reason fails under CI=true, a listed one skips, QLFT_REQUIRE_GPU=1 makes "no-gpu" fail.
# 3. A fake QLFT_ERR_UNSUPPORTED from the default (NF4) model loader fails test_api_model under
#    CI=true: stories260K.gguf with one linear weight retyped from f32 to q5_0 (a float block type
#    qlft does not dequantize; its smaller data still lies inside the old span). That test used to
#    skip on UNSUPPORTED.
set -euo pipefail
src=$1 probe=$2 api_model=$3 shared=$4
fail() { echo "FAIL: $*"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unset CI QLFT_REQUIRE_SHARED QLFT_STRICT_SKIPS QLFT_REQUIRE_GPU

# ---- 1. one route to a skip -------------------------------------------------------------------
# No exceptions: test_support.h defines QLFT_SKIP on GTEST_SKIP, skip.sh is qlft_skip.
raw=$(cd "$src" && grep -rn --include='*.cpp' --include='*.h' --include='*.cu' 'GTEST_SKIP(' tests |
  grep -v '^tests/support/test_support.h:' || true)
[ -z "$raw" ] || fail "raw GTEST_SKIP (use QLFT_SKIP with a category from expected_skips.txt):
$raw"
raw=$(cd "$src" && grep -rn --include='*.sh' -E 'exit 77' tests | grep -v '^tests/support/skip.sh:' |
  grep -v '^tests/support/skip_guard.sh:' || true)
[ -z "$raw" ] || fail "raw 'exit 77' (use qlft_skip from tests/support/skip.sh):
$raw"
echo "ok: every skip goes through QLFT_SKIP / qlft_skip"

# ---- 2. the guards ----------------------------------------------------------------------------
shell_rc() { (source "$src/tests/support/skip.sh"; qlft_skip "$1" probe) >/dev/null && echo 0 || echo $?; }
[ "$(shell_rc not-implemented)" = 77 ] || fail "qlft_skip: local unlisted skip did not exit 77"
[ "$(CI=true shell_rc not-implemented)" = 1 ] || fail "qlft_skip: CI=true unlisted skip did not fail"
[ "$(CI=true shell_rc shared-missing)" = 1 ] || fail "qlft_skip: CI=true shared-missing did not fail"
[ "$(CI=true shell_rc isa-absent)" = 77 ] || fail "qlft_skip: CI=true listed skip did not exit 77"
[ "$(QLFT_REQUIRE_GPU=1 shell_rc no-gpu)" = 1 ] || fail "qlft_skip: QLFT_REQUIRE_GPU=1 no-gpu did not fail"
echo "ok: qlft_skip"
run_probe() {  # run_probe NAME [ENV...]: prints rc, leaves the output in $work/probe.out
  local name=$1; shift
  env "$@" "$probe" --gtest_also_run_disabled_tests --gtest_filter="SkipGuardProbe.DISABLED_$name" \
    >"$work/probe.out" 2>&1 && echo 0 || echo $?
}
[ "$(run_probe UnlistedReason)" = 0 ] && grep -q '\[  SKIPPED \]' "$work/probe.out" ||
  fail "QLFT_SKIP: local unlisted skip did not skip"
[ "$(run_probe UnlistedReason CI=true)" != 0 ] && grep -q 'is not allowed here' "$work/probe.out" ||
  fail "QLFT_SKIP: CI=true unlisted skip did not fail: $(cat "$work/probe.out")"
[ "$(run_probe ListedReason CI=true)" = 0 ] && grep -q '\[  SKIPPED \]' "$work/probe.out" ||
  fail "QLFT_SKIP: CI=true listed skip did not skip"
[ "$(run_probe NoGpu QLFT_REQUIRE_GPU=1)" != 0 ] || fail "QLFT_SKIP: QLFT_REQUIRE_GPU=1 no-gpu passed"
echo "ok: QLFT_SKIP"

# ---- 3. a fake UNSUPPORTED from the NF4 loader fails the run ----------------------------------
model=$shared/models/stories260K.gguf
if [ ! -f "$model" ]; then
  source "$src/tests/support/skip.sh"
  qlft_skip shared-missing "$model not found"
fi
mkdir -p "$work/shared/models"
fake=$work/shared/models/stories260K.gguf
cp "$model" "$fake"
name=blk.0.attn_q.weight
# GGUF tensor info: u64 name length, name, u32 n_dims, u64 dims[n_dims], u32 type, u64 offset.
pos=$(grep -obUaF "$name" "$fake" | head -1 | cut -d: -f1)
[ -n "$pos" ] || fail "$name not found in $model"
u32() { od -An -tu4 -j "$1" -N4 "$fake" | tr -d ' '; }
ndims_at=$((pos + ${#name}))
type_at=$((ndims_at + 4 + 8 * $(u32 "$ndims_at")))
[ "$(u32 "$type_at")" = 0 ] || fail "$name is not f32 (type $(u32 "$type_at")) in $model"
printf '\x06\x00\x00\x00' | dd of="$fake" bs=1 seek="$type_at" conv=notrunc status=none  # 6 = q5_0
run_api() {
  env "$@" QLFT_SHARED_DIR="$work/shared" "$api_model" --gtest_filter=ApiModel.Stories260KDefaultNf4 \
    >"$work/api.out" 2>&1 && echo 0 || echo $?
}
[ "$(run_api CI=true)" != 0 ] || fail "a fake UNSUPPORTED from the loader passed: $(cat "$work/api.out")"
grep -q "cannot dequantize" "$work/api.out" || fail "not the fake UNSUPPORTED: $(cat "$work/api.out")"
! grep -q '\[  SKIPPED \]' "$work/api.out" || fail "the fake UNSUPPORTED was reported as a skip"
# And the unpatched model passes, so the failure above is the fake's.
[ "$(env QLFT_SHARED_DIR="$shared" "$api_model" --gtest_filter=ApiModel.Stories260KDefaultNf4 \
  >"$work/api.out" 2>&1 && echo 0 || echo $?)" = 0 ] || fail "the real model failed: $(cat "$work/api.out")"
echo "ok: a fake UNSUPPORTED from the NF4 loader fails test_api_model"
echo OK
