// Optimizers against their peers on the same parameters and gradients: AdamW against
// torch.optim.AdamW, AdamW8bit against bitsandbytes.optim.AdamW8bit (its CPU backend), one step
// and several. Then what the peers cannot show: non-finite gradients, state save/load, the
// paged store.
#include <gtest/gtest.h>

#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "config/config.h"
#include "config/run_spec.h"
#include "core/error.h"
#include "core/memory.h"
#include "optim/adamw8bit.h"
#include "optim/optimizer.h"
#include "core/state_store.h"
#include "test_optim_util.h"

using namespace qlft;
using optim_test::Fixture;

namespace {

// The optimizer of an optim.name value, through the settings parser (config/run_spec.h).
OptimizerKind kind_of(const std::string& name) {
  Config c;
  c.set("optim.name", name);
  return parse_run_spec(c).optim.kind;
}

struct OptRun {
  std::vector<std::vector<float>> p, g;
  std::unique_ptr<Optimizer> opt;
};

OptimSettings fixture_settings(const std::string& name) {
  nlohmann::json hp = optim_test::fixture_json()["optim"]["hparams"];
  OptimSettings s;
  s.kind = kind_of(name);
  s.lr = hp["lr"];
  s.beta1 = hp["beta1"];
  s.beta2 = hp["beta2"];
  s.eps = hp["eps"];
  s.weight_decay = hp["weight_decay"];
  return s;
}

size_t numel(const nlohmann::json& shape) {
  size_t n = 1;
  for (auto& d : shape) n *= d.get<size_t>();
  return n;
}

// Parameters start from the fixture's initial values; gradients are copied in per step.
// dir: where a paged optimizer keeps its state files.
OptRun start(const Fixture& fx, const std::string& tag, const OptimSettings& s, MemoryTracker* tr,
             const std::string& dir = "") {
  nlohmann::json shapes = optim_test::fixture_json()["optim"][tag]["shapes"];
  OptRun r;
  std::vector<ParamRef> refs;
  for (size_t i = 0; i < shapes.size(); ++i) {
    r.p.push_back(fx.f32(tag + ".p" + std::to_string(i) + ".init"));
    r.g.emplace_back(numel(shapes[i]), 0.0f);
    EXPECT_EQ(r.p.back().size(), r.g.back().size());
  }
  for (size_t i = 0; i < r.p.size(); ++i)
    refs.push_back({"p" + std::to_string(i), r.p[i].data(), r.g[i].data(), r.p[i].size()});
  r.opt = make_optimizer(s, std::move(refs), tr, host_or_paged_state_stores(dir));
  return r;
}

void load_grads(const Fixture& fx, const std::string& tag, int step, OptRun& r) {
  // copied into the same storage: the optimizer holds pointers to it
  for (size_t i = 0; i < r.g.size(); ++i) {
    std::vector<float> g = fx.f32(tag + ".p" + std::to_string(i) + ".grad" + std::to_string(step));
    ASSERT_EQ(g.size(), r.g[i].size());
    std::copy(g.begin(), g.end(), r.g[i].begin());
  }
}

// Max |ours - ref| in units of the last place of ref (ulp of max(|ref|, tiny)).
double max_ulps(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    float ref = b[i];
    float ulp = std::nextafter(std::fabs(ref), INFINITY) - std::fabs(ref);
    ulp = std::max(ulp, 1e-30f);
    worst = std::max(worst, std::fabs(double(a[i]) - double(ref)) / ulp);
  }
  return worst;
}

size_t count_not_exact(const std::vector<float>& a, const std::vector<float>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

// Relative error of the update (p_after - p_init) against the reference's update.
double update_rel_error(const std::vector<float>& init, const std::vector<float>& ours,
                        const std::vector<float>& ref) {
  std::vector<float> du(init.size()), dr(init.size());
  for (size_t i = 0; i < init.size(); ++i) {
    du[i] = ours[i] - init[i];
    dr[i] = ref[i] - init[i];
  }
  return qlft_test::max_rel_error(du.data(), dr.data(), du.size());
}

std::vector<float> state_f32(const StateDict& d, const std::string& name) {
  const StateTensor& t = d.tensors().at(name);
  std::vector<float> v(t.bytes.size() / 4);
  std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  return v;
}

std::vector<uint8_t> state_u8(const StateDict& d, const std::string& name) {
  return d.tensors().at(name).bytes;
}

}  // namespace

