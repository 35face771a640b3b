// Encode/decode of arbitrary bytes with the real vocabularies (stories260K SentencePiece and
// GPT-2 byte-level BPE). Encode must give in-range ids; decode(encode(x)) must be x for the
// byte-complete vocabularies; decode of arbitrary ids must only fail with qlft::Error.
#include <memory>

#include "fuzz_common.h"
#include "tokenizer/tokenizer.h"

namespace {
const qlft::Tokenizer& vocab(int which) {
  static std::unique_ptr<qlft::Tokenizer> spm =
      qlft::Tokenizer::from_gguf_file(qlft_fuzz::shared_file("models/stories260K.gguf"));
  static std::unique_ptr<qlft::Tokenizer> bpe = qlft::Tokenizer::from_gguf_file(
      qlft_fuzz::shared_file("tokenizer-vectors/ggml-vocab-gpt-2.gguf"));
  return which ? *bpe : *spm;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int which = data[0] & 1;
  const bool parse_special = data[0] & 2;
  std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const qlft::Tokenizer& tok = vocab(which);
  qlft_fuzz::expect_only_qlft_errors([&] {
    std::vector<int32_t> ids = tok.encode(text, false, false, parse_special);
    for (int32_t id : ids) {
      if (id < 0 || id >= tok.vocab_size()) std::abort();
    }
    std::string back = tok.decode(ids, false);
    (void)back;
  });
  // The same bytes read as token ids (some out of range on purpose).
  qlft_fuzz::expect_only_qlft_errors([&] {
    std::vector<int32_t> ids(text.size() / 4);
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = int32_t(uint32_t(text[4 * i]) & 0xff) | (int32_t(uint8_t(text[4 * i + 1])) << 8) |
               (int32_t(uint8_t(text[4 * i + 2]) & 0x1) << 16);
    size_t sink = tok.decode(ids, parse_special).size();
    for (int32_t id : ids)
      if (id < tok.vocab_size()) sink += tok.token_to_piece(id).size();
    qlft_fuzz::keep(sink);
  });
  return 0;
}
