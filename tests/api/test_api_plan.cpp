// qlft_estimate_memory and qlft_trainer_batch_shape through the C ABI: the estimate from the
// file alone equals the one from the loaded model, bounds the measured peak of a real step
// to within 10%, and honours struct_size; train.micro_batch=auto picks a batch shape that holds
// train.effective_batch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <string>

#include "api/api_session.h"
#include "qlft.h"
#include "support/test_support.h"

namespace {

using qlft_test::Session;

}  // namespace

TEST(ApiPlan, EstimateMatchesModelAndBoundsTheMeasuredPeak) {
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  QLFT_NEED_SHARED(text, "data/tinyshakespeare.txt");
  Session s;
  ASSERT_EQ(qlft_config_create(&s.cfg), QLFT_OK);
  s.set("quant.type", "nf4");
  s.set("train.precision", "bf16");
  s.set("data.seq_len", "128");
  s.set("train.micro_batch", "4");
  s.set("train.max_steps", "1");
  s.set("threads", "2");
  s.set("train.output_dir", qlft_test::temp_dir("api-plan").c_str());

  qlft_memory_estimate from_file{};
  from_file.struct_size = sizeof from_file;
  ASSERT_EQ(qlft_estimate_memory(nullptr, model_path.c_str(), s.cfg, &from_file), QLFT_OK)
      << qlft_last_error();
  EXPECT_EQ(from_file.struct_size, sizeof from_file);
  EXPECT_EQ(from_file.micro_batch, 4u);
  EXPECT_EQ(from_file.max_micro_batch, 0u);  // no memory.limit

  ASSERT_EQ(qlft_runtime_create(s.cfg, &s.rt), QLFT_OK);
  ASSERT_EQ(qlft_model_load(s.rt, model_path.c_str(), s.cfg, &s.model), QLFT_OK);
  qlft_memory_report after_load{};
  after_load.struct_size = sizeof after_load;
  ASSERT_EQ(qlft_runtime_memory_report(s.rt, &after_load), QLFT_OK);
  EXPECT_EQ(from_file.peak[QLFT_MEM_WEIGHTS], after_load.reserved[QLFT_MEM_WEIGHTS]);

  qlft_memory_estimate from_model{};
  from_model.struct_size = sizeof from_model;
  ASSERT_EQ(qlft_estimate_memory(s.model, nullptr, s.cfg, &from_model), QLFT_OK);
  EXPECT_EQ(from_model.train_peak, from_file.train_peak);
  for (int c = 0; c < QLFT_MEM_CATEGORY_COUNT; ++c)
    EXPECT_EQ(from_model.train[c], from_file.train[c]);

  ASSERT_EQ(qlft_dataset_load(s.model, text.c_str(), s.cfg, &s.data), QLFT_OK);
  ASSERT_EQ(qlft_trainer_create(s.model, s.data, s.cfg, &s.trainer), QLFT_OK);
  ASSERT_EQ(qlft_trainer_step(s.trainer, nullptr), QLFT_OK) << qlft_last_error();
  qlft_memory_report m{};
  m.struct_size = sizeof m;
  ASSERT_EQ(qlft_trainer_memory_report(s.trainer, &m), QLFT_OK);
  EXPECT_EQ(from_model.peak[QLFT_MEM_ACTIVATIONS], m.peak[QLFT_MEM_ACTIVATIONS]);
  EXPECT_EQ(from_model.peak[QLFT_MEM_OPTIMIZER], m.peak[QLFT_MEM_OPTIMIZER]);
  EXPECT_LE(std::fabs(double(from_model.total_peak) - double(m.total_peak)) / m.total_peak, 0.10);

  // An older caller's shorter struct gets only its prefix.
  qlft_memory_estimate small{};
  small.struct_size = sizeof(uint32_t) + sizeof(uint64_t);
  small.train_peak = 12345;
  ASSERT_EQ(qlft_estimate_memory(s.model, nullptr, s.cfg, &small), QLFT_OK);
  EXPECT_EQ(small.struct_size, sizeof(uint32_t) + sizeof(uint64_t));
  EXPECT_EQ(small.train_peak, 12345u);

  // A memory.limit gives the largest micro-batch predicted to fit.
  s.set("memory.limit", std::to_string(from_model.train_peak).c_str());
  ASSERT_EQ(qlft_estimate_memory(s.model, nullptr, s.cfg, &from_model), QLFT_OK);
  EXPECT_EQ(from_model.max_micro_batch, 4u);
}

TEST(ApiPlan, BadArguments) {
  qlft_memory_estimate e{};
  e.struct_size = sizeof e;
  EXPECT_EQ(qlft_estimate_memory(nullptr, nullptr, nullptr, &e), QLFT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qlft_last_error()).find("exactly one"), std::string::npos);
  EXPECT_EQ(qlft_estimate_memory(nullptr, "/nonexistent.gguf", nullptr, &e), QLFT_ERR_IO);
  EXPECT_EQ(qlft_estimate_memory(nullptr, "/nonexistent.gguf", nullptr, nullptr),
            QLFT_ERR_INVALID_ARGUMENT);
  uint32_t mb = 0, acc = 0;
  EXPECT_EQ(qlft_trainer_batch_shape(nullptr, &mb, &acc), QLFT_ERR_INVALID_ARGUMENT);
}

