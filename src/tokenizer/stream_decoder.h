// Incremental detokenization for generation: feed ids one at a time and get text back only as
// complete UTF-8 characters. Bytes that start a multi-byte character are held until it is
// complete; bytes that can never form valid UTF-8 come out as U+FFFD, so everything returned is
// valid UTF-8. The concatenation of all outputs (plus flush()) equals decode() of the same ids
// whenever decode() produced valid UTF-8.
#pragma once

#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace qlft {

class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = true)
      : tok_(tok), skip_special_(skip_special) {}

  // Appends the token's bytes and returns the newly completed text (possibly empty).
  std::string push(int32_t id);
  // Returns what is still held back (an unfinished sequence, as U+FFFD) and resets.
  std::string flush();
  // Bytes currently held back.
  size_t pending() const { return pending_.size(); }

 private:
  std::string drain(bool final);

  const Tokenizer& tok_;
  bool skip_special_;
  bool started_ = false;
  std::string pending_;
};

}  // namespace qlft
