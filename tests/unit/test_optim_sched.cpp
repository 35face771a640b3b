// Learning-rate schedules against transformers' schedulers, gradient clipping against
// torch.nn.utils.clip_grad_norm_, and the fp16 loss scaler against the update rule torch's
// GradScaler runs (torch._amp_update_scale_, _amp_foreach_non_finite_check_and_unscale_).
#include <gtest/gtest.h>

#include <cmath>

#include "config/config.h"
#include "config/run_spec.h"
#include "core/error.h"
#include "optim/grad_clip.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "test_optim_util.h"

using namespace qlft;
using optim_test::Fixture;

TEST(OptimSchedule, MatchesTransformersSchedulers) {
  nlohmann::json j = optim_test::fixture_json()["schedule"];
  const double base = j["base_lr"];
  const int64_t total = j["total_steps"], warmup = j["warmup_steps"];
  struct Case {
    const char* fixture;
    const char* name;
    int64_t warmup;
    double min_ratio;
  };
  const Case cases[] = {{"constant", "constant", warmup, 0.0},
                        {"linear", "linear", warmup, 0.0},
                        {"cosine", "cosine", warmup, 0.0},
                        {"cosine_min0.1", "cosine", warmup, 0.1},
                        {"linear_nowarmup", "linear", 0, 0.0}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fixture);
    Config cfg;  // the schedule named as the settings name it
    cfg.set("sched.name", c.name);
    ScheduleSettings s;
    s.kind = parse_run_spec(cfg).sched.kind;
    s.warmup_steps = c.warmup;
    s.min_lr_ratio = c.min_ratio;
    LrSchedule sched(s, base, total);
    std::vector<double> ref = j["cases"][c.fixture];
    ASSERT_EQ(ref.size(), size_t(total + 5));
    for (size_t k = 0; k < ref.size(); ++k) {
      EXPECT_NEAR(sched.current_lr(), ref[k], 1e-15 + 1e-12 * std::fabs(ref[k])) << "step " << k;
      EXPECT_EQ(sched.lr_at(int64_t(k)), sched.current_lr());
      sched.advance();
    }
  }
}

TEST(OptimSchedule, StateRoundTripAndValidation) {
  ScheduleSettings s;
  s.kind = ScheduleKind::Cosine;
  s.warmup_steps = 3;
  LrSchedule a(s, 1e-3, 100);
  for (int i = 0; i < 17; ++i) a.advance();
  StateDict d;
  a.save_state(d);
  LrSchedule b(s, 1e-3, 100);
  b.load_state(d);
  EXPECT_EQ(b.step(), 17);
  EXPECT_EQ(b.current_lr(), a.current_lr());
  s.kind = ScheduleKind::Linear;
  LrSchedule c(s, 1e-3, 100);
  try {
    c.load_state(d);
    ADD_FAILURE() << "expected QLFT_ERR_FORMAT";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_FORMAT);
    EXPECT_NE(std::string(e.what()).find("sched.type"), std::string::npos) << e.what();
  }
  EXPECT_EQ(c.step(), 0);
  Config cfg;  // an unknown schedule is refused where settings enter
  EXPECT_THROW(cfg.set("sched.name", "step"), Error);
}

TEST(OptimClip, MatchesTorchClipGradNorm) {
  Fixture fx("clip.safetensors");
  nlohmann::json j = optim_test::fixture_json()["clip"];
  for (const char* c : {"clipped", "unclipped"}) {
    SCOPED_TRACE(c);
    std::vector<std::vector<float>> g;
    std::vector<GradSpan> spans;
    for (int i = 0; i < 3; ++i)
      g.push_back(fx.f32(std::string(c) + ".g" + std::to_string(i) + ".before"));
    for (auto& v : g) spans.push_back({v.data(), v.size()});
    const double ref_norm = j[c]["total_norm"];
    ClipResult r = clip_grad_norm(spans, j[c]["max_norm"].get<double>());
    EXPECT_TRUE(r.finite);
    EXPECT_NEAR(r.norm, ref_norm, 1e-6 * ref_norm);
    EXPECT_EQ(r.clipped, std::string(c) == "clipped");
    for (int i = 0; i < 3; ++i) {
      auto ref = fx.f32(std::string(c) + ".g" + std::to_string(i) + ".after");
      EXPECT_LE(qlft_test::max_rel_error(g[i].data(), ref.data(), ref.size()), 1e-6) << i;
    }
    if (r.clipped) {  // the clipped gradients have (almost) max_norm
      EXPECT_NEAR(global_grad_norm(spans), 1.0, 1e-5);
    }
  }
}

