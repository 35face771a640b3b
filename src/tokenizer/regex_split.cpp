#include "tokenizer/regex_split.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"

namespace qlft::tok {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {
// llama.cpp's lists; the Llama-3 and Qwen2 ones are the tokenizer.json originals (PCRE2 has the
// case-insensitive group llama.cpp had to spell out).
const char* const kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kGpt2NoTail =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";

// DeepSeek's lists (llama.cpp runs them in sequence, each splitting the previous one's pieces).
// CJK: U+4E00-U+9FA5, U+0800-U+4E00 and Hangul U+AC00-U+D7FF.
const char* const kDeepseekCjk = R"([\x{4e00}-\x{9fa5}\x{800}-\x{4e00}\x{ac00}-\x{d7ff}]+)";
// deepseek-llm: ASCII letters and the cased letters of other scripts (not CJK), then ASCII and
// full-width punctuation, each with one optional leading whitespace.
const char* const kDeepseekLlmLetters =
    R"(\s?[A-Za-z\x{b5}\x{c0}-\x{d6}\x{d8}-\x{f6}\x{f8}-\x{1ba}\x{1bc}-\x{1bf}\x{1c4}-\x{293})"
    R"(\x{295}-\x{2af}\x{370}-\x{373}\x{376}\x{377}\x{37b}-\x{37d}\x{37f}\x{386}\x{388}-\x{38a})"
    R"(\x{38c}\x{38e}-\x{3a1}\x{3a3}-\x{3f5}\x{3f7}-\x{481}\x{48a}-\x{52f}\x{531}-\x{556})"
    R"(\x{10a0}-\x{10c5}\x{13a0}-\x{13f5}\x{13f8}-\x{13fd}\x{1c90}-\x{1cba}\x{1cbd}-\x{1cbf})"
    R"(\x{1d00}-\x{1d2b}\x{1d6b}-\x{1d77}\x{1d79}-\x{1d9a}\x{1e00}-\x{1f15}\x{1f18}-\x{1f1d})"
    R"(\x{1f20}-\x{1f45}\x{1f48}-\x{1f4d}\x{1f50}-\x{1f57}\x{1f59}\x{1f5b}\x{1f5d}\x{1f5f}-\x{1f7d})"
    R"(\x{1f80}-\x{1fb4}\x{1fb6}-\x{1fbc}\x{1fbe}\x{1fc2}-\x{1fc4}\x{1fc6}-\x{1fcc}\x{1fd0}-\x{1fd3})"
    R"(\x{1fd6}-\x{1fdb}\x{1fe0}-\x{1fec}\x{1ff2}-\x{1ff4}\x{1ff6}-\x{1ffc}\x{2102}\x{2107})"
    R"(\x{210a}-\x{2113}\x{2115}\x{2119}-\x{211d}\x{2124}\x{2126}\x{2128}\x{212a}-\x{212d})"
    R"(\x{212f}-\x{2134}\x{2139}\x{213c}-\x{213f}\x{2145}-\x{2149}\x{214e}\x{2183}\x{2184})"
    R"(\x{2c00}-\x{2c7b}\x{2c7e}-\x{2ce4}\x{2ceb}-\x{2cee}\x{2cf2}\x{2cf3}\x{a640}-\x{a66d})"
    R"(\x{a680}-\x{a69b}\x{a722}-\x{a76f}\x{a771}-\x{a787}\x{a78b}-\x{a78e}\x{ab70}-\x{abbf})"
    R"(\x{fb00}-\x{fb06}\x{fb13}-\x{fb17}\x{ff21}-\x{ff3a}\x{ff41}-\x{ff5a}\x{10400}-\x{1044f})"
    R"(\x{104b0}-\x{104d3}\x{104d8}-\x{104fb}\x{10c80}-\x{10cb2}\x{10cc0}-\x{10cf2})"
    R"(\x{118a0}-\x{118df}\x{1e900}-\x{1e943}]+)";
const char* const kDeepseekLlmPunct =
    R"(\s?[!-/:-~\x{ff01}-\x{ff0f}\x{ff1a}-\x{ff5e}\x{2018}-\x{201f}\x{3000}-\x{3002}]+)";
// deepseek-v3: digits in threes, Han and kana runs, then the words pattern.
const char* const kDeepseekV3Cjk = R"([\x{4e00}-\x{9fa5}\x{3040}-\x{309f}\x{30a0}-\x{30ff}]+)";
const char* const kDeepseekV3Words =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+)"
    R"(| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Per-thread match state: match data, and a JIT stack larger than PCRE2's 32 KiB default so that
// long runs (a megabyte of spaces) cannot hit the JIT stack limit.
struct MatchState {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mc = nullptr;
  pcre2_jit_stack* js = nullptr;
  MatchState() {
    md = pcre2_match_data_create(4, nullptr);
    mc = pcre2_match_context_create(nullptr);
    js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (!md || !mc) throw std::bad_alloc();
    if (js) pcre2_jit_stack_assign(mc, nullptr, js);
  }
  ~MatchState() {
    pcre2_jit_stack_free(js);
    pcre2_match_context_free(mc);
    pcre2_match_data_free(md);
  }
};
MatchState& match_state() {
  thread_local MatchState st;
  return st;
}
}  // namespace

