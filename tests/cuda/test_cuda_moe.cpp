// Mixture-of-experts layers on the CUDA backend (the emulator in the cuda-emu build), issue 48's
// criterion 3. The row ops (gather_rows, combine_rows, row_dots) against a scalar oracle (the
// CPU backend's host defaults too), with host and device-resident index arrays; then the tiny
// Mixtral and Qwen3-MoE models of tests/reference/gen_family_fixtures.py --moe (the fixtures
// test_families holds to transformers and PEFT on the CPU): trainer steps with backend=cuda
// follow backend=cpu (fp32), and a bf16 step's LoRA gradients follow the CPU's bf16 step; the
// planner's device activations (the MoE saved state among them) equal the tracker's; a block
// with PEFT's LoRA on the experts and the router follows the CPU's.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/autocast_backend.h"
#include "backend/cuda_entry.h"
#include "backend/cuda_sizes.h"
#include "config/config_file.h"
#include "config/run_spec.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "family_steps.h"
#include "model/moe.h"
#include "train/planner.h"
#include "train/trainer.h"
#include "unit/test_model_util.h"

using namespace qlft;
using qlft_cuda_test::norm_err;
using namespace qlft_cuda_test;

namespace {

using FVec = std::vector<float>;
using IVec = std::vector<int32_t>;

FVec normal(std::mt19937_64& g, size_t n) {
  std::normal_distribution<float> d(0.f, 1.f);
  FVec v(n);
  for (float& x : v) x = d(g);
  return v;
}

// The row ops' outputs on be for one set of inputs.
struct RowOps {
  FVec gather, gather_scaled, combine, combine_acc, dots, dots_rows;
};

// x [R, D] with a row stride of D + 3 (the ops read strided rows); K choices per row of
// `packed` = R K rows. idx / pos / w host arrays, or copies in be's memory when resident.
RowOps run_ops(Backend& be, const FVec& x, int64_t R, int64_t D, const FVec& packed, int K,
               const IVec& idx, const IVec& pos, const FVec& w, const FVec& acc0, bool resident) {
  const int64_t N = R * K, ld = D + 3;
  Buffer bi, bp, bw;
  const int32_t* pi = idx.data();
  const int32_t* pp = pos.data();
  const float* pw = w.data();
  if (resident) {
    bi = be.alloc(MemCategory::Workspace, idx.size() * 4, "test idx");
    bp = be.alloc(MemCategory::Workspace, pos.size() * 4, "test pos");
    bw = be.alloc(MemCategory::Workspace, w.size() * 4, "test w");
    bi.copy_from_host(idx.data(), idx.size() * 4);
    bp.copy_from_host(pos.data(), pos.size() * 4);
    bw.copy_from_host(w.data(), w.size() * 4);
    pi = bi.as<int32_t>(), pp = bp.as<int32_t>(), pw = bw.as<float>();
  }
  RowOps o{FVec(size_t(N * D)), FVec(size_t(N * D)), FVec(size_t(R * D)), acc0,
           FVec(size_t(N)),     FVec(size_t(R))};
  const CMatF xs(x.data(), R, D, ld);
  be.gather_rows(xs, pi, nullptr, MatF(o.gather.data(), N, D));
  be.gather_rows(xs, pi, pw, MatF(o.gather_scaled.data(), N, D));
  const CMatF src(packed.data(), N, D);
  be.combine_rows(src, pp, pw, K, MatF(o.combine.data(), R, D), false);
  be.combine_rows(src, pp, nullptr, K, MatF(o.combine_acc.data(), R, D), true);
  be.row_dots(xs, pi, src, o.dots.data());
  be.row_dots(xs, nullptr, CMatF(packed.data(), R, D), o.dots_rows.data());
  return o;
}

std::vector<const FVec*> fields(const RowOps& o) {
  return {&o.gather, &o.gather_scaled, &o.combine, &o.combine_acc, &o.dots, &o.dots_rows};
}

}  // namespace

