// The memory planner against the tracker: for a matrix of training configurations on
// stories260K (precision, checkpointing, sequence length, micro-batch, optimizer, LoRA rank,
// targets, dropout), a real training step is run and the tracker's measured per-category peaks
// and total peak are compared with the prediction made before anything was allocated.
//
// Exact by construction: weights, adapter, gradients, optimizer, activations (they count the
// same buffers). Workspace is a model of the CPU kernels' scratch; the test holds it to exact
// too for fp32, fp16 and bf16 on sgemm on batches where every target is trained (the planner's
// worst case); for bf16 on oneDNN (AVX512-BF16/AMX CPUs: its scratchpads) the total is held to
// 15% and at least 8 configurations of the matrix to 10% (issue 10, done-when 5); on real data
// batches the total must be within 10%.
// The matrix runs for base weights kept as f32 and quantized to NF4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>

#include "support/settings.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gemm_bf16.h"
#include "backend/backend_select.h"
#include "config/config.h"
#include "core/error.h"
#include "core/threads.h"
#include "data/dataset.h"
#include "data/tokenizer_encoder.h"
#include "parallel/data_parallel.h"
#include "parallel/zero2_grads.h"
#include "parallel/zero3_lora.h"
#include "parallel/zero3_stream.h"
#include "model/file_unit_stream.h"
#include "model/lora.h"
#include "optim/optimizer.h"
#include "model/model.h"
#include "support/rss_check.h"
#include "support/test_support.h"
#include "tokenizer/tokenizer.h"
#include "train/planner.h"
#include "train/trainer.h"

using namespace qlft;

namespace {

struct Case {
  const char* precision;
  int ckpt;
  int seq;
  int micro;
  const char* optim;
  int r;
  const char* targets;
  float dropout;
};

const Case kCases[] = {
    {"fp32", 0, 64, 1, "adamw", 8, "", 0.f},
    {"fp32", 1, 128, 2, "adamw", 8, "", 0.f},
    {"bf16", 0, 256, 2, "adamw8bit", 8, "", 0.f},
    {"fp16", 2, 128, 4, "paged_adamw8bit", 4, "", 0.f},
    {"bf16", 1, 512, 1, "adamw", 16, "", 0.f},
    {"fp32", 0, 256, 4, "adamw8bit", 8, "q_proj,v_proj", 0.1f},
    {"fp32", 3, 32, 8, "adamw", 16, "", 0.f},
    {"bf16", 0, 64, 3, "adamw", 2, "q_proj,k_proj,v_proj,o_proj", 0.05f},
    {"fp16", 1, 192, 3, "adamw8bit", 32, "gate_proj,up_proj,down_proj", 0.f},
};

Config config_of(const Case& k) {
  Config c;
  c.set("train.precision", k.precision);
  c.set("train.grad_checkpointing", std::to_string(k.ckpt));
  c.set("data.seq_len", std::to_string(k.seq));
  c.set("train.micro_batch", std::to_string(k.micro));
  c.set("optim.name", k.optim);
  c.set("lora.r", std::to_string(k.r));
  c.set("lora.dropout", std::to_string(k.dropout));
  if (*k.targets) c.set("lora.target_modules", k.targets);
  c.set("train.accumulation", "2");  // the test runs two micro-batches per step
  c.set("seed", "3");
  return c;
}

// A micro-batch of one document per row with every target trained.
data::Batch full_batch(int micro, int seq, int vocab, int salt) {
  data::Batch b;
  b.micro_batch = micro;
  b.seq_len = seq;
  b.rows = micro;
  const size_t n = size_t(micro) * seq;
  b.tokens.resize(n);
  b.targets.resize(n);
  b.positions.resize(n);
  b.doc_ids.resize(n);
  for (size_t i = 0; i < n; ++i) {
    b.tokens[i] = int32_t((i * 7 + salt) % vocab);
    b.targets[i] = int32_t((i * 13 + 5 + salt) % vocab);
    b.positions[i] = int32_t(i % seq);
    b.doc_ids[i] = 0;
  }
  b.trained_tokens = int64_t(n);
  return b;
}

// The tracker's peaks over one step of two micro-batches of case k (the second forward runs
// beside the kept backward temporaries; a further step allocates nothing new).
MemorySnapshot step_peaks(Model& model, MemoryTracker& tracker, const Config& c, const Case& k) {
  tracker.reset_peaks();
  {
    Trainer t(model, &tracker, nullptr, qlft::parse_run_spec(c));
    StepReport r;
    t.step_on({full_batch(k.micro, k.seq, model.cfg.vocab, 0),
               full_batch(k.micro, k.seq, model.cfg.vocab, 1)},
              &r);
    EXPECT_TRUE(std::isfinite(r.loss));
  }
  return tracker.snapshot();
}

std::string describe(const Case& k) {
  return std::string(k.precision) + " ckpt=" + std::to_string(k.ckpt) +
         " seq=" + std::to_string(k.seq) + " micro=" + std::to_string(k.micro) + " " + k.optim +
         " r=" + std::to_string(k.r) + " targets=" + (*k.targets ? k.targets : "all") +
         " dropout=" + std::to_string(k.dropout);
}

}  // namespace

class PlannerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_path_ = qlft_test::shared_file("models/stories260K.gguf");
    if (model_path_.empty())
      QLFT_SKIP("shared-missing") << "stories260K.gguf not found (set QLFT_SHARED_DIR)";
    set_num_threads(2);
  }
  // stories260K loaded with quant.type = quant into tracker.
  std::unique_ptr<Model> load(MemoryTracker& tracker, const char* quant) const {
    LoadOptions lo;
    lo.quant_type = qlft_test::quant_type(quant);
    return load_model(&tracker, model_path_, lo);
  }
  std::string model_path_;
};

class PlannerMatrix : public PlannerTest, public ::testing::WithParamInterface<const char*> {};
INSTANTIATE_TEST_SUITE_P(Quant, PlannerMatrix, ::testing::Values("keep", "nf4"));

