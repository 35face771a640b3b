// A short stories260K fine-tune (NF4 base, r=8, AdamW, fp32) through the C API on backend=cuda
// against the same run on backend=cpu: the per-step training losses must follow the CPU curve
// (relative difference under 1e-3 at every one of 12 steps; the CUDA GEMMs are fp32 without
// TF32, attention is fp32, so only summation order differs).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "qlft.h"
#include "support/test_support.h"

namespace {

// A runtime, model, dataset and trainer made from cfg through the C API, freed in reverse.
struct ApiRun {
  qlft_runtime* rt = nullptr;
  qlft_model* model = nullptr;
  qlft_dataset* data = nullptr;
  qlft_trainer* tr = nullptr;
  bool ok = false;
  ApiRun(const qlft_config* cfg, const std::string& model_path, const std::string& text) {
    ok = qlft_runtime_create(cfg, &rt) == QLFT_OK &&
         qlft_model_load(rt, model_path.c_str(), cfg, &model) == QLFT_OK &&
         qlft_dataset_load(model, text.c_str(), cfg, &data) == QLFT_OK &&
         qlft_trainer_create(model, data, cfg, &tr) == QLFT_OK;
  }
  ~ApiRun() {
    qlft_trainer_free(tr);
    qlft_dataset_free(data);
    qlft_model_free(model);
    qlft_runtime_free(rt);
  }
};

std::vector<double> loss_curve(const char* backend, const std::string& model_path,
                               const std::string& text,
                               const std::vector<std::pair<const char*, const char*>>& extra = {},
                               int steps = 12, std::vector<qlft_step_stats>* stats = nullptr,
                               std::vector<std::string>* launches = nullptr) {
  std::vector<double> out;
  qlft_config* cfg = nullptr;
  EXPECT_EQ(qlft_config_create(&cfg), QLFT_OK);
  const char* kv[][2] = {{"backend", backend},
                         {"quant.type", "nf4"},
                         {"lora.r", "8"},
                         {"lora.alpha", "16"},
                         {"optim.name", "adamw"},
                         {"optim.lr", "5e-3"},
                         {"train.micro_batch", "4"},
                         {"train.max_steps", "12"},
                         {"data.seq_len", "64"},
                         {"threads", "1"},
                         {"seed", "7"}};
  for (auto& p : kv) EXPECT_EQ(qlft_config_set(cfg, p[0], p[1]), QLFT_OK) << p[0];
  for (auto& p : extra) EXPECT_EQ(qlft_config_set(cfg, p.first, p.second), QLFT_OK) << p.first;
  const std::string max_steps = std::to_string(steps);
  EXPECT_EQ(qlft_config_set(cfg, "train.max_steps", max_steps.c_str()), QLFT_OK);
  {
    ApiRun run(cfg, model_path, text);
    for (int i = 0; run.ok && i < steps; ++i) {
      qlft_step_stats s{};
      s.struct_size = sizeof s;
      if (qlft_trainer_step(run.tr, &s) != QLFT_OK) break;
      out.push_back(s.loss);
      if (stats) stats->push_back(s);
      size_t need = 0;
      if (launches && qlft_trainer_step_launches(run.tr, nullptr, 0, &need) == QLFT_OK) {
        std::string k(need, '\0');
        EXPECT_EQ(qlft_trainer_step_launches(run.tr, k.data(), k.size(), nullptr), QLFT_OK);
        k.resize(need - 1);
        launches->push_back(k);
      }
    }
    EXPECT_EQ(out.size(), size_t(steps)) << backend << ": " << qlft_last_error();
  }
  qlft_config_free(cfg);
  return out;
}

}  // namespace

