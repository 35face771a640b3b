// Sharded safetensors: model.safetensors.index.json plus two shards, all three fuzzed
// (input parts: index json | shard 1 | shard 2).
#include "formats/safetensors.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parts = qlft_fuzz::split_parts(data, size, 3);
  std::string index = qlft_fuzz::write_scratch("model.safetensors.index.json", parts[0]);
  qlft_fuzz::write_scratch("model-00001-of-00002.safetensors", parts[1]);
  qlft_fuzz::write_scratch("model-00002-of-00002.safetensors", parts[2]);
  qlft_fuzz::expect_only_qlft_errors([&] {
    auto s = qlft::SafetensorsSet::open(index);
    uint64_t sink = 0;
    for (const auto* t : s->tensors()) {
      if (s->find(t->name) == nullptr) std::abort();  // every listed tensor must be findable
      if (t->nbytes) sink += t->data[0] + t->data[t->nbytes - 1];
    }
    qlft_fuzz::keep(sink);
  });
  return 0;
}