// gather_rows (with and without per-row scales), combine_rows (weighted, overwriting; unweighted,
// accumulating) and row_dots (through an index list and row by row) on the device against a
// scalar oracle written here and against the CPU backend's host loops; index arrays on the host
// (staged, checked) and in the device's memory (used in place); an index out of range refused
// naming the op.
TEST(CudaMoe, RowOpsFollowOracleAndCpu) {
  QLFT_NEED_GPU();
  MemoryTracker tr;
  auto cpu = make_cpu_backend(&tr);
  auto gpu = gpu_backend(&tr, Precision::FP32);
  std::mt19937_64 g(48);
  const int64_t R = 37, D = 45, ld = D + 3;
  const int K = 3, E = 5;
  const int64_t N = R * K;
  const FVec x = normal(g, size_t(R * ld)), packed = normal(g, size_t(N * D)),
             w = normal(g, size_t(N)), acc0 = normal(g, size_t(R * D));
  // Each row to K distinct experts of E; packed expert by expert as model/moe.cpp does.
  IVec choice(static_cast<size_t>(N)), idx(static_cast<size_t>(N)), pos(static_cast<size_t>(N));
  for (int64_t r = 0; r < R; ++r)
    for (int k = 0; k < K; ++k) choice[size_t(r * K + k)] = int32_t((r * 7 + k * 2) % E);
  int64_t p = 0;
  for (int e = 0; e < E; ++e)
    for (int64_t i = 0; i < N; ++i)
      if (choice[size_t(i)] == e) {
        pos[size_t(i)] = int32_t(p);
        idx[size_t(p++)] = int32_t(i / K);
      }
  ASSERT_EQ(p, N);
  RowOps want{FVec(size_t(N * D)), FVec(size_t(N * D)), FVec(size_t(R * D)), acc0,
              FVec(size_t(N)),     FVec(size_t(R))};
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < D; ++c) {
      const float v = x[size_t(idx[size_t(i)] * ld + c)];
      want.gather[size_t(i * D + c)] = v;
      want.gather_scaled[size_t(i * D + c)] = w[size_t(i)] * v;
    }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < D; ++c) {
      double a = 0, b = acc0[size_t(r * D + c)];
      for (int k = 0; k < K; ++k) {
        const int64_t q = pos[size_t(r * K + k)];
        a += double(w[size_t(r * K + k)]) * packed[size_t(q * D + c)];
        b += packed[size_t(q * D + c)];
      }
      want.combine[size_t(r * D + c)] = float(a);
      want.combine_acc[size_t(r * D + c)] = float(b);
    }
  for (int64_t i = 0; i < N; ++i) {
    double d = 0;
    for (int64_t c = 0; c < D; ++c)
      d += double(x[size_t(idx[size_t(i)] * ld + c)]) * packed[size_t(i * D + c)];
    want.dots[size_t(i)] = float(d);
  }
  for (int64_t r = 0; r < R; ++r) {
    double d = 0;
    for (int64_t c = 0; c < D; ++c) d += double(x[size_t(r * ld + c)]) * packed[size_t(r * D + c)];
    want.dots_rows[size_t(r)] = float(d);
  }
  const RowOps c = run_ops(*cpu, x, R, D, packed, K, idx, pos, w, acc0, false);
  const RowOps d = run_ops(*gpu, x, R, D, packed, K, idx, pos, w, acc0, false);
  const RowOps dr = run_ops(*gpu, x, R, D, packed, K, idx, pos, w, acc0, true);
  const auto fw = fields(want), fc = fields(c), fd = fields(d), fr = fields(dr);
  for (size_t i = 0; i < fw.size(); ++i) {
    EXPECT_LT(norm_err(*fc[i], *fw[i]), 1e-7) << "cpu output " << i;
    EXPECT_LT(norm_err(*fd[i], *fw[i]), 1e-7) << "cuda output " << i;
    EXPECT_EQ(*fr[i], *fd[i]) << "cuda output " << i << " with resident indices";
  }
  EXPECT_EQ(d.combine, c.combine) << "the same double sums, rounded once";
  EXPECT_GT(norm_err(d.combine_acc, want.combine), 0.1) << "accumulate is visible";
  IVec bad = idx;
  bad[5] = int32_t(R);
  for (Backend* be : {cpu.get(), gpu.get()}) {
    FVec out(size_t(N * D));
    try {
      be->gather_rows(CMatF(x.data(), R, D, ld), bad.data(), nullptr, MatF(out.data(), N, D));
      ADD_FAILURE() << be->name() << ": an index out of range was gathered";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("gather_rows: rows[5] = 37"), std::string::npos)
          << e.what();
    }
  }
}