TEST(OptimAdamW, MatchesTorchAdamWOneAndFourSteps) {
  Fixture fx("adamw.safetensors");
  MemoryTracker tr;
  OptimSettings s = fixture_settings("adamw");
  OptRun r = start(fx, "adamw", s, &tr);
  std::vector<std::vector<float>> init = r.p;
  const int steps = optim_test::fixture_json()["optim"]["adamw"]["steps"];
  for (int k = 0; k < steps; ++k) {
    load_grads(fx, "adamw", k, r);
    r.opt->step(s.lr);
    if (k != 0 && k != steps - 1) continue;
    StateDict st;
    r.opt->save_state(st);
    for (size_t i = 0; i < r.p.size(); ++i) {
      const std::string pre = "adamw.p" + std::to_string(i);
      const std::string sk = ".s" + std::to_string(k + 1);
      auto ref = fx.f32(pre + ".after" + std::to_string(k + 1));
      SCOPED_TRACE(pre + " after step " + std::to_string(k + 1));
      EXPECT_LE(qlft_test::max_rel_error(r.p[i].data(), ref.data(), ref.size()), 1e-6);
      EXPECT_LE(update_rel_error(init[i], r.p[i], ref), 1e-4);
      // The same operation order as torch: bit-identical here; torch's vectorized sqrt can
      // differ from sqrtf by an ulp, so one ulp is allowed.
      EXPECT_LE(max_ulps(r.p[i], ref), 1.0);
      auto m = state_f32(st, "optim.p" + std::to_string(i) + ".exp_avg");
      auto v = state_f32(st, "optim.p" + std::to_string(i) + ".exp_avg_sq");
      auto mref = fx.f32(pre + sk + ".exp_avg"), vref = fx.f32(pre + sk + ".exp_avg_sq");
      EXPECT_LE(qlft_test::max_rel_error(m.data(), mref.data(), m.size()), 1e-6);
      EXPECT_LE(qlft_test::max_rel_error(v.data(), vref.data(), v.size()), 1e-6);
    }
  }
  EXPECT_EQ(r.opt->steps(), steps);
  EXPECT_EQ(tr.snapshot().reserved[int(MemCategory::Optimizer)], r.opt->state_bytes());
}

// bitsandbytes AdamW8bit on CPU: p0 has 1000 elements (fp32 state), p1 4096 (exactly
// min_8bit_size: 8-bit), p2 4232 = 16 * 256 + 136 (8-bit, ragged last block).
void check_adamw8bit(const std::string& name) {
  Fixture fx("adamw.safetensors");
  MemoryTracker tr;
  OptimSettings s = fixture_settings(name);
  OptRun r = start(fx, "adamw8bit", s, &tr, qlft_test::temp_dir("optim-paged"));
  std::vector<std::vector<float>> init = r.p;
  const int steps = optim_test::fixture_json()["optim"]["adamw8bit"]["steps"];
  for (int k = 0; k < steps; ++k) {
    load_grads(fx, "adamw8bit", k, r);
    OptimStepStats stats = r.opt->step(s.lr);
    EXPECT_EQ(stats.skipped_elements, 0);
    if (k != 0 && k != steps - 1) continue;
    StateDict st;
    r.opt->save_state(st);
    for (size_t i = 0; i < r.p.size(); ++i) {
      const std::string pre = "adamw8bit.p" + std::to_string(i);
      const std::string sk = pre + ".s" + std::to_string(k + 1);
      const std::string ours = "optim.p" + std::to_string(i);
      auto ref = fx.f32(pre + ".after" + std::to_string(k + 1));
      SCOPED_TRACE(pre + " after step " + std::to_string(k + 1));
      EXPECT_LE(qlft_test::max_rel_error(r.p[i].data(), ref.data(), ref.size()), 1e-6);
      EXPECT_LE(update_rel_error(init[i], r.p[i], ref), 1e-4);
      EXPECT_LE(max_ulps(r.p[i], ref), 2.0);
      EXPECT_LE(count_not_exact(r.p[i], ref), ref.size() / 100) << "params not bit-identical";
      if (fx.has(sk + ".state1")) {
        ASSERT_GE(r.p[i].size(), 4096u);
        for (const char* f : {"state1", "state2"}) {
          auto q = state_u8(st, ours + "." + f), qref = fx.u8(sk + "." + f);
          ASSERT_EQ(q.size(), qref.size());
          size_t diff = 0;
          for (size_t j = 0; j < q.size(); ++j) diff += q[j] != qref[j];
          EXPECT_EQ(diff, 0u) << f << " codes differing from bitsandbytes";
        }
        for (const char* f : {"absmax1", "absmax2"}) {
          auto a = state_f32(st, ours + "." + f), aref = fx.f32(sk + "." + f);
          ASSERT_EQ(a.size(), (r.p[i].size() + 255) / 256);
          EXPECT_LE(max_ulps(a, aref), 2.0) << f;
        }
      } else {
        ASSERT_LT(r.p[i].size(), 4096u);
        auto m = state_f32(st, ours + ".exp_avg"), v = state_f32(st, ours + ".exp_avg_sq");
        EXPECT_LE(max_ulps(m, fx.f32(sk + ".exp_avg")), 2.0);
        EXPECT_LE(max_ulps(v, fx.f32(sk + ".exp_avg_sq")), 2.0);
      }
    }
  }
  EXPECT_EQ(tr.snapshot().reserved[int(MemCategory::Optimizer)], r.opt->state_bytes());
  r.opt.reset();
  EXPECT_EQ(tr.snapshot().reserved[int(MemCategory::Optimizer)], 0u);
}

