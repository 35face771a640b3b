// GGUF reader: header, metadata and tensor table of arbitrary bytes; on success every accessor
// and every tensor's bytes are touched so an out-of-range pointer shows up under ASan.
#include "formats/gguf.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string path =
      qlft_fuzz::write_scratch("in.gguf", {reinterpret_cast<const char*>(data), size});
  qlft_fuzz::expect_only_qlft_errors([&] {
    auto g = qlft::GgufFile::open(path);
    uint64_t sink = g->version() + g->alignment();
    for (const auto& kv : g->metadata()) {
      const std::string& key = kv.first;
      const qlft::GgufValue& v = kv.second;
      sink += key.size() + v.str.size() + v.strings.size();
      if (v.type == qlft::GgufType::ARRAY && v.array_data && v.count) {
        qlft_fuzz::expect_only_qlft_errors([&] { sink += (uint64_t)v.array_i(v.count - 1); });
        qlft_fuzz::expect_only_qlft_errors([&] { sink += v.array_f(0) != 0; });
      }
      qlft_fuzz::expect_only_qlft_errors([&] { sink += g->get_int(key, 0); });
      qlft_fuzz::expect_only_qlft_errors([&] { sink += g->get_string(key, "").size(); });
    }
    for (const auto& t : g->tensors()) {
      if (t.nbytes) sink += t.data[0] + t.data[t.nbytes - 1];
    }
    qlft_fuzz::keep(sink);
  });
  return 0;
}
