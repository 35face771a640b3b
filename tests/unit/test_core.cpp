// Core: dtype conversions against the hardware's own conversion instructions, the budgeted
// allocator, size parsing, the settings table and the op profile's bookkeeping.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "config/config.h"
#include "config/keys.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/fp_env.h"
#include "core/memory.h"
#include "core/profile.h"

using namespace qlft;

namespace {
// Independent oracles: the F16C / AVX512-BF16 instructions, one value at a time. Compiled for F16C
// whatever the build's baseline (QLFT_ARCH=x86-64-v2 has none); every CPU this suite meets has it.
__attribute__((target("f16c"))) uint16_t hw_f16(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float hw_f16_back(uint16_t h) {
  return _cvtsh_ss(h);
}

std::vector<float> interesting_floats() {
  std::vector<float> v = {0.f,       -0.f,        1.f,           -1.f,          65504.f,
                          65519.f,   65520.f,     1e-8f,         5.96e-8f,      2.98e-8f,
                          6.1e-5f,   6.09e-5f,    1e30f,         -1e30f,        INFINITY,
                          -INFINITY, 3.14159265f, 1.0009765625f, 1.00048828125f};
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, 4);
    v.push_back(f);  // NaN included: payloads and quieting follow the instructions too
  }
  return v;
}
}  // namespace

TEST(Half, F16MatchesF16cInstructionsScalarAndBulk) {
  auto v = interesting_floats();
  std::vector<uint16_t> bulk(v.size());
  f32_to_f16_n(v.data(), bulk.data(), v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(f32_to_f16(v[i]), hw_f16(v[i])) << "value " << v[i];
    ASSERT_EQ(bulk[i], hw_f16(v[i])) << "value " << v[i];
  }
  for (uint32_t h = 0; h < 65536; ++h) {
    float a = f16_to_f32(static_cast<uint16_t>(h)), b = hw_f16_back(static_cast<uint16_t>(h));
    ASSERT_EQ(f32_bits(a), f32_bits(b)) << "half " << h;
  }
}