TEST(ApiPlan, AutoMicroBatchHoldsTheEffectiveBatch) {
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  QLFT_NEED_SHARED(text, "data/tinyshakespeare.txt");
  Session s;
  ASSERT_EQ(qlft_config_create(&s.cfg), QLFT_OK);
  s.set("quant.type", "keep");
  s.set("data.seq_len", "64");
  s.set("train.micro_batch", "auto");
  s.set("train.effective_batch", "16");
  s.set("train.autotune_cache", "off");
  s.set("memory.limit", "12M");
  s.set("threads", "2");
  ASSERT_EQ(qlft_runtime_create(s.cfg, &s.rt), QLFT_OK);
  ASSERT_EQ(qlft_model_load(s.rt, model_path.c_str(), s.cfg, &s.model), QLFT_OK);
  ASSERT_EQ(qlft_dataset_load(s.model, text.c_str(), s.cfg, &s.data), QLFT_OK);
  ASSERT_EQ(qlft_trainer_create(s.model, s.data, s.cfg, &s.trainer), QLFT_OK) << qlft_last_error();
  uint32_t mb = 0, acc = 0;
  ASSERT_EQ(qlft_trainer_batch_shape(s.trainer, &mb, &acc), QLFT_OK);
  EXPECT_GE(mb, 1u);
  EXPECT_EQ(mb * acc, 16u);
  EXPECT_EQ(qlft_trainer_step(s.trainer, nullptr), QLFT_OK) << qlft_last_error();
}

// backend=cuda (issue 18): the estimate names the device's part (the planner is plain C++: no
// GPU needed), memory.limit's largest micro-batch is against the device part, and a caller
// built before the device fields (a smaller struct_size) gets the fields it knows.
TEST(ApiPlan, CudaEstimateReportsDeviceMemory) {
  QLFT_NEED_SHARED(model_path, "models/stories260K.gguf");
  Session s;
  ASSERT_EQ(qlft_config_create(&s.cfg), QLFT_OK);
  s.set("quant.type", "nf4");
  s.set("data.seq_len", "64");
  s.set("train.micro_batch", "4");
  qlft_memory_estimate cpu{};
  cpu.struct_size = sizeof cpu;
  ASSERT_EQ(qlft_estimate_memory(nullptr, model_path.c_str(), s.cfg, &cpu), QLFT_OK);
  EXPECT_EQ(cpu.device_train_peak, 0u);

  s.set("backend", "cuda");
  qlft_memory_estimate gpu{};
  gpu.struct_size = sizeof gpu;
  ASSERT_EQ(qlft_estimate_memory(nullptr, model_path.c_str(), s.cfg, &gpu), QLFT_OK)
      << qlft_last_error();
  uint64_t sum = 0;
  for (int c = 0; c < QLFT_MEM_CATEGORY_COUNT; ++c) {
    sum += gpu.device_train[c];
    EXPECT_LE(gpu.device_train[c], gpu.train[c]) << c;
  }
  EXPECT_EQ(sum, gpu.device_train_peak);
  // The runner's tensors and the scratch (with the 32 MiB cuBLASLt workspace) are on the device;
  // the host keeps the loaded weights and the adapter.
  EXPECT_EQ(gpu.device_train[QLFT_MEM_ACTIVATIONS], gpu.train[QLFT_MEM_ACTIVATIONS]);
  EXPECT_GE(gpu.device_train[QLFT_MEM_WORKSPACE], uint64_t(32) << 20);
  EXPECT_EQ(gpu.train[QLFT_MEM_WEIGHTS] - gpu.device_train[QLFT_MEM_WEIGHTS],
            cpu.train[QLFT_MEM_WEIGHTS]);
  EXPECT_LT(gpu.device_train_peak, gpu.train_peak);

  // memory.limit budgets the device part: just above the device peak at micro-batch 4 allows 4
  // (the host part on top would not fit).
  const std::string limit = std::to_string(gpu.device_train_peak + 1024);
  s.set("memory.limit", limit.c_str());
  qlft_memory_estimate lim{};
  lim.struct_size = sizeof lim;
  ASSERT_EQ(qlft_estimate_memory(nullptr, model_path.c_str(), s.cfg, &lim), QLFT_OK);
  EXPECT_EQ(lim.max_micro_batch, 4u);

  // An older caller's struct ends before the device fields: they are left alone.
  qlft_memory_estimate old{};
  old.device_train_peak = 12345;
  old.struct_size = offsetof(qlft_memory_estimate, device_train);
  ASSERT_EQ(qlft_estimate_memory(nullptr, model_path.c_str(), s.cfg, &old), QLFT_OK);
  EXPECT_EQ(old.struct_size, offsetof(qlft_memory_estimate, device_train));
  EXPECT_EQ(old.train_peak, lim.train_peak);
  EXPECT_EQ(old.device_train_peak, 12345u);
}