TEST_P(PlannerMatrix, MatchesTrackerOnFullBatches) {
  MemoryTracker tracker;
  auto model = load(tracker, GetParam());
  const WeightFootprint w = weight_footprint(*model);
  ASSERT_EQ(w.bytes, tracker.snapshot().reserved[QLFT_MEM_WEIGHTS]);
  int n = 0;
  for (const Case& k : kCases) {
    SCOPED_TRACE(describe(k));
    Config c = config_of(k);
    const MemoryPlan plan =
        plan_memory(model->cfg, w, PlanSettings::from_spec(qlft::parse_run_spec(c)));
    const MemorySnapshot m = step_peaks(*model, tracker, c, k);
    std::printf("%-80s predicted/measured:", describe(k).c_str());
    for (int cat = 0; cat < QLFT_MEM_COMMUNICATION; ++cat)
      std::printf(" %s %llu/%llu", mem_category_name(MemCategory(cat)),
                  (unsigned long long)plan.train[cat], (unsigned long long)m.peak[cat]);
    std::printf(" total %llu/%llu\n", (unsigned long long)plan.train_peak,
                (unsigned long long)m.total_peak);
    // bf16 GEMMs on oneDNN (CPUs with AVX512-BF16 or AMX) have a scratchpad (and the backend's
    // kept scratch) the model does not follow byte for byte: there workspace is not exact.
    // Elsewhere bf16 runs on sgemm and is held exact like fp32 (measured on an AVX2 EPYC: every
    // bf16 configuration predicted to the byte).
    const bool bf16_onednn = std::string(k.precision) == "bf16" && cpu::gemm_bf16_native();
    for (int cat = 0; cat < QLFT_MEM_COMMUNICATION; ++cat)
      if (!(bf16_onednn && cat == QLFT_MEM_WORKSPACE))
        EXPECT_EQ(plan.train[cat], m.peak[cat]) << mem_category_name(MemCategory(cat));
    if (!bf16_onednn) EXPECT_EQ(plan.train_peak, m.total_peak);
    const double err = std::fabs(double(plan.train_peak) - double(m.total_peak)) / m.total_peak;
    // Every configuration within 15%; the issue asks 10% of at least 8 of them (oneDNN's bf16
    // workspace is where the model and the kernels' kept scratch may part).
    EXPECT_LE(err, bf16_onednn ? 0.15 : 0.10);
    if (err <= 0.10) ++n;
  }
  EXPECT_GE(n, 8);
}

// The bf16 attention on AMX tiles (QLFT_CPU_TUNE=attn_amx=emulated: the same buffers as on the
// tiles) predicted as exactly as the default path: the workspace model reads the same tuning as
// the trainer's backend.
//
// What the test expects follows the dispatch functions the code runs, never the CPU's flags:
// - the AMX path's sizes: cpu::attn_amx_exec (the backend's choice of path), asked through the
//   planner's own workspace model, whose attention terms must change with the tuning. (Whether
//   they change the step's workspace peak depends on the host: with 2-byte GEMM operands the
//   linear layers' panels are larger than attention's scratch at these shapes.)
// - exact or modelled workspace: cpu::gemm_bf16_native() (oneDNN's bf16 GEMMs keep scratchpads
//   the model follows to within 15%, not byte for byte; sgemm is exact).
// The line "workspace expectation: ..." it prints is read by the ctest
// planner_expectation_follows_dispatch, which runs this test at every ISA cap below the CPU's and
// checks that the expectation changes with `qlft-finetune version`'s bf16gemm= and still passes.
TEST_F(PlannerTest, AttentionOnAmxTilesMatchesTheTracker) {
  MemoryTracker tracker;
  auto model = load(tracker, "keep");
  const WeightFootprint w = weight_footprint(*model);
  struct EnvTune {
    EnvTune() { setenv("QLFT_CPU_TUNE", "attn_amx=emulated", 1); }
    ~EnvTune() { unsetenv("QLFT_CPU_TUNE"); }
  };
  const bool exact = !cpu::gemm_bf16_native();
  std::printf("workspace expectation: %s (bf16 GEMMs on %s)\n", exact ? "exact" : "modelled",
              exact ? "sgemm" : "onednn");
  for (const Case& k :
       {Case{"bf16", 0, 256, 2, "adamw", 8, "", 0.f}, Case{"bf16", 1, 96, 3, "adamw", 16, "", 0.f},
        Case{"bf16", 0, 64, 2, "adamw", 4, "q_proj,v_proj", 0.05f}}) {
    SCOPED_TRACE(describe(k));
    const Config c = config_of(k);
    const PlanSettings ps = PlanSettings::from_spec(qlft::parse_run_spec(c));
    WorkspaceModelSettings wss;
    wss.precision = ps.precision;
    wss.threads = num_threads();
    wss.lora_r = ps.lora.r;
    wss.lora_scale = ps.lora.scale();
    wss.dropout = ps.lora.dropout > 0.f;
    const ModelConfig& mc = model->cfg;
    const auto base_ws = make_workspace_model(BackendKind::Cpu, wss);
    const MemoryPlan base = plan_memory(mc, w, ps);
    const EnvTune env;
    ASSERT_TRUE(cpu::attn_amx_exec(cpu::tuning_from_env(), true).has_value());
    const auto amx_ws = make_workspace_model(BackendKind::Cpu, wss);
    EXPECT_NE(amx_ws->attention_fwd(model->shapes, k.micro, k.seq),
              base_ws->attention_fwd(model->shapes, k.micro, k.seq))
        << "the workspace model did not take the AMX path's sizes";
    EXPECT_NE(amx_ws->attention_bwd(model->shapes, k.micro, k.seq),
              base_ws->attention_bwd(model->shapes, k.micro, k.seq))
        << "the workspace model did not take the AMX path's sizes";
    const MemoryPlan plan = plan_memory(mc, w, PlanSettings::from_spec(qlft::parse_run_spec(c)));
    const MemorySnapshot m = step_peaks(*model, tracker, c, k);
    std::printf("%-80s workspace predicted/measured %llu/%llu (default path predicted %llu)\n",
                describe(k).c_str(), (unsigned long long)plan.train[QLFT_MEM_WORKSPACE],
                (unsigned long long)m.peak[QLFT_MEM_WORKSPACE],
                (unsigned long long)base.train[QLFT_MEM_WORKSPACE]);
    for (int cat = 0; cat < QLFT_MEM_COMMUNICATION; ++cat)
      if (exact || cat != QLFT_MEM_WORKSPACE)
        EXPECT_EQ(plan.train[cat], m.peak[cat]) << mem_category_name(MemCategory(cat));
    if (exact) {
      EXPECT_EQ(plan.train_peak, m.total_peak);
    } else {
      // Within 15%, or within 256 KiB: what the model does not follow is oneDNN's scratchpad, a
      // fixed size at these shapes (137 KiB on a Sapphire Rapids guest in each case), which is
      // more than 15% of the smallest case's workspace since most backward temporaries live in
      // dead tensors (model/llama_internal.h grads_owned).
      const double ws = double(m.peak[QLFT_MEM_WORKSPACE]);
      const double gap = std::fabs(double(plan.train[QLFT_MEM_WORKSPACE]) - ws);
      EXPECT_TRUE(gap / ws <= 0.15 || gap <= 256.0 * 1024) << gap << " of " << ws;
    }
  }
}