TEST(OptimClip, NonFiniteNormIsReportedAndNothingScaled) {
  std::vector<float> a = {3.0f, 4.0f}, b = {1.0f, NAN};
  std::vector<GradSpan> spans = {{a.data(), 2}, {b.data(), 2}};
  ClipResult r = clip_grad_norm(spans, 1.0);
  EXPECT_FALSE(r.finite);
  EXPECT_FALSE(r.clipped);
  EXPECT_EQ(a[0], 3.0f);
  b[1] = INFINITY;
  r = clip_grad_norm(spans, 1.0);
  EXPECT_FALSE(r.finite);
  EXPECT_TRUE(std::isinf(r.norm));
  EXPECT_EQ(a[1], 4.0f);
  // max_norm 0: measure only; the norm itself is computed in double (3-4-5 exactly)
  b = {0.0f, 0.0f};
  r = clip_grad_norm(spans, 0.0);
  EXPECT_EQ(r.norm, 5.0);
  EXPECT_FALSE(r.clipped);
}

TEST(OptimScaler, MatchesTorchUpdateScaleSequence) {
  nlohmann::json j = optim_test::fixture_json()["scaler"];
  ScalerSettings s;
  s.init_scale = j["init_scale"];
  s.growth_factor = j["growth_factor"];
  s.backoff_factor = j["backoff_factor"];
  s.growth_interval = j["growth_interval"];
  LossScaler sc(s);
  std::vector<int> pattern = j["found_inf"];
  std::vector<double> scales = j["scales_after"];
  for (size_t k = 0; k < pattern.size(); ++k) {
    sc.update(pattern[k] != 0);
    EXPECT_EQ(double(sc.scale()), scales[k]) << "step " << k;
  }
}

TEST(OptimScaler, UnscaleMatchesTorchAndFindsInf) {
  Fixture fx("scaler.safetensors");
  nlohmann::json j = optim_test::fixture_json()["scaler"];
  auto g0 = fx.f32("g0"), g1 = fx.f32("g1");
  std::vector<GradSpan> spans = {{g0.data(), g0.size()}, {g1.data(), g1.size()}};
  bool found = unscale_and_check(spans, j["unscale_inv_scale"].get<float>());
  EXPECT_EQ(found, j["unscale_found_inf"].get<double>() != 0);
  auto r0 = fx.f32("g0.unscaled"), r1 = fx.f32("g1.unscaled");
  EXPECT_EQ(0, std::memcmp(g0.data(), r0.data(), 4 * r0.size()));
  EXPECT_EQ(0, std::memcmp(g1.data(), r1.data(), 4 * r1.size()));
  g1[3] = NAN;
  EXPECT_TRUE(unscale_and_check(spans, 1.0f));
  g1[3] = -INFINITY;
  EXPECT_TRUE(unscale_and_check(spans, 0.5f));
}

