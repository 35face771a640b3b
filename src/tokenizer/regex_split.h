// Pre-tokenizer regexes through PCRE2 (UTF + UCP so \p{L}, \p{N}, \s are Unicode-aware;
// JIT-compiled). A split is "isolated": matches and the text between them both become pieces,
// as Hugging Face's Split(behavior="isolated") and llama.cpp's unicode_regex_split do.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace qlft::tok {

class SplitRegex {
 public:
  // Throws QLFT_ERR_FORMAT (naming `what` and PCRE2's message) if the pattern does not compile.
  SplitRegex(const std::string& pattern, const std::string& what);
  ~SplitRegex();
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;

  const std::string& pattern() const { return pattern_; }

  // Calls emit(piece) for every non-empty piece of text, in order. Invalid UTF-8 in text is
  // allowed: such bytes never match and end up in the pieces between matches.
  template <class F>
  void split(std::string_view text, F&& emit) const {
    size_t pos = 0, start = 0, ms = 0, me = 0;
    while (pos < text.size() && next_match(text, pos, ms, me)) {
      if (ms > start) emit(text.substr(start, ms - start));
      if (me > ms) emit(text.substr(ms, me - ms));
      start = me;
      pos = me > ms ? me : me + 1;  // an empty match must not stall the scan
      // Stay on a code point boundary when stepping past an empty match.
      while (pos < text.size() && (static_cast<uint8_t>(text[pos]) & 0xC0) == 0x80) ++pos;
    }
    if (start < text.size()) emit(text.substr(start));
  }

 private:
  // First match at or after pos; false if none.
  bool next_match(std::string_view text, size_t pos, size_t& ms, size_t& me) const;

  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
};

// The pre-tokenizer regex list llama.cpp uses for a `tokenizer.ggml.pre` name (applied in
// sequence: each regex splits the pieces the previous one produced); false if the name is
// unknown. ignore_merges: set for the Llama-3 family, as llama.cpp does. add_bos: llama.cpp's
// default for tokenizer.ggml.add_bos_token when the file does not say (true for the Llama-3
// family, false for the other byte-level vocabularies).
bool gguf_pre_regexes(const std::string& pre, std::vector<std::string>& out, bool& ignore_merges,
                      bool& add_bos);

// GPT-2's pattern (Hugging Face ByteLevel pre-tokenizer with use_regex=true).
extern const char* const kGpt2Pattern;

}  // namespace qlft::tok