TEST_F(PlannerTest, WithinTenPercentOnRealData) {
  QLFT_NEED_SHARED(text, "data/tinyshakespeare.txt");
  MemoryTracker tracker;
  auto model = load(tracker, "keep");
  auto tok = Tokenizer::from_gguf(*model->gguf);
  data::TokenizerEncoder enc(*tok);
  const WeightFootprint w = weight_footprint(*model);
  for (int i : {0, 3, 5}) {
    const Case& k = kCases[i];
    SCOPED_TRACE(describe(k));
    Config c = config_of(k);
    c.set("data.path", text);
    c.set("train.max_steps", "1");
    data::Dataset d = data::Dataset::build(qlft::parse_run_spec(c).data, enc);
    const MemoryPlan plan =
        plan_memory(model->cfg, w, PlanSettings::from_spec(qlft::parse_run_spec(c)));
    tracker.reset_peaks();
    {
      Trainer t(*model, &tracker, &d, qlft::parse_run_spec(c));
      StepReport r;
      while (t.step(&r)) {
      }
    }
    const MemorySnapshot m = tracker.snapshot();
    // Exact categories stay exact; the total within 10% (fewer trained targets make the
    // cross-entropy chunk smaller than predicted; bf16 workspace is modelled).
    EXPECT_EQ(plan.train[QLFT_MEM_ACTIVATIONS], m.peak[QLFT_MEM_ACTIVATIONS]);
    EXPECT_EQ(plan.train[QLFT_MEM_OPTIMIZER], m.peak[QLFT_MEM_OPTIMIZER]);
    EXPECT_LE(std::fabs(double(plan.train_peak) - double(m.total_peak)) / m.total_peak, 0.10);
  }
}

TEST_F(PlannerTest, WeightsFromFileMatchLoading) {
  for (const char* q : {"keep", "nf4", "int8"}) {
    for (bool dq : {true, false}) {
      if (std::string(q) != "nf4" && !dq) continue;
      SCOPED_TRACE(std::string(q) + (dq ? " double_quant" : ""));
      LoadOptions lo;
      lo.quant_type = qlft_test::quant_type(q);
      lo.double_quant = dq;
      ModelConfig cfg;
      const WeightFootprint f = weight_footprint_of_file(model_path_, lo, &cfg);
      MemoryTracker tracker;
      auto model = load_model(&tracker, model_path_, lo);
      const MemorySnapshot m = tracker.snapshot();
      EXPECT_EQ(f.bytes, m.reserved[QLFT_MEM_WEIGHTS]);
      EXPECT_EQ(f.bytes, weight_footprint(*model).bytes);
      EXPECT_EQ(f.load_staging, m.peak[QLFT_MEM_WORKSPACE]);
      EXPECT_EQ(cfg.n_layers, model->cfg.n_layers);
      EXPECT_EQ(cfg.vocab, model->cfg.vocab);
      EXPECT_EQ(cfg.head_dim, model->cfg.head_dim);
      EXPECT_EQ(cfg.tied_embeddings, model->cfg.tied_embeddings);
      // The load peak bounds what the tracker saw while loading, by the partial last tensor.
      PlanSettings s;
      s.seq_len = 8;
      s.micro_batch = 1;
      const MemoryPlan p = plan_memory(cfg, f, s);
      EXPECT_GE(p.load_peak, m.total_peak);
      EXPECT_LE(double(p.load_peak - m.total_peak) / m.total_peak, 0.10);
    }
  }
}

TEST_F(PlannerTest, MaxMicroBatchIsTheLargestThatFits) {
  MemoryTracker tracker;
  auto model = load(tracker, "keep");
  const WeightFootprint w = weight_footprint(*model);
  PlanSettings s = PlanSettings::from_spec(qlft::parse_run_spec(config_of(kCases[1])));
  s.micro_batch = 5;
  const uint64_t budget = plan_memory(model->cfg, w, s).train_peak + 100;
  EXPECT_EQ(plan_max_micro_batch(model->cfg, w, s, budget, 64), 5);
  EXPECT_EQ(plan_max_micro_batch(model->cfg, w, s, budget, 3), 3);
  EXPECT_EQ(plan_max_micro_batch(model->cfg, w, s, 1000, 64), 0);
}

