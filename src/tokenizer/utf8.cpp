#include "tokenizer/utf8.h"

#include <array>

namespace qlft::tok {

int utf8_valid_prefix(const uint8_t* s, size_t n) {
  if (n == 0) return 0;
  uint8_t b = s[0];
  if (b < 0x80) return 1;
  size_t len;
  uint32_t cp;
  if (b >= 0xC2 && b <= 0xDF) {
    len = 2, cp = b & 0x1F;
  } else if (b >= 0xE0 && b <= 0xEF) {
    len = 3, cp = b & 0x0F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    len = 4, cp = b & 0x07;
  } else {
    return -1;  // continuation byte, overlong lead C0/C1, or F5..FF
  }
  for (size_t k = 1; k < len; ++k) {
    if (k >= n) return 0;  // could still be completed
    if ((s[k] & 0xC0) != 0x80) return -1;
    cp = (cp << 6) | (s[k] & 0x3F);
    // Reject overlongs and surrogates / > U+10FFFF as soon as the second byte tells.
    if (k == 1) {
      if (len == 3 && b == 0xE0 && s[1] < 0xA0) return -1;
      if (len == 3 && b == 0xED && s[1] >= 0xA0) return -1;
      if (len == 4 && b == 0xF0 && s[1] < 0x90) return -1;
      if (len == 4 && b == 0xF4 && s[1] >= 0x90) return -1;
    }
  }
  return static_cast<int>(len);
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint32_t utf8_next(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t n = utf8_seq_len(p[i], s.size() - i);
  uint32_t cp = n == 1 ? p[i] : (n == 2 ? p[i] & 0x1F : (n == 3 ? p[i] & 0x0F : p[i] & 0x07));
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (p[i + k] & 0x3F);
  i += n;
  return cp;
}

namespace {
struct ByteTables {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 324> from_cp{};  // code points used are < 0x100 + 68
  ByteTables() {
    from_cp.fill(-1);
    uint32_t extra = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_cp[b] = printable ? static_cast<uint32_t>(b) : 0x100 + extra++;
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteTables& tables() {
  static const ByteTables t;
  return t;
}
}  // namespace

uint32_t byte_to_cp(uint8_t b) {
  return tables().to_cp[b];
}
int cp_to_byte(uint32_t cp) {
  return cp < tables().from_cp.size() ? tables().from_cp[cp] : -1;
}

int parse_byte_token(std::string_view t) {
  if (t.size() != 6 || t[0] != '<' || t[1] != '0' || t[2] != 'x' || t[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

}  // namespace qlft::tok
