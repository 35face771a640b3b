// UTF-8 helpers for the tokenizers: sequence lengths that never run past the buffer, a
// validity scan for streaming, and the GPT-2 byte <-> printable-character table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace qlft::tok {

// Length of the UTF-8 sequence a lead byte announces (1 for continuation/invalid bytes, as
// llama.cpp does, so every byte lands in exactly one symbol), clamped to `avail`.
inline size_t utf8_seq_len(uint8_t lead, size_t avail) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  size_t n = kLen[lead >> 4];
  return n < avail ? n : avail;
}

// Length of the character at s[0..n) for splitting text into symbols: the sequence length when
// it is valid UTF-8, else 1, so an invalid byte never swallows the valid characters after it.
int utf8_valid_prefix(const uint8_t* s, size_t n);
inline size_t utf8_char_len(const char* s, size_t n) {
  int len = utf8_valid_prefix(reinterpret_cast<const uint8_t*>(s), n);
  return len > 0 ? static_cast<size_t>(len) : 1;
}

// Length of the complete, valid UTF-8 sequence at s[0..n), 0 if s starts with an incomplete but
// so-far valid sequence (more bytes could complete it), -1 if the first byte(s) are invalid.
int utf8_valid_prefix(const uint8_t* s, size_t n);

// Appends the UTF-8 encoding of code point cp.
void utf8_append(std::string& out, uint32_t cp);

// Decodes the code point at s (valid UTF-8 assumed, as produced by our own tables); advances i.
uint32_t utf8_next(std::string_view s, size_t& i);

// GPT-2's reversible byte -> code point map (printable bytes map to themselves, the rest to
// U+0100 + k), and its inverse (-1 for code points that are not in the table).
uint32_t byte_to_cp(uint8_t b);
int cp_to_byte(uint32_t cp);

// "<0xAB>" -> 0xAB, -1 if the text is not of that form.
int parse_byte_token(std::string_view text);

}  // namespace qlft::tok
