// Tokenizer from GGUF metadata (llama.cpp's tokenizer.ggml.* keys).
#include <cmath>

#include "core/error.h"
#include "formats/gguf.h"
#include "tokenizer/regex_split.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace qlft {

namespace {
const GgufValue* array_key(const GgufFile& g, const char* key, bool strings, uint64_t min_count,
                           bool required) {
  const GgufValue* v = g.find(key);
  if (!v) {
    QLFT_CHECK_FORMAT(!required, "%s: tokenizer metadata key '%s' is missing", g.path().c_str(),
                      key);
    return nullptr;
  }
  QLFT_CHECK_FORMAT(v->type == GgufType::ARRAY, "%s: tokenizer key '%s' must be an array, not %s",
                    g.path().c_str(), key, gguf_type_name(v->type));
  if (strings) {
    QLFT_CHECK_FORMAT(v->elem_type == GgufType::STRING && v->strings.size() == v->count,
                      "%s: tokenizer key '%s' must be an array of strings, not of %s",
                      g.path().c_str(), key, gguf_type_name(v->elem_type));
  } else {
    QLFT_CHECK_FORMAT(v->elem_type != GgufType::STRING && v->elem_type != GgufType::ARRAY &&
                          v->array_data != nullptr,
                      "%s: tokenizer key '%s' must be a numeric array, not of %s", g.path().c_str(),
                      key, gguf_type_name(v->elem_type));
  }
  QLFT_CHECK_FORMAT(v->count >= min_count, "%s: tokenizer key '%s' has %llu entries, expected %llu",
                    g.path().c_str(), key, static_cast<unsigned long long>(v->count),
                    static_cast<unsigned long long>(min_count));
  return v;
}

// A token id from metadata; absent, or out of range (llama.cpp warns and keeps its default),
// or the 0xFFFFFFFF "none" marker -> def.
int32_t id_key(const GgufFile& g, const char* key, int32_t def, int64_t n) {
  const GgufValue* v = g.find(key);
  if (!v) return def;
  QLFT_CHECK_FORMAT(v->is_integer(), "%s: tokenizer key '%s' must be an integer token id, not %s",
                    g.path().c_str(), key, gguf_type_name(v->type));
  int64_t id = g.get_int(key);
  return id >= 0 && id < n ? static_cast<int32_t>(id) : def;
}
}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_gguf_file(const std::string& path) {
  auto g = GgufFile::open(path);
  return from_gguf(*g);
}

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& g) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  const char* path = g.path().c_str();
  const GgufValue* mv = g.find("tokenizer.ggml.model");
  QLFT_CHECK_FORMAT(mv, "%s: tokenizer metadata key 'tokenizer.ggml.model' is missing", path);
  QLFT_CHECK_FORMAT(mv->type == GgufType::STRING, "%s: 'tokenizer.ggml.model' must be a string",
                    path);
  const std::string model(mv->str);

  const GgufValue* tv = array_key(g, "tokenizer.ggml.tokens", true, 1, true);
  QLFT_CHECK_FORMAT(tv->count <= static_cast<uint64_t>(kMaxVocab),
                    "%s: 'tokenizer.ggml.tokens' has %llu entries; at most %lld are supported",
                    path, static_cast<unsigned long long>(tv->count),
                    static_cast<long long>(kMaxVocab));
  const int64_t n = static_cast<int64_t>(tv->count);
  const GgufValue* sv = array_key(g, "tokenizer.ggml.scores", false, n, false);
  const GgufValue* yv = array_key(g, "tokenizer.ggml.token_type", false, n, false);
  if (yv)
    QLFT_CHECK_FORMAT(yv->elem_type != GgufType::F32 && yv->elem_type != GgufType::F64 &&
                          yv->elem_type != GgufType::BOOL,
                      "%s: 'tokenizer.ggml.token_type' must hold integers", path);

  t->tokens_.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    Token& tk = t->tokens_[i];
    tk.text = std::string(tv->strings[i]);
    if (tk.text.empty()) tk.text = "[EMPTY_" + std::to_string(i) + "]";  // as llama.cpp
    if (sv) {
      double s = sv->array_f(i);
      QLFT_CHECK_FORMAT(std::isfinite(s), "%s: 'tokenizer.ggml.scores'[%lld] is not finite", path,
                        static_cast<long long>(i));
      tk.score = static_cast<float>(s);
    }
    if (yv) {
      int64_t ty = yv->array_i(i);
      tk.type = ty >= 1 && ty <= 6 ? static_cast<TokenType>(ty) : TokenType::Undefined;
    }
  }

  if (model == "llama") {
    // SentencePiece: space prefix "▁", merges by score, <0xNN> byte fallback.
    t->algo_ = Algo::SpmScores;
    t->byte_fallback_ = true;
    if (!yv)  // no types in the file: <0xNN> tokens are still byte tokens
      for (Token& tk : t->tokens_)
        if (tok::parse_byte_token(tk.text) >= 0) tk.type = TokenType::Byte;
    t->space_char_ = "\xe2\x96\x81";
    t->decode_space_ = t->space_char_;
    bool add_space = g.get_bool("tokenizer.ggml.add_space_prefix", true);
    t->prefix_ = add_space ? Prefix::Always : Prefix::None;
    t->prefix_text_ = " ";
    t->strip_leading_space_ = add_space;
    QLFT_CHECK_FORMAT(!g.get_bool("tokenizer.ggml.remove_extra_whitespaces", false),
                      "%s: 'tokenizer.ggml.remove_extra_whitespaces' = true is not supported",
                      path);
    t->bos_ = id_key(g, "tokenizer.ggml.bos_token_id", 1, n);
    t->eos_ = id_key(g, "tokenizer.ggml.eos_token_id", 2, n);
    t->unk_ = id_key(g, "tokenizer.ggml.unknown_token_id", 0, n);
    t->add_bos_ = g.get_bool("tokenizer.ggml.add_bos_token", true);  // llama.cpp's SPM default
  } else if (model == "gpt2") {
    t->algo_ = Algo::Bpe;
    t->byte_level_ = true;
    const GgufValue* merges = array_key(g, "tokenizer.ggml.merges", true, 0, true);
    t->merges_.reserve(merges->count);
    for (uint64_t i = 0; i < merges->count; ++i) {
      std::string_view m = merges->strings[i];
      // "left right"; the left part is never empty, so the separator is searched from 1.
      size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;
      QLFT_CHECK_FORMAT(sp != std::string_view::npos && sp + 1 < m.size(),
                        "%s: 'tokenizer.ggml.merges'[%llu] is not \"left right\"", path,
                        static_cast<unsigned long long>(i));
      t->merges_.emplace_back(std::string(m.substr(0, sp)), std::string(m.substr(sp + 1)));
    }
    std::string pre = g.get_string("tokenizer.ggml.pre", "default");
    std::vector<std::string> rx;
    bool ignore = false, bos_default = false;
    if (!tok::gguf_pre_regexes(pre, rx, ignore, bos_default))
      throw_error(QLFT_ERR_UNSUPPORTED,
                  "%s: pre-tokenizer 'tokenizer.ggml.pre' = '%s' is not "
                  "supported",
                  path, pre.c_str());
    t->ignore_merges_ = ignore;
    for (const auto& r : rx)
      t->pre_.push_back({std::make_shared<tok::SplitRegex>(r, "tokenizer.ggml.pre=" + pre), false});
    t->bos_ = id_key(g, "tokenizer.ggml.bos_token_id", -1, n);
    t->eos_ = id_key(g, "tokenizer.ggml.eos_token_id", -1, n);
    t->unk_ = id_key(g, "tokenizer.ggml.unknown_token_id", -1, n);
    t->add_bos_ = g.get_bool("tokenizer.ggml.add_bos_token", bos_default);
  } else {
    throw_error(QLFT_ERR_UNSUPPORTED,
                "%s: tokenizer model 'tokenizer.ggml.model' = '%s' is not "
                "supported (llama, gpt2)",
                path, model.c_str());
  }
  t->pad_ = id_key(g, "tokenizer.ggml.padding_token_id", -1, n);
  // llama.cpp's default for both SPM and BPE vocabularies.
  t->add_eos_ = g.get_bool("tokenizer.ggml.add_eos_token", false);
  t->finalize();
  return t;
}

}  // namespace qlft