// Planning from config.json alone (no weights downloaded) gives the plan the weight files give:
// the same shapes and stored dtype (the fixtures' F16 safetensors; their config.json names no
// dtype, which plans as 2-byte bf16), the q/k/v biases and the tied head from the config keys.
TEST(PlannerConfigOnly, ConfigJsonAloneMatchesTheWeightFiles) {
  for (const char* model : {"model/syn_llama", "model/syn_qwen2"}) {
    const std::string full = qlft_test::fixture_path(model);
    const std::string alone = qlft_test::temp_dir("planner-config-only");
    {
      std::FILE* in = std::fopen((full + "/config.json").c_str(), "rb");
      std::FILE* out = std::fopen((alone + "/config.json").c_str(), "wb");
      ASSERT_TRUE(in && out);
      char buf[4096];
      for (size_t n; (n = std::fread(buf, 1, sizeof buf, in)) > 0;) std::fwrite(buf, 1, n, out);
      std::fclose(in);
      std::fclose(out);
    }
    for (const char* q : {"keep", "nf4", "int8"}) {
      SCOPED_TRACE(std::string(model) + " " + q);
      LoadOptions lo;
      lo.quant_type = qlft_test::quant_type(q);
      ModelConfig cf, ca;
      const WeightFootprint ff = weight_footprint_of_file(full, lo, &cf);
      const WeightFootprint fa = weight_footprint_of_file(alone, lo, &ca);
      EXPECT_EQ(fa.bytes, ff.bytes);
      EXPECT_EQ(fa.emb_stored_row_bytes, ff.emb_stored_row_bytes);
      EXPECT_EQ(ca.qkv_bias, cf.qkv_bias);
      EXPECT_EQ(ca.tied_embeddings, cf.tied_embeddings);
      PlanSettings s;
      s.seq_len = 16;
      s.micro_batch = 2;
      const MemoryPlan pf = plan_memory(cf, ff, s), pa = plan_memory(ca, fa, s);
      EXPECT_EQ(pa.train_peak, pf.train_peak);
      EXPECT_EQ(pa.load_peak, pf.load_peak);
    }
  }
}

TEST_F(PlannerTest, MaxSeqLenIsTheLongestThatFits) {
  MemoryTracker tracker;
  auto model = load(tracker, "keep");
  const WeightFootprint w = weight_footprint(*model);
  PlanSettings s = PlanSettings::from_spec(qlft::parse_run_spec(config_of(kCases[1])));
  s.micro_batch = 1;
  s.seq_len = 40;
  const uint64_t budget = plan_memory(model->cfg, w, s).budgeted_peak();
  s.micro_batch = 3;  // the search plans micro-batch 1 whatever the settings say
  EXPECT_EQ(plan_max_seq_len(model->cfg, w, s, budget, 4096), 40);
  EXPECT_EQ(plan_max_seq_len(model->cfg, w, s, budget, 25), 25);
  EXPECT_EQ(plan_max_seq_len(model->cfg, w, s, 1000, 4096), 0);
}

// ---- sharding (ZeRO) and offload --------------------------------------------------------------

namespace {

// A rank of a world of `world` in which every rank has the same values: sums multiply by the
// world, gathers repeat this rank's block. Enough to build DataParallel and ZeRO-3 streams
// exactly as a real rank would (their allocations do not depend on the other ranks' data).
class MirrorCommunicator final : public dist::Communicator {
 public:
  MirrorCommunicator(int rank, int world) : rank_(rank), world_(world) {}
  const char* backend() const override { return "mirror"; }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  int local_rank() const override { return rank_; }
  void all_reduce(float* d, size_t n, dist::ReduceOp op) override {
    if (op == dist::ReduceOp::Sum)
      for (size_t i = 0; i < n; ++i) d[i] *= static_cast<float>(world_);
  }
  void all_reduce(double* d, size_t n, dist::ReduceOp op) override {
    if (op == dist::ReduceOp::Sum)
      for (size_t i = 0; i < n; ++i) d[i] *= world_;
  }
  void reduce_scatter(const float* in, float* out, size_t n, dist::ReduceOp) override {
    std::memmove(out, in + size_t(rank_) * n, n * sizeof(float));
  }
  void all_gather(const float* in, float* out, size_t n) override {
    for (int r = 0; r < world_; ++r) std::memmove(out + size_t(r) * n, in, n * sizeof(float));
  }
  void broadcast(void*, size_t, int) override {}
  void barrier() override {}

 private:
  int rank_, world_;
};

// The trainer's LoRA tensors (layer-major, active projections, A then B) from a real adapter.
std::vector<ParamRef> lora_params(LoraAdapter& a) {
  std::vector<ParamRef> params;
  for (int l = 0; l < a.n_layers(); ++l)
    for (int p = 0; p < kProjCount; ++p) {
      LoraSlot& s = a.slot(l, static_cast<Proj>(p));
      if (!s.active()) continue;
      std::string base = "lora." + std::to_string(l) + "." + proj_peft_name(static_cast<Proj>(p));
      params.push_back({base + ".A", s.A.as<float>(), s.dA.as<float>(), s.A.size() / 4});
      params.push_back({base + ".B", s.B.as<float>(), s.dB.as<float>(), s.B.size() / 4});
    }
  return params;
}

ModelConfig small_model() {
  ModelConfig c;
  c.arch = "llama";
  c.n_layers = 5;
  c.dim = 96;
  c.n_heads = 6;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.ffn_dim = 256;
  c.vocab = 300;
  return c;
}

uint64_t r64(uint64_t n) {
  return (n + 63) / 64 * 64;
}

}  // namespace

