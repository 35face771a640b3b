// Single safetensors file: header length, JSON header, dtypes, shapes and offsets of arbitrary
// bytes; on success the first and last byte of every tensor are read.
#include "formats/safetensors.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string path =
      qlft_fuzz::write_scratch("in.safetensors", {reinterpret_cast<const char*>(data), size});
  qlft_fuzz::expect_only_qlft_errors([&] {
    auto f = qlft::SafetensorsFile::open(path);
    uint64_t sink = f->metadata().size();
    for (const auto& t : f->tensors()) {
      sink += t.numel();
      if (t.nbytes) sink += t.data[0] + t.data[t.nbytes - 1];
    }
    qlft_fuzz::keep(sink);
  });
  return 0;
}