TEST(CudaFineTune, Stories260KLossCurveFollowsCpu) {
  QLFT_NEED_GPU();
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  QLFT_NEED_SHARED(text, "data/tinyshakespeare.txt");
  const std::vector<double> cpu = loss_curve("cpu", model_path, text);
  const std::vector<double> gpu = loss_curve("cuda", model_path, text);
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i)
    EXPECT_NEAR(gpu[i], cpu[i], 1e-3 * std::fabs(cpu[i])) << "step " << i + 1;
  EXPECT_LT(gpu.back(), gpu.front());  // and it learns
}

// Issue 17, Done-when 2: the whole QLoRA step on backend=cuda (NF4 base, LoRA on all seven
// projections, 8-bit AdamW, gradient checkpointing every layer) for 20 steps against backend=cpu.
// fp32: within 1e-4 relative per step (only summation order differs). bf16: both backends round
// the same tensors to bf16 (except attention's forward P, which the CPU rounds and the device's
// online softmax cannot) and accumulate in fp32, so the curves differ only where a different fp32
// summation order flips a bf16 rounding, and such flips compound over the steps. How far two
// correct bf16 engines drift apart here was measured on the H100's host (session 12): the CPU
// backend's own AMX and AVX2 paths (QLFT_CPU_ISA=avx2) differ by 5.5e-4 relative per step on
// average and 1.7e-3 at most (step 20); the device's curve is 6.4e-4 / 2.5e-3 from the AMX path,
// 4.4e-4 / 1.5e-3 from AVX-512 and 4.4e-4 / 1.2e-3 from AVX2. So the bound is on both: the mean
// over the 20 steps within 1e-3 (a tensor rounded on one backend and not the other biases every
// step, not one: before the device rounded the LoRA intermediates and dS as the CPU does, its
// worst step in the emulator was 1.98e-3 against 1.46e-3 after) and every step within 4e-3,
// about twice the CPU engines' own spread.
class CudaFineTuneFull : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaFineTuneFull, NF4LoraAllSevenAdamW8bitCheckpointingFollowsCpu) {
  QLFT_NEED_GPU();
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  QLFT_NEED_SHARED(text, "data/tinyshakespeare.txt");
  const std::string precision = GetParam();
  const std::vector<std::pair<const char*, const char*>> extra = {
      {"train.precision", GetParam()},
      {"optim.name", "adamw8bit"},
      {"train.grad_checkpointing", "1"},
      {"lora.target_modules", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"}};
  const std::vector<double> cpu = loss_curve("cpu", model_path, text, extra, 20);
  const std::vector<double> gpu = loss_curve("cuda", model_path, text, extra, 20);
  ASSERT_EQ(cpu.size(), gpu.size());
  const double tol = precision == "fp32" ? 1e-4 : 4e-3;
  const double mean_tol = precision == "fp32" ? 1e-4 : 1e-3;
  double worst = 0, sum = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_NEAR(gpu[i], cpu[i], tol * std::fabs(cpu[i])) << "step " << i + 1;
    worst = std::max(worst, std::fabs(gpu[i] - cpu[i]) / std::fabs(cpu[i]));
    sum += std::fabs(gpu[i] - cpu[i]) / std::fabs(cpu[i]);
    std::printf("%s step %2zu: cpu %.7f gpu %.7f (%.2e)\n", GetParam(), i + 1, cpu[i], gpu[i],
                std::fabs(gpu[i] - cpu[i]) / std::fabs(cpu[i]));
  }
  const double mean = sum / double(cpu.size());
  std::printf("%s: relative loss difference over %zu steps: worst %.3g, mean %.3g\n", GetParam(),
              cpu.size(), worst, mean);
  EXPECT_LE(mean, mean_tol);
  EXPECT_LT(gpu.back(), gpu.front());
}

INSTANTIATE_TEST_SUITE_P(Precision, CudaFineTuneFull, ::testing::Values("fp32", "bf16"));

// Issue 18, done-when 2: gradient accumulation (device gradients added into the adapter after
// every micro-batch's backward) with paged 8-bit AdamW, fp32: the CPU curve within 1e-4.
TEST(CudaFineTune, AccumulationPagedAdamW8bitFollowsCpu) {
  QLFT_NEED_GPU();
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  QLFT_NEED_SHARED(text, "data/tinyshakespeare.txt");
  const std::vector<std::pair<const char*, const char*>> extra = {
      {"train.accumulation", "3"}, {"train.micro_batch", "2"}, {"optim.name", "paged_adamw8bit"}};
  const std::vector<double> cpu = loss_curve("cpu", model_path, text, extra, 6);
  const std::vector<double> gpu = loss_curve("cuda", model_path, text, extra, 6);
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i)
    EXPECT_NEAR(gpu[i], cpu[i], 1e-4 * std::fabs(cpu[i])) << "step " << i + 1;
}