// ZeRO-1/2 on world sizes 1..7: this rank's optimizer state, its gradients (ZeRO-2: its own
// tensors') and the exchange buffers predicted exactly as dist::DataParallel, the gradient
// shards (dist/zero2_grads.h) and the optimizer allocate them for that rank, and the prediction
// (plan_memory) is the largest rank.
TEST(PlannerZero, OptimizerAndExchangeBufferPerRankMatchTheRuntime) {
  const ModelConfig mc = small_model();
  WeightFootprint w;
  w.bytes = 4096;
  for (const char* optim : {"adamw", "adamw8bit"})
    for (const char* targets : {"", "q_proj,down_proj"})
      for (int stage : {0, 1, 2, 3})
        for (int world : {1, 2, 3, 4, 7}) {
          SCOPED_TRACE(std::string(optim) + " targets=" + targets + " stage " +
                       std::to_string(stage) + " world " + std::to_string(world));
          Config c;
          c.set("optim.name", optim);
          c.set("lora.r", "8");
          if (*targets) c.set("lora.target_modules", targets);
          c.set("dist.zero_stage", std::to_string(stage));
          c.set("data.seq_len", "16");
          c.set("train.micro_batch", "1");
          PlanSettings s = PlanSettings::from_spec(qlft::parse_run_spec(c));
          s.world = world;
          uint64_t most = 0;
          int most_rank = 0;
          for (int r = 0; r < world; ++r) {
            MemoryTracker t;
            // As the trainer makes them (Trainer::init_grads): gradients after the partition,
            // this rank's share only at stage 2 over several ranks (a host backend).
            LoraAdapter a(&t, model_shapes(mc), lora_config_from(qlft::parse_run_spec(c).lora),
                          /*gradients=*/false);
            const uint64_t before = t.snapshot().reserved[QLFT_MEM_OPTIMIZER];
            dist::DataParallel dp(std::make_unique<MirrorCommunicator>(r, world), stage,
                                  lora_params(a), &t, /*host_gradient_shards=*/true);
            auto sink = dist::allocate_lora_gradients(a, dp, dp.shards_gradients(), &t);
            EXPECT_EQ(sink != nullptr, stage >= 2 && world > 1);
            auto opt = make_optimizer(qlft::parse_run_spec(c).optim, dp.owned_params(), &t);
            const MemorySnapshot m = t.snapshot();
            const MemoryPlan p = plan_memory_of_rank(mc, w, s, r);
            EXPECT_EQ(p.train[QLFT_MEM_OPTIMIZER], m.reserved[QLFT_MEM_OPTIMIZER] - before)
                << "rank " << r;
            EXPECT_EQ(p.train[QLFT_MEM_COMMUNICATION], m.reserved[QLFT_MEM_COMMUNICATION])
                << "rank " << r;
            EXPECT_EQ(p.train[QLFT_MEM_GRADIENTS], m.reserved[QLFT_MEM_GRADIENTS]);
            if (p.train_peak > most) {
              most = p.train_peak;
              most_rank = r;
            }
          }
          const MemoryPlan all = plan_memory(mc, w, s);
          EXPECT_EQ(all.train_peak, most);
          EXPECT_EQ(all.peak_rank, most_rank);
        }
}

// The ownership formula against an independent computation: each rank's elements are a
// contiguous run, balanced (no rank's share differs from total / world by more than the largest
// tensor), and for adamw a rank's optimizer bytes are 2 x its tensors' f32 bytes.
TEST(PlannerZero, OwnershipIsContiguousBalancedRuns) {
  const ModelConfig mc = small_model();
  const uint64_t r = 8;
  std::vector<uint64_t> numel;  // from the shapes, written out here
  const uint64_t q = 6 * 16, kv = 2 * 16;
  const uint64_t in_out[7][2] = {{96, q},   {96, kv},  {96, kv}, {q, 96},
                                 {96, 256}, {96, 256}, {256, 96}};
  for (int l = 0; l < mc.n_layers; ++l)
    for (const auto& io : in_out) {
      numel.push_back(r * io[0]);
      numel.push_back(io[1] * r);
    }
  uint64_t total = 0, largest = 0;
  for (uint64_t n : numel) total += n, largest = std::max(largest, n);
  WeightFootprint w;
  for (int world : {1, 2, 3, 5, 8}) {
    SCOPED_TRACE("world " + std::to_string(world));
    const std::vector<int> owner = plan_lora_owners(numel, world);
    ASSERT_EQ(owner.size(), numel.size());
    std::vector<uint64_t> share(size_t(world), 0), adam(size_t(world), 0);
    for (size_t i = 0; i < numel.size(); ++i) {
      if (i) EXPECT_GE(owner[i], owner[i - 1]);  // contiguous runs in order
      share[size_t(owner[i])] += numel[i];
      adam[size_t(owner[i])] += 2 * r64(numel[i] * 4);
    }
    for (int k = 0; k < world; ++k)
      EXPECT_LE(std::llabs(int64_t(share[size_t(k)]) - int64_t(total / world)), int64_t(largest));
    Config c;
    c.set("lora.r", "8");
    c.set("dist.zero_stage", "1");
    c.set("data.seq_len", "16");
    c.set("train.micro_batch", "1");
    PlanSettings s = PlanSettings::from_spec(qlft::parse_run_spec(c));
    s.world = world;
    for (int k = 0; k < world; ++k)
      EXPECT_EQ(plan_memory_of_rank(mc, w, s, k).train[QLFT_MEM_OPTIMIZER], adam[size_t(k)]);
    // The exchange buffer: (world + 1) x the largest rank's share, f32.
    const uint64_t seg = *std::max_element(share.begin(), share.end());
    EXPECT_EQ(plan_memory(mc, w, s).train[QLFT_MEM_COMMUNICATION],
              world > 1 ? r64((world + 1) * seg * 4) : 0);
  }
  // Stage 0 keeps every tensor's state on every rank; too many ranks for the tensors is refused
  // as DataParallel refuses it.
  Config c;
  c.set("lora.r", "8");
  c.set("lora.target_modules", "q_proj");
  c.set("dist.zero_stage", "2");
  c.set("data.seq_len", "16");
  c.set("train.micro_batch", "1");
  PlanSettings s = PlanSettings::from_spec(qlft::parse_run_spec(c));
  s.world = 64;
  EXPECT_THROW(plan_memory(mc, w, s), Error);
}

// 1-rank ZeRO-1/2 through the trainer (the single communicator): exact against the tracker.
TEST_F(PlannerTest, ZeroStagesOnOneRankMatchTheTracker) {
  MemoryTracker tracker;
  auto model = load(tracker, "nf4");
  const WeightFootprint w = weight_footprint(*model);
  for (int stage : {1, 2}) {
    Config c = config_of(kCases[0]);
    c.set("dist.zero_stage", std::to_string(stage));
    const MemoryPlan plan =
        plan_memory(model->cfg, w, PlanSettings::from_spec(qlft::parse_run_spec(c)));
    EXPECT_EQ(plan.world, 1);
    tracker.reset_peaks();
    {
      Trainer t(*model, &tracker, nullptr, qlft::parse_run_spec(c));
      StepReport r;
      t.step_on({full_batch(1, 64, model->cfg.vocab, 0), full_batch(1, 64, model->cfg.vocab, 1)},
                &r);
    }
    const MemorySnapshot m = tracker.snapshot();
    for (int cat = 0; cat < kMemCategoryCount; ++cat)
      EXPECT_EQ(plan.train[cat], m.peak[cat]) << mem_category_name(MemCategory(cat));
    EXPECT_EQ(plan.train_peak, m.total_peak);
  }
}

