// The training step with the CUDA backend's stream recorded as graphs (cuda/src/graph.h,
// cuda.graphs=true) against the same steps launched kernel by kernel: a stories260K fine-tune
// (NF4, LoRA on all seven projections, AdamW on the device) gives bit-identical losses and
// gradient norms at every step, and the host submits a few graph launches per step instead of
// hundreds of kernel launches (qlft_step_stats.device_launches, metrics.jsonl "launches").
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "qlft.h"
#include "support/test_support.h"

namespace {

std::vector<qlft_step_stats> run_steps(bool graphs, const std::string& model_path,
                                       const std::string& text, int steps) {
  std::vector<qlft_step_stats> out;
  qlft_config* cfg = nullptr;
  EXPECT_EQ(qlft_config_create(&cfg), QLFT_OK);
  const char* kv[][2] = {
      {"backend", "cuda"},
      {"quant.type", "nf4"},
      {"lora.r", "4"},
      {"lora.alpha", "8"},
      {"optim.name", "adamw"},
      {"optim.lr", "5e-3"},
      {"train.micro_batch", "2"},
      {"data.seq_len", "32"},
      {"threads", "1"},
      {"seed", "7"},
      {"lora.target_modules", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"}};
  for (auto& p : kv) EXPECT_EQ(qlft_config_set(cfg, p[0], p[1]), QLFT_OK) << p[0];
  EXPECT_EQ(qlft_config_set(cfg, "cuda.graphs", graphs ? "true" : "false"), QLFT_OK);
  const std::string max_steps = std::to_string(steps);
  EXPECT_EQ(qlft_config_set(cfg, "train.max_steps", max_steps.c_str()), QLFT_OK);
  qlft_runtime* rt = nullptr;
  qlft_model* model = nullptr;
  qlft_dataset* data = nullptr;
  qlft_trainer* tr = nullptr;
  const bool ok = qlft_runtime_create(cfg, &rt) == QLFT_OK &&
                  qlft_model_load(rt, model_path.c_str(), cfg, &model) == QLFT_OK &&
                  qlft_dataset_load(model, text.c_str(), cfg, &data) == QLFT_OK &&
                  qlft_trainer_create(model, data, cfg, &tr) == QLFT_OK;
  EXPECT_TRUE(ok) << qlft_last_error();
  for (int i = 0; ok && i < steps; ++i) {
    qlft_step_stats s{};
    s.struct_size = sizeof s;
    if (qlft_trainer_step(tr, &s) != QLFT_OK) break;
    out.push_back(s);
  }
  EXPECT_EQ(out.size(), size_t(steps)) << qlft_last_error();
  qlft_trainer_free(tr);
  qlft_dataset_free(data);
  qlft_model_free(model);
  qlft_runtime_free(rt);
  qlft_config_free(cfg);
  return out;
}

}  // namespace

TEST(CudaGraphStep, SameStepsBitForBitWithAFewSubmissions) {
  QLFT_NEED_GPU();
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  QLFT_NEED_SHARED(text, "data/tinyshakespeare.txt");
  const int steps = 3;
  const std::vector<qlft_step_stats> eager = run_steps(false, model_path, text, steps);
  const std::vector<qlft_step_stats> graph = run_steps(true, model_path, text, steps);
  ASSERT_EQ(eager.size(), size_t(steps));
  ASSERT_EQ(graph.size(), size_t(steps));
  for (int i = 0; i < steps; ++i) {
    // The same kernels with the same arguments in the same order: the same bits, which the
    // next step's loss carries for the parameters the optimizer wrote.
    EXPECT_EQ(graph[i].loss, eager[i].loss) << "step " << i + 1;
    EXPECT_EQ(graph[i].grad_norm, eager[i].grad_norm) << "step " << i + 1;
    EXPECT_EQ(graph[i].host_to_device_bytes, eager[i].host_to_device_bytes) << "step " << i + 1;
    EXPECT_EQ(graph[i].device_syncs, eager[i].device_syncs) << "step " << i + 1;
    std::printf("step %d: loss %.7f, launches %llu eager, %llu with graphs\n", i + 1,
                double(eager[i].loss), (unsigned long long)eager[i].device_launches,
                (unsigned long long)graph[i].device_launches);
  }
  // After the first step (which uploads the weights and fills the allocator's cache), a step
  // is one graph per point where the host waits or hands over host memory: the batch upload,
  // the loss read-back, the gradient norm read-back.
  for (int i = 1; i < steps; ++i) {
    EXPECT_LE(graph[i].device_launches, 4u) << "step " << i + 1;
    EXPECT_GE(graph[i].device_launches, 1u) << "step " << i + 1;
    EXPECT_GT(eager[i].device_launches, 20 * graph[i].device_launches) << "step " << i + 1;
  }
}