TEST(OptimAdamW8bit, MatchesBitsandbytesAdamW8bit) {
  check_adamw8bit("adamw8bit");
}
TEST(OptimAdamW8bit, PagedMatchesBitsandbytesAdamW8bit) {
  check_adamw8bit("paged_adamw8bit");
}

// Other betas and eps, lr changed every step, weight decay on (AdamW) / off (8-bit), and a
// last 8-bit block of 4 elements.
TEST(OptimAdamW, VaryingLrAndOtherHyperparametersMatchPeers) {
  Fixture fx("adamw_var.safetensors");
  nlohmann::json j = optim_test::fixture_json()["optim"];
  for (const char* tag : {"adamw_var", "adamw8bit_var"}) {
    SCOPED_TRACE(tag);
    const std::string t = tag;
    MemoryTracker tr;
    OptimSettings s;
    s.kind = kind_of(t == "adamw_var" ? "adamw" : "adamw8bit");
    s.beta1 = j["var_hparams"]["beta1"];
    s.beta2 = j["var_hparams"]["beta2"];
    s.eps = j["var_hparams"]["eps"];
    s.weight_decay = j[t]["weight_decay"];
    std::vector<double> lrs = j[t]["lrs"];
    std::vector<float> p = fx.f16(t + ".init"), g(p.size()), init = p;
    ASSERT_EQ(p.size(), j[t]["n"].get<size_t>());
    auto opt = make_optimizer(s, {{"w", p.data(), g.data(), p.size()}}, &tr);
    for (size_t k = 0; k < lrs.size(); ++k) {
      std::vector<float> gk = fx.f16(t + ".grad" + std::to_string(k));
      std::copy(gk.begin(), gk.end(), g.begin());
      opt->step(lrs[k]);
    }
    auto ref = fx.f32(t + ".after");
    EXPECT_LE(update_rel_error(init, p, ref), 1e-4);
    EXPECT_LE(max_ulps(p, ref), 2.0);
    EXPECT_LE(count_not_exact(p, ref), ref.size() / 100);
    StateDict st;
    opt->save_state(st);
    if (fx.has(t + ".s.state1")) {
      for (const char* f : {"state1", "state2"}) {
        auto q = state_u8(st, std::string("optim.w.") + f), qref = fx.u8(t + ".s." + f);
        size_t diff = 0;
        for (size_t i = 0; i < q.size(); ++i) diff += q[i] != qref[i];
        EXPECT_EQ(diff, 0u) << f;
      }
      for (const char* f : {"absmax1", "absmax2"})
        EXPECT_LE(max_ulps(state_f32(st, std::string("optim.w.") + f), fx.f32(t + ".s." + f)), 2.0);
    } else {
      EXPECT_LE(max_ulps(state_f32(st, "optim.w.exp_avg"), fx.f32(t + ".s.exp_avg")), 1.0);
      EXPECT_LE(max_ulps(state_f32(st, "optim.w.exp_avg_sq"), fx.f32(t + ".s.exp_avg_sq")), 1.0);
    }
  }
}

