// qlft::Tokenizer behind the pipeline's TextEncoder interface.
#pragma once

#include <string>

#include "data/text_encoder.h"

namespace qlft {
class Tokenizer;
}

namespace qlft::data {

class TokenizerEncoder final : public TextEncoder {
 public:
  // tok must outlive this object. chat_template: the model's Jinja template (GGUF
  // tokenizer.chat_template or tokenizer_config.json's chat_template), "" when it has none.
  explicit TokenizerEncoder(const Tokenizer& tok, std::string chat_template = {});

  // continuation is not honoured: qlft::Tokenizer treats every call as the start of a text
  // (SentencePiece vocabularies get their "▁" prefix). The pipeline avoids relying on it by
  // tokenizing whole rendered texts through encode_offsets().
  void encode(std::string_view text, bool parse_special, bool continuation,
              std::vector<int32_t>& out) const override;
  bool encode_offsets(std::string_view text, std::vector<int32_t>& ids,
                      std::vector<uint32_t>& starts, std::vector<uint8_t>& special) const override;
  int32_t vocab_size() const override;
  int32_t bos_id() const override;
  int32_t eos_id() const override;
  std::string bos_text() const override;
  std::string eos_text() const override;
  bool wants_bos() const override;
  std::string chat_template() const override { return chat_template_; }
  int32_t pad_id() const override;

 private:
  const Tokenizer& tok_;
  std::string chat_template_;
};

}  // namespace qlft::data