TEST(Half, Bf16RoundsToNearestEvenLikeHardware) {
  auto v = interesting_floats();
  std::vector<uint16_t> bulk(v.size());
  f32_to_bf16_n(v.data(), bulk.data(), v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    // Oracle: exact arithmetic on the bits in 64-bit (round half to even).
    uint32_t u = f32_bits(v[i]);
    uint64_t lower = u & 0xffffu, upper = u >> 16;
    if (lower > 0x8000u || (lower == 0x8000u && (upper & 1))) upper += 1;
    if ((u & 0x7fffffffu) == 0x7f800000u) upper = u >> 16;           // inf stays inf
    if ((u & 0x7fffffffu) > 0x7f800000u) upper = (u >> 16) | 0x40u;  // NaN: quieted, payload kept
    ASSERT_EQ(f32_to_bf16(v[i]), static_cast<uint16_t>(upper)) << v[i];
    ASSERT_EQ(bulk[i], static_cast<uint16_t>(upper)) << v[i];
    ASSERT_EQ(f32_bits(bf16_to_f32(bulk[i])), static_cast<uint32_t>(upper) << 16);
  }
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

// Subnormal results and inputs are zero inside the scope (FTZ, DAZ), as they are not outside
// it, and the thread's MXCSR is the caller's again after it (the library runs on its caller's
// threads).
TEST(FpEnv, ScopedFlushDenormalsFlushesInsideAndRestores) {
  volatile float tiny = 1e-30f, small = 1e-10f;
  auto control = [] { return _mm_getcsr() & ~kMxcsrFlags; };  // MXCSR's control bits
  const unsigned before = control();
  ASSERT_NE(before & kMxcsrFtzDaz, kMxcsrFtzDaz) << "the test thread already flushes";
  const float sub = tiny * small;  // 1e-40: subnormal
  ASSERT_EQ(std::fpclassify(sub), FP_SUBNORMAL);
  volatile float vsub = sub, one = 1.f;
  {
    const ScopedFlushDenormals flush;
    EXPECT_EQ(control() & kMxcsrFtzDaz, kMxcsrFtzDaz);
    EXPECT_EQ(tiny * small, 0.f) << "FTZ: a subnormal result is zero";
    EXPECT_EQ(vsub * one, 0.f) << "DAZ: a subnormal input is zero";
  }
  EXPECT_EQ(control(), before);
  EXPECT_EQ(std::fpclassify(tiny * small), FP_SUBNORMAL);
  {
    const ScopedFlushDenormals off(false);
    EXPECT_EQ(control(), before);
    EXPECT_EQ(vsub * one, sub);
  }
  EXPECT_EQ(control(), before);
}

TEST(Memory, LimitIsEnforcedNamingCategoryAndCountersRestore) {
  MemoryTracker t(1 << 20);
  Buffer a(&t, MemCategory::Weights, 512 << 10, "a");
  MemorySnapshot before = t.snapshot();
  try {
    Buffer b(&t, MemCategory::Activations, 600 << 10, "attention scores");
    FAIL() << "expected out of memory";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_OUT_OF_MEMORY);
    EXPECT_NE(std::string(e.what()).find("activations"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("memory.limit"), std::string::npos) << e.what();
  }
  MemorySnapshot after = t.snapshot();
  EXPECT_EQ(before.total_reserved, after.total_reserved);
  EXPECT_EQ(before.reserved, after.reserved);
  EXPECT_EQ(before.allocated, after.allocated);
}

// Scratch left uninitialized is NaN under the test suite (QLFT_POISON_UNINIT=1 in ctest's
// environment), so a kernel that reads scratch it never wrote fails the oracle tests; a zeroed
// Buffer stays zero either way.
TEST(Memory, UninitScratchIsPoisonedUnderTheSuite) {
  const char* v = std::getenv("QLFT_POISON_UNINIT");
  const bool poison = v && std::strcmp(v, "1") == 0;  // set by ctest, not by a bare run
  MemoryTracker t;
  Buffer u(&t, MemCategory::Workspace, 1000, "scratch", BufferInit::Uninit);
  Buffer z(&t, MemCategory::Workspace, 1000, "zeroed");
  for (int i = 0; i < 250; ++i) {
    if (poison) ASSERT_TRUE(std::isnan(u.as<float>()[i])) << i;
    ASSERT_EQ(z.as<float>()[i], 0.f) << i;
  }
}

TEST(Memory, PeakAndReleaseAccounting) {
  MemoryTracker t;
  {
    Buffer a(&t, MemCategory::Gradients, 1000, "g");
    Buffer b(&t, MemCategory::Gradients, 64, "g2");
    EXPECT_EQ(t.snapshot().reserved[QLFT_MEM_GRADIENTS], 1024u + 64u);  // rounded to 64 bytes
    Buffer c = std::move(a);
    EXPECT_EQ(t.snapshot().reserved[QLFT_MEM_GRADIENTS], 1024u + 64u);
  }
  MemorySnapshot s = t.snapshot();
  EXPECT_EQ(s.reserved[QLFT_MEM_GRADIENTS], 0u);
  EXPECT_EQ(s.peak[QLFT_MEM_GRADIENTS], 1088u);
  EXPECT_EQ(s.total_peak, 1088u);
}

TEST(Memory, InjectedFaultFailsExactlyTheNthAcquire) {
  MemoryTracker t;
  t.fail_nth_acquire(3);
  Buffer a(&t, MemCategory::Workspace, 10, "1");
  Buffer b(&t, MemCategory::Workspace, 10, "2");
  EXPECT_THROW(Buffer(&t, MemCategory::Workspace, 10, "3"), Error);
  Buffer d(&t, MemCategory::Workspace, 10, "4");
  EXPECT_EQ(t.snapshot().reserved[QLFT_MEM_WORKSPACE], 3u * 64u);
}

// The host block cache (a trainer holds it): a freed large block is reused for the same size,
// zeroed again; it is counted as `cached` (total reserved, no category); it never raises the
// total peak or passes the limit; small blocks, and blocks without a holder, go back to the OS.
TEST(MemoryHostCache, ReusesSameSizeBlockZeroedAndCountsIt) {
  const uint64_t mib = 1 << 20;
  MemoryTracker t;
  void* first = nullptr;
  {
    HostCacheHold hold(&t);
    {
      Buffer a(&t, MemCategory::Activations, mib, "a");
      first = a.data();
      std::memset(a.data(), 0xab, mib);
      Buffer small(&t, MemCategory::Activations, 4096, "small");
    }
    MemorySnapshot s = t.snapshot();
    EXPECT_EQ(s.cached, mib);  // the 4 KiB block is below kHostCacheMinBytes: freed
    EXPECT_EQ(s.total_reserved, mib);
    EXPECT_EQ(s.reserved[QLFT_MEM_ACTIVATIONS], 0u);
    EXPECT_EQ(s.allocated[QLFT_MEM_ACTIVATIONS], 0u);
    Buffer b(&t, MemCategory::Workspace, mib, "b");  // any category may take it
    EXPECT_EQ(b.data(), first);
    const auto* p = b.as<unsigned char>();
    EXPECT_EQ(std::count(p, p + mib, 0), static_cast<long>(mib));
    s = t.snapshot();
    EXPECT_EQ(s.cached, 0u);
    EXPECT_EQ(s.reserved[QLFT_MEM_WORKSPACE], mib);
    EXPECT_EQ(s.total_reserved, mib);
    EXPECT_EQ(s.total_peak, mib + 4096);
  }
  EXPECT_EQ(t.total_reserved(), 0u);  // the last holder gone: every cached block returned
  EXPECT_EQ(t.snapshot().cached, 0u);
}

TEST(MemoryHostCache, NeverRaisesThePeakOrPassesTheLimit) {
  const uint64_t mib = 1 << 20;
  MemoryTracker t(3 * mib);
  HostCacheHold hold(&t);
  {
    Buffer a(&t, MemCategory::Activations, 2 * mib, "a");
    Buffer b(&t, MemCategory::Activations, mib, "b");
  }
  EXPECT_EQ(t.snapshot().cached, 3 * mib);
  EXPECT_EQ(t.snapshot().total_peak, 3 * mib);
  {
    // A miss: 3 MiB cached + 1.5 MiB would pass the peak (and the limit): the 2 MiB block goes.
    Buffer c(&t, MemCategory::Activations, 3 * mib / 2, "c");
    MemorySnapshot s = t.snapshot();
    EXPECT_EQ(s.cached, mib);
    EXPECT_EQ(s.total_reserved, 5 * mib / 2);
    EXPECT_EQ(s.total_peak, 3 * mib);
  }
  // A lower limit: the cache gives way instead of failing the allocation.
  t.set_limit(2 * mib);
  Buffer d(&t, MemCategory::Activations, 2 * mib, "d");
  EXPECT_EQ(t.snapshot().cached, 0u);
  EXPECT_EQ(t.total_reserved(), 2 * mib);
  EXPECT_THROW(Buffer(&t, MemCategory::Activations, mib, "e"), Error);  // nothing left to give
}

TEST(MemoryHostCache, NestedHoldersResetPeaksAndInjectedFaults) {
  const uint64_t mib = 1 << 20;
  MemoryTracker t;
  auto outer = std::make_unique<HostCacheHold>(&t);
  { HostCacheHold inner(&t); }
  { Buffer a(&t, MemCategory::Activations, mib, "a"); }
  EXPECT_EQ(t.snapshot().cached, mib);  // the inner holder's end did not trim
  t.fail_nth_acquire(1);
  EXPECT_THROW(Buffer(&t, MemCategory::Activations, mib, "hit"), Error);  // a hit counts too
  EXPECT_EQ(t.snapshot().cached, mib);
  t.reset_peaks();  // a fresh measurement (auto-tuner trials) starts without cached blocks
  EXPECT_EQ(t.snapshot().cached, 0u);
  EXPECT_EQ(t.snapshot().total_peak, 0u);
  outer.reset();
  { Buffer b(&t, MemCategory::Activations, mib, "b"); }
  EXPECT_EQ(t.snapshot().cached, 0u);  // no holder: freed
  EXPECT_EQ(t.total_reserved(), 0u);
}

TEST(Memory, ParseBytes) {
  EXPECT_EQ(parse_bytes("0", "k"), 0u);
  EXPECT_EQ(parse_bytes("4096", "k"), 4096u);
  EXPECT_EQ(parse_bytes("512M", "k"), 512ull << 20);
  EXPECT_EQ(parse_bytes("4GiB", "k"), 4ull << 30);
  EXPECT_EQ(parse_bytes("1.5 G", "k"), 3ull << 29);
  EXPECT_THROW(parse_bytes("lots", "k"), Error);
  EXPECT_THROW(parse_bytes("5 parsecs", "k"), Error);
  EXPECT_THROW(parse_bytes("-1", "k"), Error);
}

TEST(Config, ValidatesEveryTypeAndKeepsOldValueOnError) {
  Config c;
  EXPECT_EQ(c.get("quant.type"), "nf4");
  c.set("quant.type", "INT8");
  EXPECT_EQ(c.get("quant.type"), "int8");
  try {
    c.set("quant.type", "q3");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("quant.type"), std::string::npos);
  }
  EXPECT_EQ(c.get("quant.type"), "int8");
  EXPECT_THROW(c.set("threads", "abc"), Error);
  EXPECT_THROW(c.set("threads", "-1"), Error);
  EXPECT_THROW(c.set("no.such.key", "1"), Error);
  EXPECT_THROW(c.set("memory.limit", "12 apples"), Error);
  c.set("quant.double_quant", "off");
  EXPECT_FALSE(c.get_bool("quant.double_quant"));
  c.set("memory.limit", "2G");
  EXPECT_EQ(c.get_size("memory.limit"), 2ull << 30);
}