TEST(OptimAdamW8bit, StateIsQuantizedFromMin8bitSize) {
  MemoryTracker tr;
  std::vector<float> a(4095), ga(4095), b(4096), gb(4096);
  OptimSettings s;
  s.kind = kind_of("adamw8bit");
  auto opt = make_optimizer(
      s, {{"a", a.data(), ga.data(), a.size()}, {"b", b.data(), gb.data(), b.size()}}, &tr);
  StateDict st;
  opt->save_state(st);
  EXPECT_TRUE(st.has("optim.a.exp_avg"));
  EXPECT_FALSE(st.has("optim.a.state1"));
  EXPECT_TRUE(st.has("optim.b.state1"));
  EXPECT_EQ(st.tensors().at("optim.b.absmax2").shape, std::vector<int64_t>{16});
  // fp32 m, v for a; 2 bytes per element + 2 absmax per block for b (host: 64-byte rounding)
  EXPECT_EQ(opt->state_bytes(), 2 * 16384u + 2 * 4096u + 2 * 64u);
}

TEST(OptimAdamW8bit, NonFiniteGradientSkipsThatElement) {
  MemoryTracker tr;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (size_t n : {size_t(600), size_t(5000)}) {
    std::vector<float> p(n), g(n);
    for (auto& x : p) x = nd(rng);
    OptimSettings s;
    s.kind = kind_of("adamw8bit");
    s.lr = 1e-2;
    s.weight_decay = 0.1;
    auto opt = make_optimizer(s, {{"w", p.data(), g.data(), n}}, &tr);
    for (int k = 0; k < 3; ++k) {
      for (auto& x : g) x = nd(rng);
      std::vector<float> before = p;
      g[7] = NAN;
      g[300] = INFINITY;
      g[n - 1] = -INFINITY;
      OptimStepStats stats = opt->step(s.lr);
      EXPECT_EQ(stats.skipped_elements, 3);
      for (size_t j : {size_t(7), size_t(300), n - 1}) EXPECT_EQ(p[j], before[j]) << n << " " << j;
      size_t moved = 0;
      for (size_t j = 0; j < n; ++j) {
        ASSERT_TRUE(std::isfinite(p[j])) << j;
        moved += p[j] != before[j];
      }
      EXPECT_EQ(moved, n - 3);
    }
    StateDict st;
    opt->save_state(st);
    for (const auto& kv : st.tensors())
      if (kv.second.dtype == DType::F32)
        for (size_t j = 0; j < kv.second.bytes.size() / 4; ++j) {
          float v;
          std::memcpy(&v, kv.second.bytes.data() + 4 * j, 4);
          ASSERT_TRUE(std::isfinite(v)) << kv.first;
        }
  }
}

// Copies values into existing storage (the optimizers hold pointers to it).
void assign(std::vector<std::vector<float>>& dst, const std::vector<std::vector<float>>& src) {
  ASSERT_EQ(dst.size(), src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(dst[i].size(), src[i].size());
    std::copy(src[i].begin(), src[i].end(), dst[i].begin());
  }
}

// Stepping A: k steps, save, load into a fresh optimizer, continue; B: the same steps without
// the round trip. Bit-identical parameters and state.
void check_round_trip(const std::string& name) {
  MemoryTracker tr;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  const std::vector<size_t> sizes = {100, 4096 + 77, 300};
  std::vector<std::vector<float>> init, grads[6];
  for (size_t n : sizes) {
    init.emplace_back(n);
    for (auto& x : init.back()) x = nd(rng);
  }
  for (auto& gs : grads)
    for (size_t n : sizes) {
      gs.emplace_back(n);
      for (auto& x : gs.back()) x = nd(rng) * 0.01f;
    }
  OptimSettings s;
  s.kind = kind_of(name);
  s.lr = 1e-3;
  s.weight_decay = 0.01;
  auto make = [&](std::vector<std::vector<float>>& p, std::vector<std::vector<float>>& g) {
    std::vector<ParamRef> refs;
    for (size_t i = 0; i < sizes.size(); ++i)
      refs.push_back({"layer" + std::to_string(i), p[i].data(), g[i].data(), sizes[i]});
    return make_optimizer(s, refs, &tr);
  };
  std::vector<std::vector<float>> pa = init, pb = init, ga = grads[0], gb = grads[0];
  auto a = make(pa, ga), b = make(pb, gb);
  for (int k = 0; k < 3; ++k) {
    assign(ga, grads[k]);
    assign(gb, grads[k]);
    a->step(1e-3);
    b->step(1e-3);
  }
  StateDict saved;
  a->save_state(saved);
  a.reset();
  std::vector<std::vector<float>> pc = pa, gc = ga;  // the weights a checkpoint would hold
  auto c = make(pc, gc);
  c->load_state(saved);
  EXPECT_EQ(c->steps(), 3);
  for (int k = 3; k < 6; ++k) {
    assign(gc, grads[k]);
    assign(gb, grads[k]);
    c->step(1e-3 * (k + 1));
    b->step(1e-3 * (k + 1));
  }
  for (size_t i = 0; i < sizes.size(); ++i)
    EXPECT_EQ(0, std::memcmp(pc[i].data(), pb[i].data(), sizes[i] * 4)) << name << " " << i;
  StateDict sb, sc;
  b->save_state(sb);
  c->save_state(sc);
  ASSERT_EQ(sb.size(), sc.size());
  for (const auto& kv : sb.tensors()) EXPECT_EQ(kv.second.bytes, sc.tensors().at(kv.first).bytes);
}

