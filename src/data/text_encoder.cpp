#include "data/text_encoder.h"

#include "core/error.h"

namespace qlft::data {

ByteEncoder::ByteEncoder(std::vector<std::string> specials, std::string chat_template)
    : specials_(std::move(specials)), chat_template_(std::move(chat_template)) {
  for (const auto& s : specials_) QLFT_CHECK_ARG(!s.empty(), "ByteEncoder: empty special token");
}

void ByteEncoder::encode(std::string_view text, bool parse_special, bool,
                         std::vector<int32_t>& out) const {
  size_t i = 0;
  while (i < text.size()) {
    if (parse_special) {
      // Longest special spelled at i wins.
      int32_t best = -1;
      size_t best_len = 0;
      for (size_t k = 0; k < specials_.size(); ++k) {
        const std::string& s = specials_[k];
        if (s.size() > best_len && text.compare(i, s.size(), s) == 0) {
          best = 256 + static_cast<int32_t>(k);
          best_len = s.size();
        }
      }
      if (best >= 0) {
        out.push_back(best);
        i += best_len;
        continue;
      }
    }
    out.push_back(static_cast<unsigned char>(text[i]));
    ++i;
  }
}

bool ByteEncoder::encode_offsets(std::string_view text, std::vector<int32_t>& ids,
                                 std::vector<uint32_t>& starts,
                                 std::vector<uint8_t>& special) const {
  // Every byte and special spelling is a token of its own: the spans always line up.
  return walk_offsets(
      text, ids, starts, special, [](int32_t id) { return id >= 256; },
      [&](int32_t id, size_t) {
        return id < 256 ? size_t(1) : specials_[static_cast<size_t>(id - 256)].size();
      });
}

int32_t ByteEncoder::special_id(std::string_view s) const {
  for (size_t k = 0; k < specials_.size(); ++k)
    if (specials_[k] == s) return 256 + static_cast<int32_t>(k);
  return -1;
}

std::string ByteEncoder::decode(const int32_t* ids, size_t n) const {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    int32_t id = ids[i];
    QLFT_CHECK_ARG(id >= 0 && id < vocab_size(), "ByteEncoder: id %d out of range", id);
    if (id < 256)
      out.push_back(static_cast<char>(id));
    else
      out += specials_[static_cast<size_t>(id - 256)];
  }
  return out;
}

}  // namespace qlft::data