// fp16 with a loss scale so large that the first steps overflow: the same steps are skipped, the
// scale backs off the same way, and the curve follows the CPU's fp16 curve (2e-3, as bf16).
TEST(CudaFineTune, Fp16OverflowStepsSkippedAsOnCpu) {
  QLFT_NEED_GPU();
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  QLFT_NEED_SHARED(text, "data/tinyshakespeare.txt");
  const std::vector<std::pair<const char*, const char*>> extra = {
      {"train.precision", "fp16"},
      {"scaler.init_scale", "1e12"},
      {"scaler.backoff_factor", "1e-6"}};
  std::vector<qlft_step_stats> c, g;
  const std::vector<double> cpu = loss_curve("cpu", model_path, text, extra, 6, &c);
  const std::vector<double> gpu = loss_curve("cuda", model_path, text, extra, 6, &g);
  ASSERT_EQ(cpu.size(), gpu.size());
  ASSERT_EQ(c.size(), g.size());
  EXPECT_EQ(c[0].skipped, 1u);  // 1e12 overflows the fp16 gradients: the setup works
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_EQ(g[i].skipped, c[i].skipped) << "step " << i + 1;
    EXPECT_EQ(g[i].loss_scale, c[i].loss_scale) << "step " << i + 1;
    EXPECT_NEAR(gpu[i], cpu[i], 2e-3 * std::fabs(cpu[i])) << "step " << i + 1;
  }
}

