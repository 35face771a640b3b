// Proves the C++ skip guard (QLFT_SKIP, tests/support/test_support.h): the enabled cases check
// the decision for each mode; the DISABLED_ probes are run as whole processes by skip_guard.sh,
// which checks that an unlisted reason fails the process under CI=true and a listed one skips.
#include <gtest/gtest.h>

#include <cstdlib>

#include "support/test_support.h"

namespace {

TEST(SkipGuard, ListIsReadAndHoldsOnlyTheDocumentedReasons) {
  for (const char* c :
       {"fixture-writer", "isa-absent", "no-gpu", "gpu-present", "needs-root", "mpi-off-build"})
    EXPECT_TRUE(qlft_test::skip_expected(c)) << c;
  for (const char* c : {"shared-missing", "not-implemented", "toolchain-missing", "unsupported"})
    EXPECT_FALSE(qlft_test::skip_expected(c)) << c;
}

TEST(SkipGuard, StrictModeFailsUnlistedReasonsOnly) {
  qlft_test::ScopedEnv ci("CI", nullptr), req("QLFT_REQUIRE_SHARED", nullptr),
      strict("QLFT_STRICT_SKIPS", nullptr), gpu("QLFT_REQUIRE_GPU", nullptr);
  EXPECT_FALSE(qlft_test::skip_fails("not-implemented"));  // a local run may skip
  EXPECT_FALSE(qlft_test::skip_fails("no-gpu"));
  for (const char* var : {"CI", "QLFT_REQUIRE_SHARED", "QLFT_STRICT_SKIPS"}) {
    qlft_test::ScopedEnv on(var, std::string(var) == "CI" ? "true" : "1");
    EXPECT_TRUE(qlft_test::skip_fails("not-implemented")) << var;
    EXPECT_TRUE(qlft_test::skip_fails("shared-missing")) << var;
    EXPECT_FALSE(qlft_test::skip_fails("isa-absent")) << var;
    EXPECT_FALSE(qlft_test::skip_fails("no-gpu")) << var;
  }
  qlft_test::ScopedEnv on("QLFT_REQUIRE_GPU", "1");
  EXPECT_TRUE(qlft_test::skip_fails("no-gpu"));
  EXPECT_FALSE(qlft_test::skip_fails("isa-absent"));
}

TEST(SkipGuardProbe, DISABLED_UnlistedReason) {
  QLFT_SKIP("not-implemented") << "probe: a reason that is not in the list";
}

TEST(SkipGuardProbe, DISABLED_ListedReason) {
  QLFT_SKIP("isa-absent") << "probe: a listed reason";
}

TEST(SkipGuardProbe, DISABLED_NoGpu) {
  QLFT_SKIP("no-gpu") << "probe: a GPU test without a GPU";
}

}  // namespace
