// The one thing the dataset pipeline needs from a tokenizer. Keeping it this small lets the data
// code and its tests run on a trivial byte-level encoder, and any tokenizer plug in through an
// adapter (see tokenizer_encoder.h for qlft::Tokenizer).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qlft::data {

class TextEncoder {
 public:
  virtual ~TextEncoder() = default;

  // Appends the ids of text to out; never adds BOS/EOS. parse_special: special-token spellings in
  // the text become their ids (used for template scaffolding, never for user content).
  // continuation: the text directly follows earlier text of the same document, so no
  // start-of-text treatment (e.g. SentencePiece's dummy "▁" prefix) applies.
  virtual void encode(std::string_view text, bool parse_special, bool continuation,
                      std::vector<int32_t>& out) const = 0;

  // Tokenizes text as one piece with special tokens parsed, and gives each token's first byte in
  // text (starts.size() == ids.size()) and whether it is a special token. Returns false when this
  // encoder cannot tell where its tokens start; the caller then tokenizes segment by segment.
  virtual bool encode_offsets(std::string_view text, std::vector<int32_t>& ids,
                              std::vector<uint32_t>& starts, std::vector<uint8_t>& special) const {
    (void)text, (void)ids, (void)starts, (void)special;
    return false;
  }

  virtual int32_t vocab_size() const = 0;
  // -1 when the vocabulary has none.
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  // How the BOS/EOS tokens are spelled in text (what chat templates call bos_token/eos_token).
  virtual std::string bos_text() const = 0;
  virtual std::string eos_text() const = 0;
  // Whether plain text documents start with BOS (the model's add_bos_token).
  virtual bool wants_bos() const { return bos_id() >= 0; }
  // The model's Jinja chat template (GGUF tokenizer.chat_template or tokenizer_config.json), or "".
  virtual std::string chat_template() const { return {}; }
  // The id to put in padded token slots (their targets are always ignored).
  virtual int32_t pad_id() const { return eos_id() >= 0 ? eos_id() : 0; }

 protected:
  // encode_offsets by walking the tokens along the text: ids = text encoded whole with special
  // tokens parsed; each token starts where the previous one's span ended, its flag is
  // is_special(id), and span(id, pos) is the number of bytes of text it covers from pos, or npos
  // where it does not line up with the text there (the offsets are then unknown: false). True
  // when the spans cover the text exactly.
  template <class IsSpecial, class Span>
  bool walk_offsets(std::string_view text, std::vector<int32_t>& ids, std::vector<uint32_t>& starts,
                    std::vector<uint8_t>& special, IsSpecial is_special, Span span) const {
    ids.clear();
    starts.clear();
    special.clear();
    encode(text, true, false, ids);
    size_t pos = 0;
    for (int32_t id : ids) {
      starts.push_back(static_cast<uint32_t>(pos));
      special.push_back(is_special(id));
      const size_t n = span(id, pos);
      if (n == std::string_view::npos) return false;
      pos += n;
    }
    return pos == text.size();
  }
};

// Bytes are ids 0..255; each listed special string gets id 256 + its index. The first special
// is BOS and the second EOS. For tests and for byte-level models.
class ByteEncoder final : public TextEncoder {
 public:
  explicit ByteEncoder(std::vector<std::string> specials = {"<s>", "</s>"},
                       std::string chat_template = {});

  void encode(std::string_view text, bool parse_special, bool continuation,
              std::vector<int32_t>& out) const override;
  bool encode_offsets(std::string_view text, std::vector<int32_t>& ids,
                      std::vector<uint32_t>& starts, std::vector<uint8_t>& special) const override;
  int32_t vocab_size() const override { return 256 + static_cast<int32_t>(specials_.size()); }
  int32_t bos_id() const override { return specials_.size() > 0 ? 256 : -1; }
  int32_t eos_id() const override { return specials_.size() > 1 ? 257 : -1; }
  std::string bos_text() const override { return specials_.size() > 0 ? specials_[0] : ""; }
  std::string eos_text() const override { return specials_.size() > 1 ? specials_[1] : ""; }
  std::string chat_template() const override { return chat_template_; }
  // id of a special spelling, -1 if none
  int32_t special_id(std::string_view s) const;
  // Bytes for ids < 256, the special's spelling otherwise.
  std::string decode(const int32_t* ids, size_t n) const;

 private:
  std::vector<std::string> specials_;
  std::string chat_template_;
};

}  // namespace qlft::data