namespace {

// A buffer of be's memory holding v (Gradients: v zero, accumulated into).
Buffer resident(Backend& be, const FVec& v, MemCategory c) {
  Buffer b = be.alloc(c, v.size() * 4, "test MoE LoRA", BufferInit::Uninit);
  b.copy_from_host(v.data(), v.size() * 4);
  return b;
}
FVec host(const Buffer& b) {
  FVec v(b.size() / 4);
  b.copy_to_host(v.data(), b.size());
  return v;
}

// One MoE block (4 experts, top-2) with LoRA on the experts' gate_up and down and on the router
// (model/moe_lora.h): output, input gradient and the six factors' gradients on be, the factors
// and gradients in be's memory.
struct LoraBlockRun {
  FVec out, dx;
  std::vector<FVec> grads;
};
LoraBlockRun lora_block(Backend& be, MemoryTracker* tr) {
  std::mt19937_64 g(4848);
  const int64_t R = 11, D = 24, F = 40;
  const int E = 4, r = 2;
  auto scaled = [&](size_t n, float s) {
    FVec v = normal(g, n);
    for (float& x : v) x *= s;
    return v;
  };
  MoeWeights w;
  const FVec router = scaled(size_t(E * D), 0.4f);
  w.router = qweight_from_f32(tr, router.data(), E, D, QuantKind::F32);
  for (int e = 0; e < E; ++e) {
    const FVec a = scaled(size_t(F * D), 0.2f), b = scaled(size_t(F * D), 0.2f),
               c = scaled(size_t(D * F), 0.2f);
    w.w1.push_back(qweight_from_f32(tr, a.data(), F, D, QuantKind::F32));
    w.w3.push_back(qweight_from_f32(tr, b.data(), F, D, QuantKind::F32));
    w.w2.push_back(qweight_from_f32(tr, c.data(), D, F, QuantKind::F32));
  }
  const FVec x = normal(g, size_t(R * D)), dout = normal(g, size_t(R * D));
  // (in, out, experts) of gate_up, down, router
  const int64_t shape[3][3] = {{D, 2 * F, E}, {F, D, E}, {D, E, 1}};
  MoeLoraPart MoeLora::*parts[3] = {&MoeLora::gate_up, &MoeLora::down, &MoeLora::router};
  std::vector<Buffer> bufs;
  MoeLora lora;
  for (int i = 0; i < 3; ++i) {
    const int64_t in = shape[i][0], out = shape[i][1], n = shape[i][2];
    const size_t na = size_t(n * r * in), nb = size_t(n * out * r);
    bufs.push_back(resident(be, scaled(na, 0.2f), MemCategory::Adapter));
    bufs.push_back(resident(be, scaled(nb, 0.3f), MemCategory::Adapter));
    bufs.push_back(resident(be, FVec(na, 0.f), MemCategory::Gradients));
    bufs.push_back(resident(be, FVec(nb, 0.f), MemCategory::Gradients));
    const size_t k = bufs.size() - 4;
    lora.*parts[i] = MoeLoraPart{bufs[k].as<float>(),
                                 bufs[k + 1].as<float>(),
                                 bufs[k + 2].as<float>(),
                                 bufs[k + 3].as<float>(),
                                 r,
                                 1.5f};
  }
  const Buffer xb = resident(be, x, MemCategory::Activations),
               db = resident(be, dout, MemCategory::Activations);
  Buffer ob = resident(be, FVec(size_t(R * D)), MemCategory::Activations),
         dxb = resident(be, FVec(size_t(R * D), 0.f), MemCategory::Activations);
  MoeSaved s;
  moe_fwd(be, w, CMatF(xb.as<float>(), R, D), MatF(ob.as<float>(), R, D), s, &lora);
  moe_bwd(be, w, s, CMatF(xb.as<float>(), R, D), CMatF(db.as<float>(), R, D),
          MatF(dxb.as<float>(), R, D), &lora);
  LoraBlockRun run{host(ob), host(dxb), {}};
  for (int i = 0; i < 3; ++i) {
    run.grads.push_back(host(bufs[size_t(4 * i + 2)]));
    run.grads.push_back(host(bufs[size_t(4 * i + 3)]));
  }
  return run;
}

}  // namespace