// Issue 18, done-when 1: activations, the adapter, its gradients and the AdamW state live in the
// device backend's memory, so after the first step (which uploads the frozen weights) a step
// moves the batch in (token ids and labels, and the packed rows' positions and document ids:
// 4 KiB more here) and a few scalars out (loss sum and count, gradient norm), and the host waits
// twice. The host-staged backend moved every op's inputs and outputs: about 40 MB and ~700 waits
// per step of this run.
TEST(CudaFineTune, StepMovesOnlyTheBatchAndScalars) {
  QLFT_NEED_GPU();
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  QLFT_NEED_SHARED(text, "data/tinyshakespeare.txt");
  std::vector<qlft_step_stats> st;
  const std::vector<std::pair<const char*, const char*>> extra = {
      {"data.seq_len", "128"},
      {"lora.target_modules", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"}};
  std::vector<std::string> by_kernel;  // qlft_trainer_step_launches (metrics.jsonl's)
  const std::vector<double> gpu = loss_curve("cuda", model_path, text, extra, 4, &st, &by_kernel);
  ASSERT_EQ(st.size(), 4u);
  ASSERT_EQ(by_kernel.size(), 4u);
  // Token ids and labels of 4 rows of 128 (int32).
  const uint64_t ids_and_labels = 2ull * 4 * 128 * 4;
  for (size_t i = 1; i < st.size(); ++i) {
    EXPECT_GE(st[i].host_to_device_bytes, ids_and_labels) << "step " << i + 1;
    EXPECT_LE(st[i].host_to_device_bytes, ids_and_labels + 4096) << "step " << i + 1;
    EXPECT_LE(st[i].device_to_host_bytes, 4096u) << "step " << i + 1;
    EXPECT_LE(st[i].device_syncs, 4u) << "step " << i + 1;
    // Launch counting reaches the step's stats (cuda/src/launch_count.h); steps of one shape
    // launch the same work.
    EXPECT_GT(st[i].device_launches, 0u) << "step " << i + 1;
    EXPECT_EQ(st[i].device_launches, st[1].device_launches) << "step " << i + 1;
    // The launches by kernel add up to the total, GEMMs among them; steps of one shape list
    // the same kernels.
    uint64_t sum = 0;
    for (size_t at = 0; (at = by_kernel[i].find("\": ", at)) != std::string::npos; at += 3)
      sum += std::strtoull(by_kernel[i].c_str() + at + 3, nullptr, 10);
    EXPECT_EQ(sum, st[i].device_launches) << by_kernel[i];
    EXPECT_NE(by_kernel[i].find("\"cublasLtMatmul\": "), std::string::npos) << by_kernel[i];
    EXPECT_EQ(by_kernel[i], by_kernel[1]) << "step " << i + 1;
    std::printf("step %zu: %llu bytes in, %llu out, %llu waits, %llu launches\n", i + 1,
                (unsigned long long)st[i].host_to_device_bytes,
                (unsigned long long)st[i].device_to_host_bytes,
                (unsigned long long)st[i].device_syncs, (unsigned long long)st[i].device_launches);
  }
}

// Issue 18, done-when 3: greedy generation through the C API with backend=cuda gives the CPU
// backend's tokens, with a LoRA adapter trained for a few steps (B no longer zero) applied.
TEST(CudaGenerate, GreedyTextEqualsCpu) {
  QLFT_NEED_GPU();
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  QLFT_NEED_SHARED(text, "data/tinyshakespeare.txt");
  qlft_config* cfg = nullptr;
  ASSERT_EQ(qlft_config_create(&cfg), QLFT_OK);
  const char* kv[][2] = {
      {"quant.type", "nf4"},  {"lora.r", "8"},  {"optim.lr", "1e-2"}, {"train.micro_batch", "2"},
      {"data.seq_len", "64"}, {"threads", "1"}, {"seed", "3"}};
  for (auto& p : kv) ASSERT_EQ(qlft_config_set(cfg, p[0], p[1]), QLFT_OK) << p[0];
  ApiRun run(cfg, model_path, text);
  qlft_config_free(cfg);
  ASSERT_TRUE(run.ok) << qlft_last_error();
  qlft_model* model = run.model;
  qlft_trainer* tr = run.tr;
  for (int i = 0; i < 4; ++i) {
    qlft_step_stats s{};
    s.struct_size = sizeof s;
    ASSERT_EQ(qlft_trainer_step(tr, &s), QLFT_OK) << qlft_last_error();
  }
  auto generate = [&](const char* backend) {
    qlft_config* g = nullptr;
    EXPECT_EQ(qlft_config_create(&g), QLFT_OK);
    EXPECT_EQ(qlft_config_set(g, "backend", backend), QLFT_OK);
    EXPECT_EQ(qlft_config_set(g, "generate.max_tokens", "40"), QLFT_OK);
    EXPECT_EQ(qlft_config_set(g, "generate.temperature", "0"), QLFT_OK);
    std::string out;
    auto on_text = [](const char* piece, void* user) -> int32_t {
      *static_cast<std::string*>(user) += piece;
      return 0;
    };
    EXPECT_EQ(qlft_generate(model, tr, "Once upon a time", g, on_text, &out), QLFT_OK)
        << backend << ": " << qlft_last_error();
    qlft_config_free(g);
    return out;
  };
  const std::string cpu = generate("cpu");
  const std::string gpu = generate("cuda");
  EXPECT_GT(cpu.size(), 20u);
  EXPECT_EQ(gpu, cpu);
  std::printf("greedy continuation (both backends): %s\n", cpu.c_str());
}

// The device step keeps the adapter and the AdamW state in device memory: a checkpoint written
// after 3 steps (the host buffers refreshed from the device, the state copied out) and resumed
// by a new trainer gives the uninterrupted run's next 3 losses, bit for bit.
TEST(CudaFineTune, DeviceStateCheckpointResumesExactly) {
  QLFT_NEED_GPU();
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  QLFT_NEED_SHARED(text, "data/tinyshakespeare.txt");
  const std::string ckpt = qlft_test::temp_dir("cuda_ckpt") + "/ckpt.safetensors";
  auto run = [&](bool save_at_3, bool resume, std::vector<double>* losses) {
    qlft_config* cfg = nullptr;
    ASSERT_EQ(qlft_config_create(&cfg), QLFT_OK);
    const char* kv[][2] = {
        {"backend", "cuda"},      {"quant.type", "nf4"},      {"lora.r", "4"},
        {"optim.lr", "5e-3"},     {"train.micro_batch", "2"}, {"data.seq_len", "64"},
        {"train.max_steps", "6"}, {"threads", "1"},           {"seed", "11"}};
    for (auto& p : kv) ASSERT_EQ(qlft_config_set(cfg, p[0], p[1]), QLFT_OK) << p[0];
    ApiRun run(cfg, model_path, text);
    qlft_config_free(cfg);
    ASSERT_TRUE(run.ok) << qlft_last_error();
    qlft_trainer* tr = run.tr;
    if (resume) {
      ASSERT_EQ(qlft_trainer_resume(tr, ckpt.c_str()), QLFT_OK) << qlft_last_error();
    }
    for (int i = resume ? 3 : 0; i < 6; ++i) {
      qlft_step_stats s{};
      s.struct_size = sizeof s;
      ASSERT_EQ(qlft_trainer_step(tr, &s), QLFT_OK) << qlft_last_error();
      losses->push_back(s.loss);
      if (save_at_3 && i == 2) {
        ASSERT_EQ(qlft_trainer_save_checkpoint(tr, ckpt.c_str()), QLFT_OK) << qlft_last_error();
      }
    }
  };
  std::vector<double> whole, resumed;
  run(true, false, &whole);
  run(false, true, &resumed);
  ASSERT_EQ(whole.size(), 6u);
  ASSERT_EQ(resumed.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(resumed[i], whole[3 + i]) << "step " << 4 + i;
  EXPECT_NE(whole[3], whole[2]);  // it trains
}

// Issue 45: 8-bit AdamW and paged 8-bit AdamW step on the device (train/device_adamw8bit.cpp;
// the state in device or managed memory), so after the first step a step moves exactly the
// batch in: its token ids, labels, positions and document ids (4 int32 arrays of 4 rows of 64;
// the rows are packed, so positions and document ids are sent), nothing of the adapter or its
// gradients. Rank 64 gives stories260K tensors on both state paths (8-bit blocks from 4096
// values, fp32 below). The losses follow backend=cpu's within the fp32 bound of the curves above
// (1e-4 relative per step); a checkpoint written on the device after step 3 resumes on the device
// bit for bit and on backend=cpu (the same entries as the host AdamW8bit) within that bound.
class CudaFineTune8bit : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaFineTune8bit, StepsOnDeviceMovingOnlyTheBatchAndFollowsCpu) {
  QLFT_NEED_GPU();
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  QLFT_NEED_SHARED(text, "data/tinyshakespeare.txt");
  const std::vector<std::pair<const char*, const char*>> extra = {
      {"optim.name", GetParam()},
      {"lora.r", "64"},  // rank 64: A [64, 64] and gate/up B hold 4096+ values (8-bit state)
      {"lora.target_modules", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"}};
  std::vector<qlft_step_stats> st;
  const std::vector<double> cpu = loss_curve("cpu", model_path, text, extra, 6);
  const std::vector<double> gpu = loss_curve("cuda", model_path, text, extra, 6, &st);
  ASSERT_EQ(cpu.size(), gpu.size());
  ASSERT_EQ(st.size(), 6u);
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_NEAR(gpu[i], cpu[i], 1e-4 * std::fabs(cpu[i])) << "step " << i + 1;
    std::printf("%s step %zu: cpu %.7f gpu %.7f (%.2e)\n", GetParam(), i + 1, cpu[i], gpu[i],
                std::fabs(gpu[i] - cpu[i]) / std::fabs(cpu[i]));
  }
  const uint64_t batch = 4ull * 4 * 64 * sizeof(int32_t);
  for (size_t i = 1; i < st.size(); ++i) {
    EXPECT_EQ(st[i].host_to_device_bytes, batch) << "step " << i + 1;
    EXPECT_LE(st[i].device_to_host_bytes, 64u) << "step " << i + 1;
    std::printf("%s step %zu: %llu bytes in (batch %llu), %llu out, %llu waits\n", GetParam(),
                i + 1, (unsigned long long)st[i].host_to_device_bytes, (unsigned long long)batch,
                (unsigned long long)st[i].device_to_host_bytes,
                (unsigned long long)st[i].device_syncs);
  }
}

TEST_P(CudaFineTune8bit, DeviceCheckpointResumesOnDeviceExactlyAndOnCpu) {
  QLFT_NEED_GPU();
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  QLFT_NEED_SHARED(text, "data/tinyshakespeare.txt");
  const std::string ckpt = qlft_test::temp_dir("cuda_ckpt8") + "/ckpt.safetensors";
  auto run = [&](const char* backend, bool save_at_3, bool resume, std::vector<double>* losses) {
    qlft_config* cfg = nullptr;
    ASSERT_EQ(qlft_config_create(&cfg), QLFT_OK);
    const char* kv[][2] = {
        {"backend", backend},      {"quant.type", "nf4"},      {"lora.r", "64"},
        {"optim.lr", "5e-3"},      {"train.micro_batch", "2"}, {"data.seq_len", "64"},
        {"train.max_steps", "6"},  {"threads", "1"},           {"seed", "11"},
        {"optim.name", GetParam()}};
    for (auto& p : kv) ASSERT_EQ(qlft_config_set(cfg, p[0], p[1]), QLFT_OK) << p[0];
    ApiRun run(cfg, model_path, text);
    qlft_config_free(cfg);
    ASSERT_TRUE(run.ok) << qlft_last_error();
    if (resume) {
      ASSERT_EQ(qlft_trainer_resume(run.tr, ckpt.c_str()), QLFT_OK) << qlft_last_error();
    }
    for (int i = resume ? 3 : 0; i < 6; ++i) {
      qlft_step_stats s{};
      s.struct_size = sizeof s;
      ASSERT_EQ(qlft_trainer_step(run.tr, &s), QLFT_OK) << qlft_last_error();
      losses->push_back(s.loss);
      if (save_at_3 && i == 2) {
        ASSERT_EQ(qlft_trainer_save_checkpoint(run.tr, ckpt.c_str()), QLFT_OK) << qlft_last_error();
      }
    }
  };
  std::vector<double> whole, on_device, on_cpu;
  run("cuda", true, false, &whole);
  run("cuda", false, true, &on_device);
  run("cpu", false, true, &on_cpu);
  ASSERT_EQ(whole.size(), 6u);
  ASSERT_EQ(on_device.size(), 3u);
  ASSERT_EQ(on_cpu.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(on_device[i], whole[3 + i]) << "step " << 4 + i;
    EXPECT_NEAR(on_cpu[i], whole[3 + i], 1e-4 * std::fabs(whole[3 + i])) << "step " << 4 + i;
  }
  EXPECT_NE(whole[3], whole[2]);  // it trains
}

INSTANTIATE_TEST_SUITE_P(Optim, CudaFineTune8bit,
                         ::testing::Values("adamw8bit", "paged_adamw8bit"));