// The training-loop contract: an injected inf skips the step and halves the scale; after
// growth_interval clean steps the scale doubles; the parameters never see a non-finite value.
TEST(OptimScaler, SkipsOnInjectedInfBacksOffAndGrows) {
  ScalerSettings s;  // defaults: 65536, x2, x0.5, 2000
  EXPECT_EQ(s.init_scale, 65536.0);
  s.growth_interval = 4;
  LossScaler sc(s);
  MemoryTracker tr;
  std::vector<float> p(64, 1.0f), g(64);
  OptimSettings os;
  auto opt = make_optimizer(os, {{"w", p.data(), g.data(), p.size()}}, &tr);
  int applied = 0;
  std::vector<float> scale_seen;
  for (int step = 0; step < 12; ++step) {
    for (size_t i = 0; i < g.size(); ++i)
      g[i] = 0.01f * float(i % 7) * sc.scale();  // "scaled" grads
    if (step == 2 || step == 3) g[5] = INFINITY;
    std::vector<float> before = p;
    bool inf = sc.unscale_and_check({{g.data(), g.size()}});
    if (!inf) {
      opt->step(1e-3);
      ++applied;
    }
    sc.update(inf);
    scale_seen.push_back(sc.scale());
    if (inf) EXPECT_EQ(p, before) << "step " << step << " was not skipped";
    for (float x : p) ASSERT_TRUE(std::isfinite(x));
  }
  EXPECT_EQ(applied, 10);
  EXPECT_EQ(opt->steps(), 10);
  EXPECT_EQ(sc.skipped_steps(), 2);
  // 65536 -> steps 0,1 clean -> step 2 inf: 32768 -> step 3 inf: 16384 -> 4 clean steps (4..7):
  // 32768 -> 4 more (8..11): 65536
  const std::vector<float> expect = {65536, 65536, 32768, 16384, 16384, 16384,
                                     16384, 32768, 32768, 32768, 32768, 65536};
  EXPECT_EQ(scale_seen, expect);
  StateDict d;
  sc.save_state(d);
  LossScaler sc2(s);
  sc2.load_state(d);
  EXPECT_EQ(sc2.scale(), sc.scale());
  EXPECT_EQ(sc2.growth_tracker(), sc.growth_tracker());
  EXPECT_EQ(sc2.skipped_steps(), 2);
}

TEST(OptimScaler, TinyInitialScaleRecoversByGrowing) {
  ScalerSettings s;
  s.init_scale = 1.0 / 1024;
  s.growth_interval = 1;
  LossScaler sc(s);
  for (int i = 0; i < 30; ++i) sc.update(false);
  EXPECT_EQ(sc.scale(), float(std::ldexp(1.0, 20)));
  ScalerSettings big;
  big.init_scale = 3e38;
  big.growth_interval = 1;
  LossScaler sb(big);
  sb.update(false);  // growing would overflow float: kept
  EXPECT_EQ(sb.scale(), 3e38f);
}

TEST(OptimConfig, SettingsComeFromTheKeyTable) {
  Config cfg;
  OptimSettings d = qlft::parse_run_spec(cfg).optim;
  EXPECT_EQ(d.kind, OptimizerKind::AdamW);
  EXPECT_EQ(d.beta2, 0.999);
  ScalerSettings sd = qlft::parse_run_spec(cfg).scaler;
  EXPECT_EQ(sd.init_scale, 65536.0);
  EXPECT_EQ(sd.backoff_factor, 0.5);
  EXPECT_EQ(sd.growth_factor, 2.0);
  EXPECT_EQ(sd.growth_interval, 2000);
  cfg.set("optim.name", "paged_adamw8bit");
  cfg.set("optim.lr", "3e-4");
  cfg.set("sched.name", "cosine");
  cfg.set("sched.warmup_steps", "10");
  cfg.set("offload.dir", "/tmp/x");
  OptimSettings o = qlft::parse_run_spec(cfg).optim;
  EXPECT_EQ(o.kind, OptimizerKind::PagedAdamW8bit);
  EXPECT_EQ(o.lr, 3e-4);
  EXPECT_EQ(qlft::parse_run_spec(cfg).offload.dir, "/tmp/x");
  ScheduleSettings ss = qlft::parse_run_spec(cfg).sched;
  EXPECT_EQ(ss.kind, ScheduleKind::Cosine);
  EXPECT_EQ(ss.warmup_steps, 10);
  EXPECT_THROW(cfg.set("optim.name", "sgd"), Error);
  EXPECT_THROW(cfg.set("scaler.backoff_factor", "2"), Error);
}
