// Run-time ISA dispatch: every bulk-conversion path this CPU can run gives the scalar rules' bits
// (the native AVX512-BF16 path included, whose instruction flushes subnormal inputs), and the
// QLFT_CPU_ISA cap is applied or refused as documented.
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/cpu_isa.h"
#include "core/half_bulk.h"
#include "qlft.h"
#include "support/test_support.h"

extern char** environ;

using namespace qlft;

namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Every class of input the rules distinguish: zeros, subnormals (the native instruction's
// weak spot) of both signs, rounding ties to even and to odd, the largest finite values, inf,
// quiet and signalling NaN with payloads, then random bit patterns. The count is not a multiple
// of 8 or 16, so the vector loops' tails run too.
std::vector<float> edge_floats() {
  std::vector<uint32_t> bits = {
      0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x00008000u, 0x00018000u, 0x0000ffffu,
      0x007fffffu, 0x807fffffu, 0x007f8000u, 0x00800000u, 0x80800000u, 0x3f808000u, 0x3f818000u,
      0x3f80ffffu, 0x3f807fffu, 0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, 0x7f800000u, 0xff800000u,
      0x7fc00000u, 0xffc00000u, 0x7fc00001u, 0x7f800001u, 0xff800001u, 0x7fa00000u, 0x7fbfffffu,
      0x33000000u, 0x33000001u, 0x387fe000u, 0x38800000u, 0x477fe000u, 0x477ff000u, 0x477fefffu};
  std::mt19937 rng(11);
  for (int i = 0; i < 100003; ++i) bits.push_back(rng());
  // Random subnormals: the class the native path must patch.
  for (int i = 0; i < 4001; ++i) bits.push_back((rng() & 0x807fffffu));
  std::vector<float> v;
  for (uint32_t u : bits) v.push_back(from_bits(u));
  return v;
}

std::vector<uint16_t> all_halves() {
  std::vector<uint16_t> h(65536 + 7);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint16_t>(i);
  return h;
}

const CpuIsa kLevels[] = {CpuIsa::Baseline, CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Avx512Bf16};

// Runs op at `level` and compares with the scalar rules; false when the CPU lacks the level.
bool check_level(CpuIsa level, BulkOp op) {
  const auto v = edge_floats();
  const auto h = all_halves();
  switch (op) {
    case BulkOp::F32ToBf16:
    case BulkOp::F32ToF16: {
      std::vector<uint16_t> out(v.size(), 0xdead);
      if (!bulk_convert_at(level, op, v.data(), out.data(), v.size())) return false;
      for (size_t i = 0; i < v.size(); ++i) {
        const uint16_t want = op == BulkOp::F32ToBf16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
        EXPECT_EQ(out[i], want) << cpu_isa_name(level) << " input bits 0x" << std::hex
                                << f32_bits(v[i]);
        if (out[i] != want) return true;
      }
      return true;
    }
    case BulkOp::RoundThroughBf16: {
      std::vector<float> out(v.size());
      if (!bulk_convert_at(level, op, v.data(), out.data(), v.size())) return false;
      for (size_t i = 0; i < v.size(); ++i) {
        const uint32_t want = f32_bits(bf16_to_f32(f32_to_bf16(v[i])));
        EXPECT_EQ(f32_bits(out[i]), want)
            << cpu_isa_name(level) << " input bits 0x" << std::hex << f32_bits(v[i]);
        if (f32_bits(out[i]) != want) return true;
      }
      return true;
    }
    case BulkOp::Bf16ToF32:
    case BulkOp::F16ToF32: {
      std::vector<float> out(h.size());
      if (!bulk_convert_at(level, op, h.data(), out.data(), h.size())) return false;
      for (size_t i = 0; i < h.size(); ++i) {
        const float want = op == BulkOp::Bf16ToF32 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
        EXPECT_EQ(f32_bits(out[i]), f32_bits(want)) << cpu_isa_name(level) << " half " << h[i];
        if (f32_bits(out[i]) != f32_bits(want)) return true;
      }
      return true;
    }
  }
  return false;
}

}  // namespace

// The scalar rules themselves, against exact integer arithmetic on the bits (independent of
// half.h's formulation): round half to even on the low 16 bits, subnormals kept, NaN quieted.
TEST(IsaConvert, ScalarBf16RulesMatchIntegerOracle) {
  for (float f : edge_floats()) {
    const uint32_t u = f32_bits(f);
    uint32_t upper = u >> 16;
    const uint32_t lower = u & 0xffffu;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      upper |= 0x40u;
    } else if (lower > 0x8000u || (lower == 0x8000u && (upper & 1u))) {
      upper += 1;
    }
    ASSERT_EQ(f32_to_bf16(f), static_cast<uint16_t>(upper)) << std::hex << u;
  }
}

TEST(IsaConvert, EveryPathBelowTheNativeOneMatchesTheScalarRules) {
  int levels_run = 0;
  for (CpuIsa level : {CpuIsa::Baseline, CpuIsa::Avx2, CpuIsa::Avx512}) {
    bool ran = false;
    for (BulkOp op : {BulkOp::F32ToBf16, BulkOp::Bf16ToF32, BulkOp::F32ToF16, BulkOp::F16ToF32,
                      BulkOp::RoundThroughBf16})
      ran = check_level(level, op) || ran;
    if (ran)
      ++levels_run;
    else
      std::printf("level %s: not on this CPU (%s)\n", cpu_isa_name(level), cpu_isa_name(cpu_isa()));
  }
  // The scalar path runs everywhere, and every x86-64 CPU this project has met has AVX2.
  EXPECT_GE(levels_run, cpu_isa() >= CpuIsa::Avx2 ? 2 : 1);
}

