// Tokenizer from a Hugging Face tokenizer.json: model BPE (byte-level with a ByteLevel
// pre-tokenizer, or SentencePiece-style with a Prepend/Replace "▁" normalizer or Metaspace and
// byte_fallback), Split/Digits/ByteLevel/Metaspace pre-tokenizers, and added tokens.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>

#include "core/error.h"
#include "formats/json_file.h"
#include "formats/mapped_file.h"
#include "tokenizer/regex_split.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace qlft {

namespace {
using json = nlohmann::json;
const char kSpace[] = "\xe2\x96\x81";

const json* member(const json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

std::string str_member(const json& j, const char* key, const std::string& what,
                       const std::string& def = std::string()) {
  const json* v = member(j, key);
  if (!v) return def;
  QLFT_CHECK_FORMAT(v->is_string(), "%s: '%s' must be a string", what.c_str(), key);
  return v->get<std::string>();
}

bool bool_member(const json& j, const char* key, const std::string& what, bool def) {
  const json* v = member(j, key);
  if (!v) return def;
  QLFT_CHECK_FORMAT(v->is_boolean(), "%s: '%s' must be true or false", what.c_str(), key);
  return v->get<bool>();
}

// A special token named in tokenizer_config.json: a string or {"content": ...}.
std::string config_token(const json& cfg, const char* key) {
  const json* v = member(cfg, key);
  if (!v) return std::string();
  if (v->is_string()) return v->get<std::string>();
  if (v->is_object() && v->contains("content") && (*v)["content"].is_string())
    return (*v)["content"].get<std::string>();
  return std::string();
}

// Calls f(node, type) on each stage of root's section `kind` (normalizer, pre_tokenizer or
// decoder), in order: the members of a "Sequence" (its list_key array, walked recursively), any
// other node itself. f returns false for a type it does not know. Where `strict` (the stages
// change the tokens), such a type and a Sequence without its list are refused; else they are
// passed over.
void for_each_stage(const json& root, const char* kind, const char* list_key,
                    const std::string& what, bool strict,
                    const std::function<bool(const json&, const std::string&)>& f) {
  std::function<void(const json&)> walk = [&](const json& node) {
    const std::string ty = str_member(node, "type", what + " " + kind);
    if (ty != "Sequence") {
      if (!f(node, ty) && strict)
        throw_error(QLFT_ERR_UNSUPPORTED, "%s: %s '%s' is not supported", what.c_str(), kind,
                    ty.c_str());
      return;
    }
    const json* list = member(node, list_key);
    if (!list || !list->is_array()) {
      QLFT_CHECK_FORMAT(!strict, "%s: %s Sequence needs '%s'", what.c_str(), kind, list_key);
      return;
    }
    for (const json& x : *list) walk(x);
  };
  if (const json* n = member(root, kind)) walk(*n);
}
}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_hf_json_file(const std::string& path) {
  std::string text = read_text_file(path);
  std::string cfg;
  auto cfg_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::exists(cfg_path, ec)) cfg = read_text_file(cfg_path.string());
  return from_hf_json_text(text, cfg, path);
}

std::unique_ptr<Tokenizer> Tokenizer::from_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec)) {
    fs::path j = p / "tokenizer.json";
    QLFT_CHECK_FORMAT(fs::exists(j, ec), "%s: no tokenizer.json in this directory", path.c_str());
    return from_hf_json_file(j.string());
  }
  // The loader names a missing or unreadable file; a GGUF file is known by its magic.
  char magic[4] = {0};
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    size_t n = std::fread(magic, 1, sizeof magic, f);
    std::fclose(f);
    if (n == 4 && std::memcmp(magic, "GGUF", 4) == 0) return from_gguf_file(path);
  }
  if (p.extension() == ".safetensors") {
    fs::path j = p.parent_path() / "tokenizer.json";
    QLFT_CHECK_FORMAT(fs::exists(j, ec), "%s: no tokenizer.json beside this file", path.c_str());
    return from_hf_json_file(j.string());
  }
  return from_hf_json_file(path);
}