// PEFT's LoRA on the experts and the router of an MoE block (the CPU backend holds it to PEFT:
// Moe.ExpertAndRouterLoraMatchPeft): with backend=cuda the output, the input gradient and the
// gradients of the six factors follow backend=cpu's (fp32, 1e-5).
TEST(CudaMoe, ExpertLoraFollowsCpu) {
  QLFT_NEED_GPU();
  MemoryTracker tr;
  const LoraBlockRun c = lora_block(*make_cpu_backend(&tr), &tr),
                     d = lora_block(*gpu_backend(&tr, Precision::FP32), &tr);
  EXPECT_LT(norm_err(d.out, c.out), 1e-5);
  EXPECT_LT(norm_err(d.dx, c.dx), 1e-5);
  ASSERT_EQ(d.grads.size(), 6u);
  double worst = 0;
  for (size_t i = 0; i < 6; ++i) worst = std::max(worst, norm_err(d.grads[i], c.grads[i]));
  std::printf(
      "MoE block with expert / router LoRA: cuda vs cpu out %.3g, dx %.3g, factors' "
      "gradients (worst) %.3g\n",
      norm_err(d.out, c.out), norm_err(d.dx, c.dx), worst);
  for (size_t i = 0; i < 6; ++i) {
    double m = 0;
    for (float v : c.grads[i]) m = std::max(m, double(std::fabs(v)));
    EXPECT_GT(m, 1e-3) << "gradient " << i << " is not trivial";
    EXPECT_LT(norm_err(d.grads[i], c.grads[i]), 1e-5) << "gradient " << i;
  }
}

namespace {

// fp32: one runner step's loss and LoRA gradients (every layer stored, and every layer
// checkpointed: the recomputation routes again) with backend=cuda within 1e-5 / 1e-4 of
// backend=cpu's; four trainer steps: loss 1e-5, the LoRA weights' updates 1e-4. bf16 (autocast,
// 16-bit activation storage): one runner step against the CPU's bf16 step, the loss within 2e-3
// and the LoRA gradients within 3e-2 (the Gemma test's bounds: two bf16 roundings of different
// fp32 sums), and as close to the fp32 step's as the CPU's are (within 1.5x).
void check_family(const std::string& family) {
  MemoryTracker tr;
  auto cpu32 = make_cpu_backend(&tr);
  auto gpu32 = gpu_backend(&tr, Precision::FP32);
  const RunnerStep c = runner_step(family, *cpu32, &tr, DType::F32);
  for (bool ckpt : {false, true}) {
    const RunnerStep d = runner_step(family, *gpu32, &tr, DType::F32, ckpt);
    const double e = norm_err(d.grads, c.grads);
    std::printf("%s fp32 step%s: loss cpu %.7f cuda %.7f, LoRA gradients %.3g\n", family.c_str(),
                ckpt ? " (checkpointed)" : "", c.loss, d.loss, e);
    EXPECT_NEAR(d.loss, c.loss, 1e-5 * std::fabs(c.loss));
    ASSERT_EQ(d.grads.size(), c.grads.size());
    EXPECT_LT(e, 1e-4);
  }
  const auto [tc, td] =
      train_both(family, "fp32", "q_proj,k_proj,v_proj,o_proj", 4);  // (no dense MLP on MoE layers)
  const double e = norm_err(td.w, tc.w);
  std::printf("%s fp32, 4 trainer steps: loss cpu %.7f cuda %.7f, LoRA updates %.3g\n",
              family.c_str(), tc.loss, td.loss, e);
  EXPECT_NEAR(td.loss, tc.loss, 1e-5 * std::fabs(tc.loss));
  ASSERT_EQ(td.w.size(), tc.w.size());
  EXPECT_LT(e, 1e-4);

  auto cpu16 = make_autocast_backend(make_cpu_backend(&tr), DType::BF16);
  auto gpu16 = gpu_backend(&tr, Precision::BF16);
  const RunnerStep c16 = runner_step(family, *cpu16, &tr, DType::BF16),
                   d16 = runner_step(family, *gpu16, &tr, DType::BF16);
  const double g = norm_err(d16.grads, c16.grads), ec = norm_err(c16.grads, c.grads),
               ed = norm_err(d16.grads, c.grads);
  std::printf(
      "%s bf16 step: loss cpu %.7f cuda %.7f (fp32 %.7f), LoRA gradients %.3g; "
      "vs fp32: cpu %.3g cuda %.3g\n",
      family.c_str(), c16.loss, d16.loss, c.loss, g, ec, ed);
  EXPECT_NEAR(d16.loss, c16.loss, 2e-3 * std::fabs(c16.loss));
  EXPECT_LT(g, 3e-2);
  EXPECT_LT(ed, 1.5 * ec);
}

}  // namespace