TEST(OptimState, SaveLoadStepEqualsUninterruptedAdamW) {
  check_round_trip("adamw");
}
TEST(OptimState, SaveLoadStepEqualsUninterruptedAdamW8bit) {
  check_round_trip("adamw8bit");
}
TEST(OptimState, SaveLoadStepEqualsUninterruptedPaged) {
  check_round_trip("paged_adamw8bit");
}

TEST(OptimState, LoadRejectsMismatchesNamingThemAndChangesNothing) {
  MemoryTracker tr;
  std::vector<float> p(5000, 1.0f), g(5000, 0.5f), q(10, 1.0f), gq(10, 0.5f);
  OptimSettings s;
  s.kind = kind_of("adamw8bit");
  auto opt = make_optimizer(
      s, {{"big", p.data(), g.data(), 5000}, {"small", q.data(), gq.data(), 10}}, &tr);
  opt->step(1e-3);
  StateDict good;
  opt->save_state(good);
  auto expect_format = [&](const StateDict& d, const std::string& needle) {
    try {
      opt->load_state(d);
      ADD_FAILURE() << "expected QLFT_ERR_FORMAT mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), QLFT_ERR_FORMAT);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    StateDict now;
    opt->save_state(now);
    for (const auto& kv : good.tensors())
      EXPECT_EQ(kv.second.bytes, now.tensors().at(kv.first).bytes);
  };
  {  // an absmax of the wrong length
    StateDict d = good;
    std::vector<float> a(19, 0.0f);
    d.put_f32("optim.big.absmax1", a.data(), a.size());
    expect_format(d, "optim.big.absmax1");
  }
  {  // codes with the wrong dtype
    StateDict d = good;
    std::vector<float> a(5000, 0.0f);
    d.put_f32("optim.big.state2", a.data(), a.size());
    expect_format(d, "optim.big.state2");
  }
  {  // a missing entry (the small tensor's fp32 state), after valid big-tensor entries
    StateDict d;
    for (const auto& kv : good.tensors())
      if (kv.first != "optim.small.exp_avg_sq")
        d.put(kv.first, kv.second.dtype, kv.second.shape, kv.second.bytes.data(),
              kv.second.bytes.size());
    std::vector<uint8_t> zeros(5000, 0);
    d.put_u8("optim.big.state1", zeros.data(), zeros.size());
    expect_format(d, "optim.small.exp_avg_sq");
  }
  {  // another optimizer's state
    MemoryTracker tr2;
    OptimSettings s2;
    s2.kind = kind_of("adamw");
    auto other = make_optimizer(
        s2, {{"big", p.data(), g.data(), 5000}, {"small", q.data(), gq.data(), 10}}, &tr2);
    StateDict d;
    other->save_state(d);
    expect_format(d, "adamw");
  }
}

TEST(OptimPaged, StoreLeavesNoFileAndCountsOptimizerBytes) {
  namespace fs = std::filesystem;
  std::string dir = qlft_test::temp_dir("optim-offload");
  MemoryTracker tr;
  {
    auto store = make_paged_state_store(&tr, dir);
    EXPECT_TRUE(store->paged());
    auto* a = static_cast<uint8_t*>(store->allocate(1 << 20, "test a"));
    auto* b = static_cast<float*>(store->allocate(1000, "test b"));
    for (int i = 0; i < (1 << 20); ++i) ASSERT_EQ(a[i], 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
    a[123] = 7;
    b[5] = 1.5f;
    EXPECT_EQ(a[123], 7);
    EXPECT_EQ(store->bytes(), (1u << 20) + 1000u);
    EXPECT_EQ(tr.snapshot().reserved[int(MemCategory::Optimizer)], (1u << 20) + 1000u);
    EXPECT_TRUE(fs::is_empty(dir)) << "a state file is visible in offload.dir";
  }
  EXPECT_EQ(tr.snapshot().reserved[int(MemCategory::Optimizer)], 0u);
  EXPECT_TRUE(fs::is_empty(dir));
  {  // through the optimizer
    std::vector<float> p(70000, 1.0f), g(70000, 0.1f);
    OptimSettings s;
    s.kind = kind_of("paged_adamw8bit");
    auto opt = make_optimizer(s, {{"w", p.data(), g.data(), p.size()}}, &tr,
                              host_or_paged_state_stores(dir));
    opt->step(1e-3);
    EXPECT_TRUE(fs::is_empty(dir));
    EXPECT_GE(tr.snapshot().reserved[int(MemCategory::Optimizer)], 2 * 70000u);
  }
  EXPECT_TRUE(fs::is_empty(dir));
  fs::remove_all(dir);
}

// The point of the paged store: the kernel can write the state back to its (unnamed) file and
// drop it from RAM, and reading it again gives the same bytes.
TEST(OptimPaged, StateSurvivesBeingPagedOut) {
  std::string dir = qlft_test::temp_dir("optim-pageout");
  MemoryTracker tr;
  auto store = make_paged_state_store(&tr, dir);
  const size_t bytes = 8u << 20;
  auto* a = static_cast<uint8_t*>(store->allocate(bytes, "pageout"));
  for (size_t i = 0; i < bytes; ++i) a[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE)), pages = bytes / page;
  auto resident = [&] {
    std::vector<unsigned char> v(pages);
    EXPECT_EQ(::mincore(a, bytes, v.data()), 0);
    size_t r = 0;
    for (unsigned char c : v) r += c & 1;
    return r;
  };
  EXPECT_EQ(resident(), pages);
  struct statfs sf;
  ASSERT_EQ(::statfs(dir.c_str(), &sf), 0);
#ifdef MADV_PAGEOUT
  // Dirty shared pages are written back first (what the kernel's own writeback would do
  // under pressure); then they can be reclaimed.
  ASSERT_EQ(::msync(a, bytes, MS_SYNC), 0);
  if (::madvise(a, bytes, MADV_PAGEOUT) == 0 && sf.f_type != TMPFS_MAGIC) {
    EXPECT_LT(resident(), pages / 2) << "pages of a file-backed mapping were not reclaimed";
  }
#endif
  for (size_t i = 0; i < bytes; ++i)
    ASSERT_EQ(a[i], static_cast<uint8_t>(i * 2654435761u >> 13)) << i;
  store.reset();
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  std::filesystem::remove_all(dir);
}

TEST(OptimPaged, BadOffloadDirIsAnIoError) {
  MemoryTracker tr;
  try {
    make_paged_state_store(&tr, "/nonexistent/qlft-offload");
    ADD_FAILURE() << "expected QLFT_ERR_IO";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_IO);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/qlft-offload"), std::string::npos);
  }
}