TEST(Config, EveryDefaultValidates) {
  for (size_t i = 0; i < key_count(); ++i) {
    const KeyDef& k = key_at(i);
    EXPECT_NO_THROW(validate_value(k, k.default_value)) << k.name;
    EXPECT_TRUE(k.doc && *k.doc) << k.name;
  }
}

namespace {
const prof::Entry* find_entry(const std::vector<prof::Entry>& es, const std::string& path) {
  for (const prof::Entry& e : es)
    if (e.path == path) return &e;
  return nullptr;
}
}  // namespace

TEST(Profile, NestsCountsAndSplitsSelfTime) {
  prof::set_enabled(false);
  { prof::Scope off("t.off"); }
  prof::set_enabled(true);
  prof::reset();
  volatile double sink = 0;
  auto work = [&] {
    for (int i = 0; i < 20000; ++i) sink = sink + std::sqrt(double(i));
  };
  for (int rep = 0; rep < 2; ++rep) {
    prof::Scope a("t.a");
    work();
    for (int i = 0; i < 3; ++i) {
      prof::Scope b("t.b");
      work();
    }
    prof::Scope c("t.c");
    { prof::Scope b("t.b"); }  // the same name under another parent: its own node
  }
  // Inside a parallel region nothing records: the caller's scope holds the region's time.
  {
    prof::Scope p("t.par");
#pragma omp parallel num_threads(2)
    { prof::Scope w("t.worker"); }
  }
  // Another thread with no scope open starts a root of its own.
  std::thread([] { prof::Scope r("t.thread"); }).join();
  prof::set_enabled(false);
  const std::vector<prof::Entry> es = prof::snapshot();
  EXPECT_EQ(find_entry(es, "t.off"), nullptr);
  const prof::Entry* a = find_entry(es, "t.a");
  const prof::Entry* b = find_entry(es, "t.a/t.b");
  const prof::Entry* c = find_entry(es, "t.a/t.c");
  const prof::Entry* cb = find_entry(es, "t.a/t.c/t.b");
  ASSERT_TRUE(a && b && c && cb);
  EXPECT_EQ(a->calls, 2);
  EXPECT_EQ(b->calls, 6);
  EXPECT_EQ(c->calls, 2);
  EXPECT_EQ(cb->calls, 2);
  EXPECT_EQ(a->depth, 0);
  EXPECT_EQ(cb->depth, 2);
  // Self is total less the children's totals, to the nanosecond.
  EXPECT_EQ(a->self_ns, a->total_ns - b->total_ns - c->total_ns);
  EXPECT_EQ(c->self_ns, c->total_ns - cb->total_ns);
  EXPECT_EQ(b->self_ns, b->total_ns);
  EXPECT_GT(b->self_ns, 0);
  EXPECT_GT(a->self_ns, 0);  // its own work() between the children
  ASSERT_NE(find_entry(es, "t.par"), nullptr);
  EXPECT_EQ(find_entry(es, "t.par/t.worker"), nullptr);
  EXPECT_EQ(find_entry(es, "t.worker"), nullptr);
  const prof::Entry* th = find_entry(es, "t.thread");
  ASSERT_NE(th, nullptr);
  EXPECT_EQ(th->depth, 0);

  // The table: the self percentages of every row add up to 100, and "by name" sums t.b's two
  // nodes.
  const std::string table = prof::format_table(es);
  std::istringstream in(table);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "path\tcalls\ttotal_ms\tself_ms\tself_pct");
  double pct = 0;
  while (std::getline(in, line) && !line.empty()) {
    std::vector<std::string> f;
    std::istringstream ls(line);
    for (std::string x; std::getline(ls, x, '\t');) f.push_back(x);
    ASSERT_EQ(f.size(), 5u) << line;
    pct += std::stod(f[4]);
  }
  EXPECT_NEAR(pct, 100.0, 0.01 * double(es.size()));
  std::getline(in, line);
  EXPECT_EQ(line.rfind("by name\t", 0), 0u) << line;
  bool saw_b = false;
  while (std::getline(in, line)) {
    if (line.rfind("t.b\t", 0) != 0) continue;
    saw_b = true;
    const double ms = std::stod(line.substr(4));
    EXPECT_NEAR(ms, (b->self_ns + cb->self_ns) * 1e-6, 1e-3);
  }
  EXPECT_TRUE(saw_b);

  // reset keeps the nodes but drops their counts.
  prof::reset();
  EXPECT_EQ(find_entry(prof::snapshot(), "t.a"), nullptr);
}

