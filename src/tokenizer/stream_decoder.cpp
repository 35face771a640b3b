#include "tokenizer/stream_decoder.h"

#include "tokenizer/utf8.h"

namespace qlft {

namespace {
const char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD
}

std::string StreamDecoder::push(int32_t id) {
  if (skip_special_ && tok_.is_special(id)) {
    tok_.token_to_piece(id);  // still validates the id
    return std::string();
  }
  std::string piece = tok_.token_to_piece(id);
  // The first piece loses the space prefix the encoder added, exactly as decode() does.
  if (!started_ && tok_.strips_leading_space() && !piece.empty() && piece[0] == ' ')
    piece.erase(0, 1);
  started_ = true;
  pending_ += piece;
  return drain(false);
}

std::string StreamDecoder::flush() {
  std::string out = drain(true);
  started_ = false;
  return out;
}

std::string StreamDecoder::drain(bool final) {
  std::string out;
  const auto* p = reinterpret_cast<const uint8_t*>(pending_.data());
  size_t i = 0, n = pending_.size();
  while (i < n) {
    int len = tok::utf8_valid_prefix(p + i, n - i);
    if (len > 0) {
      out.append(pending_, i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
    } else if (len < 0) {
      out += kReplacement;  // one replacement per invalid byte
      ++i;
    } else if (final) {
      out += kReplacement;  // a sequence that never got completed
      i = n;
    } else {
      break;  // hold the unfinished tail
    }
  }
  pending_.erase(0, i);
  return out;
}

}  // namespace qlft