// Done-when of issue 15: native and fallback conversions give identical bits on subnormals,
// ties, NaN and infinities. Needs a CPU with AVX512-BF16 (and no QLFT_CPU_ISA cap below it).
TEST(IsaConvert, NativeBf16PathMatchesTheFallbackBits) {
  if (cpu_isa() < CpuIsa::Avx512Bf16)
    QLFT_SKIP("isa-absent") << "ISA path absent: this CPU (capped: " << cpu_isa_name(cpu_isa())
                            << ", found: " << cpu_isa_name(cpu_isa_detected())
                            << ") has no AVX512-BF16; the native bf16 conversion cannot run here";
  ASSERT_EQ(bulk_convert_path(CpuIsa::Avx512Bf16, BulkOp::F32ToBf16), CpuIsa::Avx512Bf16);
  ASSERT_TRUE(check_level(CpuIsa::Avx512Bf16, BulkOp::F32ToBf16));
  ASSERT_TRUE(check_level(CpuIsa::Avx512Bf16, BulkOp::RoundThroughBf16));
  // And the same bits as the AVX-512 integer path it falls back to.
  const auto v = edge_floats();
  std::vector<uint16_t> a(v.size()), b(v.size());
  ASSERT_TRUE(bulk_convert_at(CpuIsa::Avx512Bf16, BulkOp::F32ToBf16, v.data(), a.data(), v.size()));
  ASSERT_TRUE(bulk_convert_at(CpuIsa::Avx512, BulkOp::F32ToBf16, v.data(), b.data(), v.size()));
  EXPECT_EQ(a, b);
}

TEST(IsaConvert, LevelsAboveTheCpuAreRefusedNotFaked) {
  for (CpuIsa level : kLevels) {
    float x = 1.f;
    uint16_t y = 0;
    const bool ran = bulk_convert_at(level, BulkOp::F32ToBf16, &x, &y, 1);
    EXPECT_EQ(ran, level <= cpu_isa()) << cpu_isa_name(level);
    if (ran) EXPECT_EQ(y, 0x3f80);
  }
}

// ---- the QLFT_CPU_ISA cap, in child processes (the level is read once per process) -----------

namespace {

// A child is this test binary started with QLFT_ISA_CHILD=<check>: the check runs before
// GoogleTest's main (from a static initializer) and the process exits 0 when it holds, 1 with a
// message when not, so the checks are not test cases of their own.
int child_check(const std::string& check) {
  auto fail = [](const std::string& why) {
    std::fprintf(stderr, "isa child: %s\n", why.c_str());
    return 1;
  };
  if (check == "baseline_applied") {
    if (cpu_isa() != CpuIsa::Baseline) return fail(std::string("isa ") + cpu_isa_name(cpu_isa()));
    const std::string info = qlft_build_info();
    if (info.find(" isa=baseline ") == std::string::npos ||
        info.find(std::string(" cpu=") + cpu_isa_name(cpu_isa_detected()) + " ") ==
            std::string::npos)
      return fail("build info: " + info);
    // The baseline path is the scalar code.
    const auto v = edge_floats();
    std::vector<uint16_t> out(v.size());
    f32_to_bf16_n(v.data(), out.data(), v.size());
    for (size_t i = 0; i < v.size(); ++i)
      if (out[i] != f32_to_bf16(v[i])) return fail("bulk differs from scalar");
    return 0;
  }
  if (check == "unknown_refused") {
    qlft_runtime* rt = nullptr;
    if (qlft_runtime_create(nullptr, &rt) != QLFT_ERR_INVALID_ARGUMENT || rt != nullptr)
      return fail("runtime created despite QLFT_CPU_ISA=sse9");
    const std::string err = qlft_last_error();
    if (err.find("QLFT_CPU_ISA") == std::string::npos || err.find("'sse9'") == std::string::npos ||
        err.find("avx512_bf16") == std::string::npos)
      return fail("message: " + err);
    return 0;
  }
  if (check == "above_cpu_clamped")
    return cpu_isa() == cpu_isa_detected() ? 0 : fail("cap above the CPU changed the level");
  return fail("unknown check " + check);
}

const int kChildStatus = [] {
  const char* check = std::getenv("QLFT_ISA_CHILD");
  if (check != nullptr) std::exit(child_check(check));
  return 0;
}();

// Runs this test binary as the child `check` with QLFT_CPU_ISA=value; returns its exit status.
int run_child(const char* check, const char* value) {
  std::vector<std::string> env_store;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "QLFT_CPU_ISA=", 13) != 0 && std::strncmp(*e, "QLFT_ISA_CHILD=", 15) != 0)
      env_store.emplace_back(*e);
  env_store.push_back(std::string("QLFT_CPU_ISA=") + value);
  env_store.push_back(std::string("QLFT_ISA_CHILD=") + check);
  std::vector<char*> envp;
  for (auto& s : env_store) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe";
  char* argv[] = {self.data(), nullptr};
  pid_t pid;
  if (posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv, envp.data()) != 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

TEST(IsaCap, EnvironmentCapIsAppliedRefusedOrClamped) {
  (void)kChildStatus;
  EXPECT_EQ(run_child("baseline_applied", "baseline"), 0);
  EXPECT_EQ(run_child("unknown_refused", "sse9"), 0);
  EXPECT_EQ(run_child("above_cpu_clamped", "amx"), 0);
  // The harness can fail: a child whose expectation does not hold reports it.
  if (cpu_isa_detected() > CpuIsa::Baseline) EXPECT_EQ(run_child("baseline_applied", "avx2"), 1);
  EXPECT_EQ(run_child("no_such_check", "avx2"), 1);
}
