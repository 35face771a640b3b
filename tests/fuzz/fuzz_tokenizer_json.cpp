// Hugging Face tokenizer.json (+ tokenizer_config.json) text; a tokenizer that loads must then
// encode and decode a fixed sentence without failing in any way but qlft::Error.
#include "fuzz_common.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parts = qlft_fuzz::split_parts(data, size, 2);
  qlft_fuzz::expect_only_qlft_errors([&] {
    auto tok = qlft::Tokenizer::from_hf_json_text(std::string(parts[0]), std::string(parts[1]),
                                                  "fuzz/tokenizer.json");
    std::vector<int32_t> ids =
        tok->encode("Hello world! <s> caf\xc3\xa9 \xff\xfe 123  x", true, true, true);
    for (int32_t id : ids) {
      if (id < 0 || id >= tok->vocab_size()) std::abort();  // encode must give valid ids
    }
    size_t sink = tok->decode(ids, true).size() + tok->decode(ids, false).size();
    qlft_fuzz::keep(sink);
  });
  return 0;
}