TEST(OptimPaged, TrackerLimitFailsCleanly) {
  MemoryTracker tr(100000);
  std::vector<float> p(70000), g(70000);
  OptimSettings s;
  s.kind = kind_of("paged_adamw8bit");
  try {
    make_optimizer(s, {{"w", p.data(), g.data(), p.size()}}, &tr);
    ADD_FAILURE() << "expected QLFT_ERR_OUT_OF_MEMORY";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_OUT_OF_MEMORY);
  }
  EXPECT_EQ(tr.total_reserved(), 0u);
}

TEST(OptimSettings, RejectsBadArguments) {
  MemoryTracker tr;
  std::vector<float> p(4), g(4);
  OptimSettings s;
  EXPECT_THROW(kind_of("sgd"), Error);  // an unknown optimizer never reaches make_optimizer
  s.kind = kind_of("adamw");
  EXPECT_THROW(make_optimizer(s, {{"w", p.data(), g.data(), 4}, {"w", p.data(), g.data(), 4}}, &tr),
               Error);
  EXPECT_THROW(make_optimizer(s, {{"w", nullptr, g.data(), 4}}, &tr), Error);
  s.beta2 = 1.0;
  EXPECT_THROW(make_optimizer(s, {{"w", p.data(), g.data(), 4}}, &tr), Error);
  s.beta2 = 0.999;
  for (const char* name : {"adamw", "adamw8bit"}) {
    s.kind = kind_of(name);
    auto opt = make_optimizer(s, {{"w", p.data(), g.data(), 4}}, &tr);
    EXPECT_THROW(opt->step(NAN), Error);
    EXPECT_THROW(opt->step(-1e-3), Error);
    EXPECT_EQ(opt->steps(), 0);
  }
}
