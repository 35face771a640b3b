// Hugging Face model directory: config.json and model.safetensors, both fuzzed (input parts:
// config.json | model.safetensors), loaded as the trainer would (NF4 quantization).
#include "core/memory.h"
#include "fuzz_common.h"
#include "model/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parts = qlft_fuzz::split_parts(data, size, 2);
  // A declared model larger than this is refused by the reader's file-size checks long before.
  if (parts[1].size() > (4u << 20)) return 0;
  qlft_fuzz::write_scratch("config.json", parts[0]);
  qlft_fuzz::write_scratch("model.safetensors", parts[1]);
  qlft_fuzz::remove_scratch("model.safetensors.index.json");
  qlft_fuzz::expect_only_qlft_errors([&] {
    qlft::MemoryTracker tracker;
    qlft::LoadOptions opt;
    opt.quant_type = (size & 1) ? qlft::QuantType::NF4 : qlft::QuantType::Keep;
    auto m = qlft::load_model(&tracker, qlft_fuzz::scratch_dir(), opt);
    uint64_t sink = m->n_params() + m->weight_bytes();
    qlft_fuzz::keep(sink);
  });
  return 0;
}
