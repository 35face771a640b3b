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

bool gguf_pre_regexes(const std::string& pre, std::vector<std::string>& out, bool& ignore_merges) {
  out.clear();
  ignore_merges = false;
  if (pre == "default") {
    out = {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2NoTail, R"(\p{N}+)", "[0-9][0-9][0-9]"};
  } else if (pre == "gpt-2" || pre == "gpt2" || pre == "mpt" || pre == "olmo" || pre == "jais") {
    out = {kGpt2NoTail};
  } else if (pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe" || pre == "falcon3" ||
             pre == "pixtral") {
    out = {kLlama3};
    ignore_merges = true;
  } else if (pre == "smaug-bpe" || pre == "dbrx") {
    out = {kLlama3};
  } else if (pre == "qwen2" || pre == "deepseek-r1-qwen" || pre == "megrez") {
    out = {kQwen2};
  } else if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "command-r" ||
             pre == "codeshell" || pre == "exaone" || pre == "minerva") {
    out = {R"(\p{N})", kGpt2NoTail};
  } else {
    return false;
  }
  return true;
}

}  // namespace qlft::tok