// Time measured inside a parallel region is recorded after it as a child of the caller's scope:
// the threads' sum over the team size, every call counted, the parent's self time reduced by it.
TEST(Profile, TeamTimesAddAChildOfTheCallersScope) {
  prof::set_enabled(true);
  prof::reset();
  volatile double sink = 0;
  auto work = [&] {
    double s = 0;
    for (int i = 0; i < 200000; ++i) s += std::sqrt(double(i));
    sink = sink + s;
  };
  int64_t outside_ns = 0;
  {
    prof::Scope p("t.team");
    prof::TeamTimes tt(2);
    std::array<int64_t, 2> mine{};
#pragma omp parallel num_threads(2)
    {
#ifdef _OPENMP
      const int id = omp_get_thread_num();
#else
      const int id = 0;
#endif
      for (int rep = 0; rep < 3; ++rep) {
        const auto c0 = std::chrono::steady_clock::now();
        const int64_t t0 = tt.start();
        work();
        tt.add(id, t0);
        mine[size_t(id)] += std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::steady_clock::now() - c0)
                                .count();
      }
    }
    outside_ns = (mine[0] + mine[1]) / 2;
    tt.report("t.kernel");
    prof::add_child_time("t.direct", 4, 1000);
  }
  // Off: nothing is made or recorded, whatever the calls.
  prof::set_enabled(false);
  {
    prof::TeamTimes off(2);
    off.add(0, off.start());
    off.report("t.off_kernel");
  }
  const std::vector<prof::Entry> es = prof::snapshot();
  const prof::Entry* p = find_entry(es, "t.team");
  const prof::Entry* k = find_entry(es, "t.team/t.kernel");
  const prof::Entry* d = find_entry(es, "t.team/t.direct");
  ASSERT_TRUE(p && k && d);
  EXPECT_EQ(find_entry(es, "t.off_kernel"), nullptr);
#ifdef _OPENMP
  EXPECT_EQ(k->calls, 6);
#else
  EXPECT_EQ(k->calls, 3);
#endif
  EXPECT_EQ(d->calls, 4);
  EXPECT_EQ(d->total_ns, 1000);
  EXPECT_EQ(k->self_ns, k->total_ns);
  EXPECT_EQ(p->self_ns, p->total_ns - k->total_ns - d->total_ns);
  // The team's mean, within the clock reads around it (the test's own clock brackets each one).
  EXPECT_GT(k->total_ns, 0);
  EXPECT_LE(k->total_ns, outside_ns);
  EXPECT_GT(k->total_ns, outside_ns / 2);
  EXPECT_LT(k->total_ns, p->total_ns);
  prof::reset();
}