// offload.params=nvme and offload.optimizer=nvme on one rank: the resident weight units and the
// optimizer's state slots against the tracker during a real step (the trainer writes the file
// from the loaded model's bytes and reads it back into its own model, so the peaks restart once
// the trainer exists; the loaded model keeps its weights beside it, `shared`).
TEST_F(PlannerTest, NvmeOffloadMatchesTheTracker) {
  for (const char* buffers : {"1", "3"})
    for (const char* optim : {"adamw", "adamw8bit"}) {
      SCOPED_TRACE(std::string("offload.buffers ") + buffers + " " + optim);
      MemoryTracker tracker;
      auto model = load(tracker, "nf4");
      const WeightFootprint w = weight_footprint(*model);
      Config c = config_of(kCases[0]);
      c.set("optim.name", optim);
      c.set("offload.params", "nvme");
      c.set("offload.optimizer", "nvme");
      c.set("offload.buffers", buffers);
      c.set("offload.dir", qlft_test::temp_dir("planner-nvme"));
      const MemoryPlan plan =
          plan_memory(model->cfg, w, PlanSettings::from_spec(qlft::parse_run_spec(c)));
      const uint64_t shared = tracker.snapshot().reserved[QLFT_MEM_WEIGHTS];
      EXPECT_EQ(shared, w.bytes);
      // The file is written from the loaded model's bytes: no copy of them, not even for a
      // moment (the trainer's own model is a skeleton, train/weight_placement.h).
      tracker.reset_peaks();
      Trainer t(*model, &tracker, nullptr, qlft::parse_run_spec(c));
      EXPECT_EQ(tracker.snapshot().peak[QLFT_MEM_WEIGHTS], shared);
      tracker.reset_peaks();
      StepReport r;
      t.step_on({full_batch(1, 64, model->cfg.vocab, 0), full_batch(1, 64, model->cfg.vocab, 1)},
                &r);
      const MemorySnapshot m = tracker.snapshot();
      EXPECT_LT(plan.train[QLFT_MEM_WEIGHTS], w.bytes);
      for (int cat = 0; cat < kMemCategoryCount; ++cat)
        EXPECT_EQ(plan.train[cat] + (cat == QLFT_MEM_WEIGHTS ? shared : 0), m.peak[cat])
            << mem_category_name(MemCategory(cat));
    }
}

namespace {

class DonePending final : public dist::PendingCollective {
 public:
  void wait() override {}
};

// MirrorCommunicator with the byte gather ZeRO-3 uses.
class MirrorGather final : public dist::Communicator {
 public:
  MirrorGather(int rank, int world) : m_(rank, world) {}
  const char* backend() const override { return "mirror"; }
  int rank() const override { return m_.rank(); }
  int world() const override { return m_.world(); }
  int local_rank() const override { return m_.rank(); }
  void all_reduce(float* d, size_t n, dist::ReduceOp op) override { m_.all_reduce(d, n, op); }
  void all_reduce(double* d, size_t n, dist::ReduceOp op) override { m_.all_reduce(d, n, op); }
  void reduce_scatter(const float* in, float* out, size_t n, dist::ReduceOp op) override {
    m_.reduce_scatter(in, out, n, op);
  }
  void all_gather(const float* in, float* out, size_t n) override { m_.all_gather(in, out, n); }
  void broadcast(void*, size_t, int) override {}
  void barrier() override {}
  std::unique_ptr<dist::PendingCollective> start_all_gather_raw(const void* in, void* out,
                                                                size_t bytes) override {
    for (int r = 0; r < world(); ++r) std::memmove(static_cast<char*>(out) + r * bytes, in, bytes);
    return std::make_unique<DonePending>();
  }

 private:
  MirrorCommunicator m_;
};

}  // namespace

// ZeRO-3 shards and gathered units against dist::Zero3Stream on ranks of worlds 1..5: this
// rank's kept weights, and the most gathered bytes alive over the runner's unit order.
// The f32 embedding and head by rows: one chunk (the default) and chunks of 16 KiB.
TEST_F(PlannerTest, Zero3ShardsAndGatheredUnitsMatchTheStream) {
  for (const char* chunk_kib : {"8192", "16"})
    for (const char* q : {"keep", "nf4"})
      for (int world : {1, 2, 3, 5})
        for (const char* prefetch : {"true", "false"}) {
          SCOPED_TRACE(std::string(q) + " world " + std::to_string(world) + " chunk " + chunk_kib +
                       " prefetch " + prefetch);
          MemoryTracker tracker;
          auto model = load(tracker, q);
          const WeightFootprint w = weight_footprint(*model);
          Config c = config_of(kCases[0]);
          c.set("dist.zero_stage", "3");
          c.set("dist.row_chunk_kib", chunk_kib);
          c.set("dist.zero3_prefetch", prefetch);
          PlanSettings s = PlanSettings::from_spec(qlft::parse_run_spec(c));
          s.world = world;
          PlanSettings s1 = s;
          s1.zero_stage = 2;  // the exchange buffer and ZeRO-2's gradient reduce bucket, no units
          const MemoryPlan p = plan_memory_of_rank(model->cfg, w, s, world - 1);
          const uint64_t exchange =
              plan_memory_of_rank(model->cfg, w, s1, world - 1).train[QLFT_MEM_COMMUNICATION];
          MirrorGather comm(world - 1, world);
          dist::Zero3Stream zs(*model, &comm, &tracker, nullptr, nullptr, s.row_chunk_bytes);
          zs.set_prefetch(s.zero3_prefetch);
          ASSERT_TRUE(zs.rows_sharded());
          EXPECT_EQ(p.train[QLFT_MEM_WEIGHTS], tracker.snapshot().reserved[QLFT_MEM_WEIGHTS]);
          EXPECT_LT(
              p.train[QLFT_MEM_WEIGHTS],
              w.bytes / world + 64 * w.groups.size() +
                  uint64_t(dist::RowChunks::of(w.f32_rows, w.row_bytes, world, s.row_chunk_bytes)
                               .chunks +
                           1) *
                      w.row_bytes);
          tracker.reset_peaks();
          zs.replay_training_pass();
          uint64_t most = tracker.snapshot().peak[QLFT_MEM_COMMUNICATION];
          // The replay looks up no rows; a rank's micro-batch does, inside the embedding unit.
          const int64_t R = int64_t(s.micro_batch) * s.seq_len;
          std::vector<int32_t> ids(static_cast<size_t>(R));
          for (int64_t i = 0; i < R; ++i) ids[size_t(i)] = int32_t(i * 7 % model->cfg.vocab);
          std::vector<float> rows(static_cast<size_t>(R * model->cfg.dim));
          tracker.reset_peaks();
          {
            UnitUse use(&zs, kEmbeddingUnit, layer_unit(0));
            zs.lookup_rows(ids.data(), R, rows.data());
          }
          most = std::max(most, tracker.snapshot().peak[QLFT_MEM_COMMUNICATION]);
          EXPECT_EQ(p.train[QLFT_MEM_COMMUNICATION] - exchange, most);
        }
}