std::unique_ptr<Tokenizer> Tokenizer::from_hf_json_text(const std::string& text,
                                                        const std::string& config_text,
                                                        const std::string& what) {
  const json root = JsonFile::parse(text, what).root();
  json cfg = json::object();
  if (!config_text.empty())
    cfg = JsonFile::parse(config_text, what + " (tokenizer_config.json)").root();

  std::unique_ptr<Tokenizer> t(new Tokenizer());
  const json* model = member(root, "model");
  QLFT_CHECK_FORMAT(model && model->is_object(), "%s: 'model' is missing", what.c_str());
  const std::string mtype = str_member(*model, "type", what + " model", "BPE");
  if (mtype != "BPE")
    throw_error(QLFT_ERR_UNSUPPORTED, "%s: model.type '%s' is not supported (BPE)", what.c_str(),
                mtype.c_str());
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* v = member(*model, k);
    if (v && !(v->is_string() && v->get<std::string>().empty()))
      throw_error(QLFT_ERR_UNSUPPORTED, "%s: model.%s is not supported", what.c_str(), k);
  }
  t->algo_ = Algo::Bpe;

  // Vocabulary: ids may have holes (a vocabulary cut down to what some text needs); holes stay
  // unusable placeholders.
  const json* vocab = member(*model, "vocab");
  QLFT_CHECK_FORMAT(vocab && vocab->is_object(), "%s: model.vocab must be an object", what.c_str());
  const json* added = member(root, "added_tokens");
  QLFT_CHECK_FORMAT(!added || added->is_array(), "%s: 'added_tokens' must be an array",
                    what.c_str());
  int64_t max_id = -1;
  auto check_id = [&](const json& v, const std::string& tok) {
    QLFT_CHECK_FORMAT(
        v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < kMaxVocab,
        "%s: token '%s' has an invalid id (ids are 0..%lld; the table is sized by the largest)",
        what.c_str(), tok.c_str(), static_cast<long long>(kMaxVocab - 1));
    max_id = std::max(max_id, v.get<int64_t>());
    return static_cast<int32_t>(v.get<int64_t>());
  };
  for (auto it = vocab->begin(); it != vocab->end(); ++it) check_id(it.value(), it.key());
  if (added)
    for (const json& a : *added) {
      QLFT_CHECK_FORMAT(
          a.is_object() && a.contains("id") && a.contains("content") && a["content"].is_string(),
          "%s: every added_tokens entry needs 'id' and 'content'", what.c_str());
      check_id(a["id"], a["content"].get<std::string>());
    }
  QLFT_CHECK_FORMAT(max_id >= 0, "%s: the vocabulary is empty", what.c_str());
  t->tokens_.assign(max_id + 1, Token{std::string(), 0.f, TokenType::Unused});
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    Token& tk = t->tokens_[it.value().get<int32_t>()];
    tk.text = it.key();
    tk.type = TokenType::Normal;
  }

  t->byte_fallback_ = bool_member(*model, "byte_fallback", what + " model", false);
  t->fuse_unk_ = bool_member(*model, "fuse_unk", what + " model", false);
  t->ignore_merges_ = bool_member(*model, "ignore_merges", what + " model", false);
  std::string unk = str_member(*model, "unk_token", what + " model");

  const json* merges = member(*model, "merges");
  QLFT_CHECK_FORMAT(!merges || merges->is_array(), "%s: model.merges must be an array",
                    what.c_str());
  if (merges) {
    t->merges_.reserve(merges->size());
    size_t i = 0;
    for (const json& m : *merges) {
      if (m.is_string()) {
        const std::string& s = m.get_ref<const std::string&>();
        size_t sp = s.size() > 1 ? s.find(' ', 1) : std::string::npos;
        QLFT_CHECK_FORMAT(sp != std::string::npos && sp + 1 < s.size(),
                          "%s: model.merges[%zu] is not \"left right\"", what.c_str(), i);
        t->merges_.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else {
        QLFT_CHECK_FORMAT(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
                          "%s: model.merges[%zu] must be a string or a pair of strings",
                          what.c_str(), i);
        t->merges_.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      }
      ++i;
    }
  }

  // Added tokens: special ones are control tokens, the others user-defined (always kept whole).
  if (added)
    for (const json& a : *added) {
      Token& tk = t->tokens_[a["id"].get<int32_t>()];
      tk.text = a["content"].get<std::string>();
      tk.type = bool_member(a, "special", what + " added_tokens", false) ? TokenType::Control
                                                                         : TokenType::UserDefined;
    }

  // Normalizer: Prepend(s) and Replace(string -> string) are supported; NFC/NFKC are accepted
  // without being applied (text is taken as already normalized).
  bool replaces_space = false;
  auto normalizer = [&](const json& n, const std::string& ty) {
    if (ty == "Prepend") {
      t->prefix_ = Prefix::Always;
      t->prefix_text_ = str_member(n, "prepend", what + " normalizer Prepend");
      QLFT_CHECK_FORMAT(!replaces_space, "%s: Prepend after Replace is not supported",
                        what.c_str());
    } else if (ty == "Replace") {
      const json* pat = member(n, "pattern");
      std::string content = str_member(n, "content", what + " normalizer Replace");
      if (!pat || !pat->is_object() || !pat->contains("String") || !(*pat)["String"].is_string() ||
          (*pat)["String"].get<std::string>() != " ")
        throw_error(QLFT_ERR_UNSUPPORTED,
                    "%s: only the normalizer Replace(\" \" -> ...) is "
                    "supported",
                    what.c_str());
      t->space_char_ = content;
      replaces_space = true;
    } else if (ty != "NFC" && ty != "NFKC") {  // those two: accepted as a no-op (see above)
      return false;
    }
    return true;
  };

  // Pre-tokenizer stages, in order.
  auto pretok = [&](const json& p, const std::string& ty) {
    if (ty == "ByteLevel") {
      t->byte_level_ = true;
      if (bool_member(p, "add_prefix_space", what, false)) t->byte_level_prefix_space_ = true;
      if (bool_member(p, "use_regex", what, true))
        t->pre_.push_back({std::make_shared<tok::SplitRegex>(tok::kGpt2Pattern, what), false});
    } else if (ty == "Split") {
      const json* pat = member(p, "pattern");
      std::string behavior = str_member(p, "behavior", what + " Split", "Isolated");
      if (behavior != "Isolated" || bool_member(p, "invert", what, false))
        throw_error(QLFT_ERR_UNSUPPORTED, "%s: Split with behavior '%s' is not supported",
                    what.c_str(), behavior.c_str());
      std::string rx;
      if (pat && pat->is_object() && pat->contains("Regex") && (*pat)["Regex"].is_string()) {
        rx = (*pat)["Regex"].get<std::string>();
      } else if (pat && pat->is_object() && pat->contains("String") &&
                 (*pat)["String"].is_string()) {
        // A literal: quote it for PCRE2.
        rx = "\\Q" + (*pat)["String"].get<std::string>() + "\\E";
      } else {
        throw_error(QLFT_ERR_FORMAT, "%s: Split needs a pattern {Regex} or {String}", what.c_str());
      }
      t->pre_.push_back({std::make_shared<tok::SplitRegex>(rx, what), false});
    } else if (ty == "Digits") {
      bool single = bool_member(p, "individual_digits", what, false);
      t->pre_.push_back(
          {std::make_shared<tok::SplitRegex>(single ? "\\p{N}" : "\\p{N}+", what), false});
    } else if (ty == "Metaspace") {
      t->meta_repl_ = str_member(p, "replacement", what + " Metaspace", kSpace);
      std::string scheme = str_member(p, "prepend_scheme", what + " Metaspace", "");
      if (scheme.empty())
        scheme = bool_member(p, "add_prefix_space", what, true) ? "always" : "never";
      t->prefix_ = scheme == "always"  ? Prefix::MetaAlways
                   : scheme == "first" ? Prefix::MetaFirst
                                       : Prefix::None;
      t->metaspace_split_ = bool_member(p, "split", what, true);
      t->pre_.push_back({nullptr, true});
      t->strip_leading_space_ = t->prefix_ != Prefix::None;
    } else {
      return false;
    }
    return true;
  };

  // Decoder: only what changes the bytes we produce matters -- ByteLevel, "▁" -> " ", Strip.
  auto decoder = [&](const json& d, const std::string& ty) {
    if (ty == "ByteLevel") {
      t->byte_level_ = true;
    } else if (ty == "Strip") {
      if (str_member(d, "content", what, " ") == " " && member(d, "start") &&
          (*member(d, "start")).is_number_integer() && (*member(d, "start")).get<int>() > 0)
        t->strip_leading_space_ = true;
    } else if (ty == "Metaspace") {
      t->decode_space_ = str_member(d, "replacement", what, kSpace);
    } else if (ty == "Replace") {
      const json* pat = member(d, "pattern");
      if (pat && pat->is_object() && pat->contains("String") && (*pat)["String"].is_string() &&
          str_member(d, "content", what) == " ")
        t->decode_space_ = (*pat)["String"].get<std::string>();
    } else {
      return false;
    }
    return true;
  };
  // In the file's order; an unknown decoder is passed over (it changes nothing read here).
  for_each_stage(root, "normalizer", "normalizers", what, true, normalizer);
  for_each_stage(root, "pre_tokenizer", "pretokenizers", what, true, pretok);
  for_each_stage(root, "decoder", "decoders", what, false, decoder);
  // Pieces spell spaces as "▁" whenever a normalizer or Metaspace put them there.
  if (t->decode_space_.empty()) {
    if (!t->space_char_.empty())
      t->decode_space_ = t->space_char_;
    else if (std::any_of(t->pre_.begin(), t->pre_.end(),
                         [](const PreStep& s) { return s.metaspace; }))
      t->decode_space_ = t->meta_repl_;
  }

  // Byte tokens.
  if (t->byte_fallback_)
    for (Token& tk : t->tokens_)
      if (tk.type == TokenType::Normal && tok::parse_byte_token(tk.text) >= 0)
        tk.type = TokenType::Byte;

  // Special ids: tokenizer_config.json, else names the post-processor / convention suggest.
  auto find_text = [&](const std::string& s) -> int32_t {
    if (s.empty()) return -1;
    for (size_t i = t->tokens_.size(); i-- > 0;)
      if (t->tokens_[i].text == s) return static_cast<int32_t>(i);
    return -1;
  };
  auto first_of = [&](std::initializer_list<const char*> names) -> int32_t {
    for (const char* nm : names)
      if (int32_t id = find_text(nm); id >= 0) return id;
    return -1;
  };
  t->unk_ = find_text(config_token(cfg, "unk_token"));
  if (t->unk_ < 0) t->unk_ = find_text(unk);
  if (t->unk_ >= 0 && t->tokens_[t->unk_].type == TokenType::Normal)
    t->tokens_[t->unk_].type = TokenType::Unknown;
  t->bos_ = find_text(config_token(cfg, "bos_token"));
  t->eos_ = find_text(config_token(cfg, "eos_token"));
  t->pad_ = find_text(config_token(cfg, "pad_token"));
  // The post-processor template (TemplateProcessing, alone or in a Sequence as Llama-3's is)
  // says which special tokens wrap a single sequence.
  bool tmpl_bos = false, tmpl_eos = false;
  const json* single = nullptr;
  if (const json* pp = member(root, "post_processor")) {
    single = member(*pp, "single");
    if (const json* list = member(*pp, "processors"); list && list->is_array())
      for (const json& x : *list)
        if (const json* s = member(x, "single")) single = s;
  }
  if (single && single->is_array()) {
    bool seen_seq = false;
    for (const json& e : *single) {
      if (member(e, "Sequence")) {
        seen_seq = true;
      } else if (const json* st = member(e, "SpecialToken")) {
        int32_t id = find_text(str_member(*st, "id", what + " post_processor"));
        if (id < 0) continue;
        if (!seen_seq) {
          tmpl_bos = true;
          if (t->bos_ < 0) t->bos_ = id;
        } else {
          tmpl_eos = true;
          if (t->eos_ < 0) t->eos_ = id;
        }
      }
    }
  }
  if (t->bos_ < 0) t->bos_ = first_of({"<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>"});
  if (t->eos_ < 0)
    t->eos_ = first_of({"</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>", "<|im_end|>"});
  // tokenizer_config.json's flags win over the template: transformers rebuilds the template from
  // them (add_bos_token / add_eos_token); without them the template is what it applies.
  t->add_bos_ = bool_member(cfg, "add_bos_token", what + " tokenizer_config", tmpl_bos);
  t->add_eos_ = bool_member(cfg, "add_eos_token", what + " tokenizer_config", tmpl_eos);

  t->finalize();
  return t;
}

}  // namespace qlft