// Mixtral (2 layers, 4 experts, top-2, renormalised): training with backend=cuda follows
// backend=cpu (check_family).
TEST(CudaMoe, MixtralTrainingFollowsCpu) {
  QLFT_NEED_GPU();
  check_family("mixtral");
}

// Mixtral with the load-balancing loss (moe.aux_loss=on, weight 4: test_moe_aux holds the CPU's
// to transformers): four trainer steps with backend=cuda follow backend=cpu (loss 1e-5, LoRA
// updates 1e-4), and the loss is the one with the term (above the steps' without it).
TEST(CudaMoe, MixtralAuxLossTrainingFollowsCpu) {
  QLFT_NEED_GPU();
  const char* targets = "q_proj,k_proj,v_proj,o_proj";
  const auto [tc, td] = train_both("mixtral", "fp32", targets, 4,
                                   {{"moe.aux_loss", "on"}, {"moe.aux_loss_coef", "4"}});
  const auto [oc, od] = train_both("mixtral", "fp32", targets, 4, {{"moe.aux_loss", "off"}});
  const double e = norm_err(td.w, tc.w);
  std::printf(
      "mixtral fp32 + aux loss, 4 trainer steps: loss cpu %.7f cuda %.7f (without: %.7f), "
      "LoRA updates %.3g\n",
      tc.loss, td.loss, oc.loss, e);
  EXPECT_NEAR(td.loss, tc.loss, 1e-5 * std::fabs(tc.loss));
  ASSERT_EQ(td.w.size(), tc.w.size());
  EXPECT_LT(e, 1e-4);
  EXPECT_GT(tc.loss, oc.loss + 1.0);  // 4 x the loss, about 2 (top-2 of 4 experts)
  EXPECT_GT(norm_err(od.w, td.w), 1e-2);
}

// Qwen3-MoE (q / k norms, experts on layers 0 and 2 without renormalisation, layer 1 dense): the
// same.
TEST(CudaMoe, Qwen3MoeTrainingFollowsCpu) {
  QLFT_NEED_GPU();
  check_family("qwen3_moe");
}

// The planner's device activations for a Mixtral training step (the runner's tensors and each MoE
// layer's MoeSaved, in device memory) against the tracker's device activation peak over that
// step, and the MoE part of them (RunnerFootprint::moe_saved) held on the device.
TEST(CudaMoe, PlannerCountsSavedStateOnDevice) {
  QLFT_NEED_GPU();
  MemoryTracker tr;
  tr.set_limit_space(MemSpace::Device);  // as qlft_runtime_create does for backend=cuda
  auto m = load_model(&tr, family_path("mixtral"), model_test::keep());
  const data::Batch b =
      fixture_batch(model_test::Fixture(family_path("mixtral") + ".lora.safetensors"));
  Config c;
  c.set("backend", "cuda");
  c.set("train.precision", "fp32");
  c.set("lora.r", "4");
  c.set("lora.target_modules", "q_proj,k_proj,v_proj,o_proj");
  c.set("data.seq_len", std::to_string(b.seq_len));
  c.set("train.micro_batch", std::to_string(b.micro_batch));
  const RunSpec spec = parse_run_spec(c);
  const MemoryPlan p = plan_memory(m->cfg, weight_footprint(*m), PlanSettings::from_spec(spec));
  ASSERT_TRUE(p.device);
  cuda_empty_cache(&tr);
  const int A = int(MemCategory::Activations);
  Trainer t(*m, &tr, nullptr, spec);
  tr.reset_peaks();
  StepReport rep;
  t.step_on({b}, &rep);
  const MemorySnapshot s = tr.snapshot();
  const int64_t R = int64_t(b.rows) * b.seq_len;
  uint64_t moe = 0;
  for (const LayerShapes& ls : m->shapes.layers)
    if (ls.moe())
      moe += moe_saved_bytes(R, ls.norm, ls.expert_ffn, ls.n_experts, ls.top_k, cuda_alloc_round);
  std::printf("mixtral step: device activations planned %llu, tracker peak %llu (MoE saved %llu)\n",
              (unsigned long long)p.device_train[A], (unsigned long long)s.device_peak[A],
              (unsigned long long)moe);
  EXPECT_GT(moe, 0u);
  EXPECT_GE(s.device_peak[A], moe) << "the MoE saved state is device memory";
  EXPECT_EQ(p.device_train[A], s.device_peak[A]);
}
