#include "data/tokenizer_encoder.h"

#include <cstring>

#include "tokenizer/tokenizer.h"

namespace qlft::data {

TokenizerEncoder::TokenizerEncoder(const Tokenizer& tok, std::string chat_template)
    : tok_(tok), chat_template_(std::move(chat_template)) {}

void TokenizerEncoder::encode(std::string_view text, bool parse_special, bool,
                              std::vector<int32_t>& out) const {
  tok_.encode_append(text, parse_special, out);
}

bool TokenizerEncoder::encode_offsets(std::string_view text, std::vector<int32_t>& ids,
                                      std::vector<uint32_t>& starts,
                                      std::vector<uint8_t>& special) const {
  // A token's piece may carry one space the text does not have: the prefix SentencePiece-style
  // vocabularies put before each run of text between special tokens. Anything else that does
  // not line up (an unknown token, a normalizer that rewrites text) makes the offsets unknowable.
  auto is_special = [&](int32_t id) { return tok_.is_special(id); };
  return walk_offsets(text, ids, starts, special, is_special, [&](int32_t id, size_t pos) {
    std::string piece = is_special(id) ? std::string(tok_.token_text(id)) : tok_.token_to_piece(id);
    auto matches = [&](const char* p, size_t n) {
      return n <= text.size() - pos && std::memcmp(text.data() + pos, p, n) == 0;
    };
    if (matches(piece.data(), piece.size())) return piece.size();
    if (!piece.empty() && piece[0] == ' ' && matches(piece.data() + 1, piece.size() - 1))
      return piece.size() - 1;
    return std::string_view::npos;
  });
}

int32_t TokenizerEncoder::vocab_size() const {
  return tok_.vocab_size();
}
int32_t TokenizerEncoder::bos_id() const {
  return tok_.bos_id();
}
int32_t TokenizerEncoder::eos_id() const {
  return tok_.eos_id();
}
std::string TokenizerEncoder::bos_text() const {
  return tok_.bos_id() >= 0 ? std::string(tok_.token_text(tok_.bos_id())) : std::string();
}
std::string TokenizerEncoder::eos_text() const {
  return tok_.eos_id() >= 0 ? std::string(tok_.token_text(tok_.eos_id())) : std::string();
}
bool TokenizerEncoder::wants_bos() const {
  return tok_.wants_bos() && tok_.bos_id() >= 0;
}
int32_t TokenizerEncoder::pad_id() const {
  if (tok_.pad_id() >= 0) return tok_.pad_id();
  return tok_.eos_id() >= 0 ? tok_.eos_id() : 0;
}

}  // namespace qlft::data