namespace {

// A source that never offers a stored list: every group is loaded whole (the path before
// byte-range reads), the second path the range reads are checked against.
class WholeGroups final : public WeightGroupSource {
 public:
  explicit WholeGroups(WeightGroupSource& s) : s_(s) {}
  void load(Model& m, int group, bool with_head) override { s_.load(m, group, with_head); }
  QWeight stored_rows(bool head) override { return s_.stored_rows(head); }
  void load_rows(bool head, int64_t r0, int64_t n, void* out) override {
    s_.load_rows(head, r0, n, out);
  }
  std::vector<size_t> stored_group(int, bool) override { return {}; }
  void read_stored(size_t, size_t, size_t, void*) override { ADD_FAILURE() << "no stored list"; }

 private:
  WeightGroupSource& s_;
};

// Every storage Buffer of the groups of unit u, in for_each_weight_buffer's order.
std::vector<std::vector<uint8_t>> unit_bytes(Model& m, int u) {
  std::vector<std::vector<uint8_t>> out;
  const std::vector<std::vector<int>> groups = weight_groups_of_units(m);
  for (int g : groups[size_t(u)])
    for_each_weight_buffer(m, [&](int bg, Buffer& b) {
      if (bg != g) return;
      const auto* p = b.empty() ? nullptr : b.as<const uint8_t>();
      out.emplace_back(p, p ? p + b.size() : p);
    });
  return out;
}

}  // namespace

// A deferred load's shards read by byte range (f32 kept as stored: every group) against the
// shards of the same rank made from whole loaded groups: the same kept bytes, the same bytes
// gathered for every unit, no group read whole, no more read from the file than the rank keeps,
// and the weights peak while sharding at the planner's load peak (which the whole-group path
// exceeds by a layer).
TEST_F(PlannerTest, Zero3ShardsReadByRangeEqualTheLoadedGroups) {
  LoadOptions lo;
  lo.quant_type = qlft::QuantType::Keep;
  lo.deferred = true;
  for (int world : {2, 3})
    for (int rank = 0; rank < world; ++rank) {
      SCOPED_TRACE("world " + std::to_string(world) + " rank " + std::to_string(rank));
      Config c = config_of(kCases[0]);
      c.set("dist.zero_stage", "3");
      c.set("quant.type", "keep");
      PlanSettings s = PlanSettings::from_spec(qlft::parse_run_spec(c));
      s.world = world;
      s.dist_backend = DistBackend::Mpi;  // several MPI ranks load deferred
      MemoryTracker ta, tb;
      auto a = load_model(&ta, model_path_, lo), b = load_model(&tb, model_path_, lo);
      ASSERT_EQ(a->deferred_groups_read, 0);
      WeightGroupSource& src = dynamic_cast<FileUnitStream&>(*a->stream).source();
      WholeGroups whole(dynamic_cast<FileUnitStream&>(*b->stream).source());
      MirrorGather ca(rank, world), cb(rank, world);
      ta.reset_peaks();
      tb.reset_peaks();
      dist::Zero3Stream za(*a, &ca, &ta, nullptr, &src, s.row_chunk_bytes);
      dist::Zero3Stream zb(*b, &cb, &tb, nullptr, &whole, s.row_chunk_bytes);
      EXPECT_EQ(src.groups_loaded(), 0);
      EXPECT_EQ(za.shard_bytes(), zb.shard_bytes());
      EXPECT_LE(src.bytes_read_by_range(), za.shard_bytes());
      const MemoryPlan p = plan_memory_of_rank(
          a->cfg, weight_footprint_for_plan(*a, qlft::parse_run_spec(c).quant), s, rank);
      EXPECT_EQ(ta.snapshot().peak[QLFT_MEM_WEIGHTS], p.peak[QLFT_MEM_WEIGHTS]);
      EXPECT_GT(tb.snapshot().peak[QLFT_MEM_WEIGHTS], p.peak[QLFT_MEM_WEIGHTS]);
      for (int u = 0; u < unit_count(a->cfg.n_layers); ++u) {
        UnitUse ua(&za, u, kNoUnit), ub(&zb, u, kNoUnit);
        EXPECT_EQ(unit_bytes(*a, u), unit_bytes(*b, u)) << "unit " << u;
      }
    }
}

Config zero3_config_of(const Case& k) {
  Config c = config_of(k);
  c.set("dist.zero_stage", "3");
  return c;
}