SplitRegex::SplitRegex(const std::string& pattern, const std::string& what) : pattern_(pattern) {
  int err = 0;
  PCRE2_SIZE off = 0;
  auto* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                             PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    throw_error(QLFT_ERR_FORMAT, "%s: pre-tokenizer regex does not compile at offset %zu: %s",
                what.c_str(), static_cast<size_t>(off), reinterpret_cast<char*>(msg));
  }
  // JIT is an optimization: if unavailable, matching falls back to the interpreter.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_ = code;
}

SplitRegex::~SplitRegex() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

bool SplitRegex::next_match(std::string_view text, size_t pos, size_t& ms, size_t& me) const {
  MatchState& st = match_state();
  pcre2_match_data* md = st.md;
  int rc = pcre2_match(static_cast<pcre2_code*>(code_), reinterpret_cast<PCRE2_SPTR>(text.data()),
                       text.size(), pos, 0, md, st.mc);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof(msg));
    throw_error(QLFT_ERR_INTERNAL, "pre-tokenizer regex match failed: %s",
                reinterpret_cast<char*>(msg));
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
  ms = ov[0];
  me = ov[1];
  return true;
}

bool gguf_pre_regexes(const std::string& pre, std::vector<std::string>& out, bool& ignore_merges,
                      bool& add_bos) {
  out.clear();
  ignore_merges = false;
  add_bos = false;
  if (pre == "default") {
    out = {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2NoTail, R"(\p{N}+)", "[0-9][0-9][0-9]"};
  } else if (pre == "gpt-2" || pre == "gpt2" || pre == "mpt" || pre == "olmo" || pre == "jais") {
    out = {kGpt2NoTail};
  } else if (pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe" || pre == "falcon3" ||
             pre == "pixtral") {
    out = {kLlama3};
    ignore_merges = true;
    add_bos = true;
  } else if (pre == "smaug-bpe" || pre == "dbrx") {
    out = {kLlama3};
  } else if (pre == "qwen2" || pre == "deepseek-r1-qwen" || pre == "megrez") {
    out = {kQwen2};
  } else if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "command-r" ||
             pre == "codeshell" || pre == "exaone" || pre == "minerva") {
    out = {R"(\p{N})", kGpt2NoTail};
  } else if (pre == "falcon") {
    out = {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2NoTail, "[0-9][0-9][0-9]"};
  } else if (pre == "deepseek-coder") {
    out = {"[\r\n]", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepseekCjk, R"(\p{N})"};
  } else if (pre == "deepseek-llm") {
    // "\s+$" in llama.cpp (std::regex: $ is the end of the piece only, as \z is in PCRE2).
    out = {"[\r\n]", kDeepseekLlmLetters, kDeepseekLlmPunct, R"(\s+\z)", kDeepseekCjk, R"(\p{N}+)"};
  } else if (pre == "deepseek-v3") {
    out = {R"(\p{N}{1,3})", kDeepseekV3Cjk, kDeepseekV3Words};
  } else {
    return false;
  }
  return true;
}

}  // namespace qlft::tok