// dist.zero3_shard_adapter against dist::Zero3Lora on each rank of worlds 2, 3 and 5: the
// adapter bytes the rank keeps, and communication = the replicated plan's less the exchange
// buffer (nothing is gathered after the step) plus the most one layer's fill holds (measured
// over a fill and drop of every layer).
TEST_F(PlannerTest, Zero3ShardedAdapterMatchesTheLoraShards) {
  MemoryTracker tracker;
  auto model = load(tracker, "nf4");
  const WeightFootprint w = weight_footprint(*model);
  const Config c = zero3_config_of(kCases[0]);
  for (int world : {2, 3, 5})
    for (int rank = 0; rank < world; ++rank) {
      SCOPED_TRACE("world " + std::to_string(world) + " rank " + std::to_string(rank));
      PlanSettings s = PlanSettings::from_spec(qlft::parse_run_spec(c));
      s.world = world;
      PlanSettings sharded = s;
      sharded.shard_adapter = true;
      const MemoryPlan p = plan_memory_of_rank(model->cfg, w, s, rank);
      const MemoryPlan q = plan_memory_of_rank(model->cfg, w, sharded, rank);
      MemoryTracker t;
      LoraAdapter lora(&t, model->shapes, s.lora, /*gradients=*/false);
      std::vector<uint64_t> numel;
      for (int l = 0; l < lora.n_layers(); ++l)
        for (int k = 0; k < kProjCount; ++k)
          if (lora.active(l, static_cast<Proj>(k))) {
            numel.push_back(uint64_t(lora.a_size(l, static_cast<Proj>(k))));
            numel.push_back(uint64_t(lora.b_size(l, static_cast<Proj>(k))));
          }
      const std::vector<int> owners = plan_lora_owners(numel, world);
      std::vector<size_t> share(static_cast<size_t>(world), 0);
      for (size_t i = 0; i < numel.size(); ++i) share[size_t(owners[i])] += numel[i];
      MirrorGather comm(rank, world);
      dist::Zero3Lora z(lora, owners, comm, &t);
      EXPECT_EQ(q.train[QLFT_MEM_ADAPTER], t.snapshot().reserved[QLFT_MEM_ADAPTER]);
      EXPECT_LT(q.train[QLFT_MEM_ADAPTER], p.train[QLFT_MEM_ADAPTER]);
      t.reset_peaks();
      for (int l = 0; l < lora.n_layers(); ++l) {
        z.fill(l);
        z.drop(l);
      }
      const uint64_t fill = t.snapshot().peak[QLFT_MEM_COMMUNICATION];
      EXPECT_GT(fill, 0u);
      EXPECT_EQ(fill, z.fill_peak_bytes(buffer_bytes));
      const uint64_t exchange = buffer_bytes(dist::host_exchange_bytes(
          world, *std::max_element(share.begin(), share.end()), true, s.bucket_bytes));
      EXPECT_EQ(q.train[QLFT_MEM_COMMUNICATION] + exchange, p.train[QLFT_MEM_COMMUNICATION] + fill);
    }
}

// A 1-rank ZeRO-3 trainer (the single communicator gathers by copying): every category exact
// during a real step. The trainer shards its own copy of the model; the loaded model keeps its
// weights beside it (`shared`).
TEST_F(PlannerTest, Zero3OnOneRankMatchesTheTracker) {
  MemoryTracker tracker;
  auto model = load(tracker, "nf4");
  const WeightFootprint w = weight_footprint(*model);
  const Config c = zero3_config_of(kCases[1]);
  const MemoryPlan plan =
      plan_memory(model->cfg, w, PlanSettings::from_spec(qlft::parse_run_spec(c)));
  const uint64_t shared = tracker.snapshot().reserved[QLFT_MEM_WEIGHTS];
  EXPECT_EQ(shared, w.bytes);
  Trainer t(*model, &tracker, nullptr, qlft::parse_run_spec(c));
  tracker.reset_peaks();  // sharding happened in the constructor
  StepReport r;
  t.step_on({full_batch(2, 128, model->cfg.vocab, 0), full_batch(2, 128, model->cfg.vocab, 1)}, &r);
  const MemorySnapshot m = tracker.snapshot();
  for (int cat = 0; cat < kMemCategoryCount; ++cat)
    EXPECT_EQ(plan.train[cat] + (cat == QLFT_MEM_WEIGHTS ? shared : 0), m.peak[cat])
        << mem_category_name(MemCategory(cat));
  // The categories peak at different moments (gathered units vs backward scratch): the sum
  // bounds the total from above.
  const uint64_t total = plan.train_peak + shared;
  EXPECT_GE(total, m.total_peak);
  EXPECT_LE(double(total - m.total_peak) / m.total_peak, 0.10);
}

// The RSS-level check (issue 23, tests/support/rss_check.h): load + one step of a matrix case in
// a forked child, whose tracker must equal the plan (load and training peaks) and whose peak RSS
// growth may exceed that tracked figure only by the untracked bound of a stories260K step. So
// the planner's prediction is what the operating system sees, up to that bound.
TEST_F(PlannerTest, PredictionIsWhatTheOsSees) {
  const std::string path = model_path_;
  for (const char* quant : {"keep", "nf4"})
    for (const Case& k : {kCases[1], kCases[5]}) {
      SCOPED_TRACE(std::string(quant) + " " + describe(k));
      const qlft_test::RssGrowth g = qlft_test::measure_rss_growth([&]() -> uint64_t {
        set_num_threads(1);
        MemoryTracker tracker;
        LoadOptions lo;
        lo.quant_type = qlft_test::quant_type(quant);
        auto model = load_model(&tracker, path, lo);
        const Config c = config_of(k);
        const MemoryPlan plan = plan_memory(model->cfg, weight_footprint(*model),
                                            PlanSettings::from_spec(qlft::parse_run_spec(c)));
        const uint64_t load_peak = tracker.snapshot().total_peak;
        tracker.reset_peaks();
        Trainer t(*model, &tracker, nullptr, qlft::parse_run_spec(c));
        StepReport r;
        t.step_on({full_batch(k.micro, k.seq, model->cfg.vocab, 0),
                   full_batch(k.micro, k.seq, model->cfg.vocab, 1)},
                  &r);
        const uint64_t train_peak = tracker.snapshot().total_peak;
        if (train_peak != plan.train_peak)  // fp32 cases: exact (MatchesTrackerOnFullBatches)
          throw std::runtime_error("training peak " + std::to_string(train_peak) + " != plan " +
                                   std::to_string(plan.train_peak));
        return std::max(load_peak, train_peak);
      });
      EXPECT_EQ(qlft_test::check_untracked(g, qlft_test::kUntrackedBoundTrainStep,
                                           std::string("planner ") + quant + " " + describe(k)),
                "");
    }
}
