// Text <-> token ids for the models qlft trains: SentencePiece-style vocabularies (score merges as
// llama.cpp's llm_tokenizer_spm does, or merge lists with <0xNN> byte fallback as Hugging Face's
// BPE does) and GPT-2 style byte-level BPE with regex pre-tokenizers. Loaded from GGUF metadata
// (tokenizer.ggml.*) or from a Hugging Face tokenizer.json.
//
// Encoding is const and thread-safe. Special tokens: CONTROL (and UNKNOWN) tokens are recognized
// in the text only when parse_special is true; USER_DEFINED tokens (non-special added tokens) are
// always kept whole, as llama.cpp does. Text is bytes: invalid UTF-8 is encoded through byte
// tokens (byte fallback or the byte-level alphabet), or the unknown token when the vocabulary has
// neither; it never throws for text.
//
// Decoding concatenates token_to_piece(). When the vocabulary adds a space prefix while encoding
// (SentencePiece "▁" prefix), decode drops one leading space from the first piece after any
// leading skipped special tokens, so decode(encode(x)) == x -- this is what llama.cpp's
// detokenize (remove_space = add_space_prefix) and Hugging Face's Strip/Metaspace decoders do.
// decode() does not apply clean_up_tokenization_spaces.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/pair_map.h"
#include "tokenizer/text_table.h"

namespace qlft {

class GgufFile;
namespace tok {
class SplitRegex;
}

// llama.cpp's token types (tokenizer.ggml.token_type).
enum class TokenType : int32_t {
  Undefined = 0,
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6,
};

class Tokenizer {
 public:
  // The largest vocabulary (and token id + 1) accepted from a file: 16x the largest real
  // vocabularies (~262k). Bigger ones are QLFT_ERR_FORMAT before any per-token memory is taken:
  // building the lookup tables costs ~250 bytes and many hash lookups per token.
  static constexpr int64_t kMaxVocab = int64_t(1) << 22;

  // From a GGUF file's tokenizer.ggml.* metadata. QLFT_ERR_FORMAT names the key when the
  // metadata is missing or malformed; QLFT_ERR_UNSUPPORTED for unknown models / pre-tokenizers.
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& gguf);
  static std::unique_ptr<Tokenizer> from_gguf_file(const std::string& path);
  // From a Hugging Face tokenizer.json. Special-token ids and add_bos/add_eos come from a
  // tokenizer_config.json in the same directory when present, else from the post-processor
  // template and well-known token names.
  static std::unique_ptr<Tokenizer> from_hf_json_file(const std::string& path);
  static std::unique_ptr<Tokenizer> from_hf_json_text(const std::string& json,
                                                      const std::string& config_json,
                                                      const std::string& what);
  // Only the vocabulary of a model, whatever its form: a GGUF file (its tokenizer.ggml.*
  // metadata; no tensor is read, so a vocabulary-only GGUF works), a Hugging Face model
  // directory or the directory of a .safetensors file (its tokenizer.json), or a tokenizer.json.
  static std::unique_ptr<Tokenizer> from_path(const std::string& path);

  ~Tokenizer();

  int32_t vocab_size() const { return static_cast<int32_t>(types_.size()); }
  // -1 where the vocabulary has none.
  int32_t bos_id() const { return bos_; }
  int32_t eos_id() const { return eos_; }
  int32_t pad_id() const { return pad_; }
  int32_t unk_id() const { return unk_; }
  // Whether the model's tokenizer adds BOS / EOS around a text: GGUF
  // tokenizer.ggml.add_bos_token / add_eos_token, else llama.cpp's default for the vocabulary
  // (SentencePiece: BOS; byte-level BPE: BOS for the Llama-3 family only; never EOS); for
  // tokenizer.json, tokenizer_config.json's add_bos_token / add_eos_token, else the
  // post-processor template. False when the vocabulary has no such token.
  bool wants_bos() const { return add_bos_ && bos_ >= 0; }
  bool wants_eos() const { return add_eos_ && eos_ >= 0; }

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool add_eos,
                              bool parse_special) const;
  // encode() with BOS/EOS as the model's tokenizer adds them (wants_bos()/wants_eos()): the ids
  // llama.cpp's tokenize(add_special=true) and transformers' tokenizer(text) give.
  std::vector<int32_t> encode_as_model(std::string_view text, bool parse_special) const {
    return encode(text, wants_bos(), wants_eos(), parse_special);
  }
  // Appends the ids of text. continuation: text continues an earlier encode_append() call, so the
  // prefix added at the start of a text (SentencePiece "▁", ByteLevel add_prefix_space,
  // Metaspace "first") is not added to its first fragment; fragments after a special token
  // still get it, as they would in one call.
  void encode_append(std::string_view text, bool parse_special, std::vector<int32_t>& out,
                     bool continuation = false) const;

  // Concatenated pieces; special (control/unknown) tokens are skipped when skip_special, else
  // rendered as their text. Out-of-range ids are QLFT_ERR_INVALID_ARGUMENT.
  std::string decode(const int32_t* ids, size_t n, bool skip_special = true) const;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = true) const {
    return decode(ids.data(), ids.size(), skip_special);
  }

  // The bytes one token stands for (byte tokens give their byte; "▁" is a space; byte-level
  // text is mapped back to bytes). Control/unknown tokens give their text, or "" when
  // special is false.
  std::string token_to_piece(int32_t id, bool special = true) const;
  // The token as the vocabulary spells it (valid while the tokenizer lives).
  std::string_view token_text(int32_t id) const;
  TokenType token_type(int32_t id) const;
  // Control or unknown tokens (what parse_special recognizes and decode skips).
  bool is_special(int32_t id) const;
  // Id of a token spelled exactly like text, -1 if none.
  int32_t token_id(std::string_view text) const;
  // Whether decode() strips one leading space (vocabularies that prefix one while encoding).
  bool strips_leading_space() const { return strip_leading_space_; }

 private:
  Tokenizer();

  enum class Algo { SpmScores, Bpe };
  enum class Prefix { None, Always, MetaAlways, MetaFirst };

  // A token as a loader fills it in; finalize() moves the vocabulary into compact tables.
  struct Token {
    std::string text;
    float score = 0;
    TokenType type = TokenType::Normal;
  };

  // One pre-tokenizer stage: a regex split, or (pattern empty) a Metaspace stage.
  struct PreStep {
    std::shared_ptr<tok::SplitRegex> regex;
    bool metaspace = false;
  };
  struct Special {
    std::string text;
    int32_t id;
    bool always;  // USER_DEFINED: matched even without parse_special
  };

  // Builds the lookup structures once the vocabulary and options are set.
  void finalize();

  void encode_fragment(std::string_view text, bool at_start, bool no_prefix,
                       std::vector<int32_t>& out) const;
  void pre_tokenize(size_t step, std::string_view piece, bool at_start,
                    std::vector<int32_t>& out) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  void spm_encode(std::string_view text, std::vector<int32_t>& out) const;
  void bpe_encode(std::string_view word, std::vector<int32_t>& out) const;
  void encode_cached(std::string_view word, std::vector<int32_t>& out) const;
  void bpe_merge(std::vector<int32_t>& ids, std::vector<int32_t>& out) const;
  void push_bytes(std::string_view s, std::vector<int32_t>& out) const;
  std::string piece_of(int32_t id) const;
  TokenType type_of(int32_t id) const { return static_cast<TokenType>(types_[id]); }
  int32_t id_of(std::string_view text) const { return text_to_id_.find(texts_, text); }

  // The loaders' vocabulary; empty after finalize().
  std::vector<Token> tokens_;
  // The vocabulary after finalize(), by id: spellings, types, scores (SPM only) and pieces (what
  // token_to_piece gives).
  tok::TextTable texts_;
  std::vector<uint8_t> types_;
  std::vector<float> scores_;
  tok::TextTable pieces_;
  tok::TextIndex text_to_id_;  // keys in texts_; a repeated spelling gives its last id

  Algo algo_ = Algo::SpmScores;
  bool byte_level_ = false;     // GPT-2 byte alphabet
  bool byte_fallback_ = false;  // <0xNN> tokens for characters not in the vocabulary
  bool ignore_merges_ = false;  // a word that is a token is emitted whole (Llama-3)
  bool fuse_unk_ = false;
  // Normalizer: optional prefix, then replace spaces by `space_char_` (empty: no replacement).
  Prefix prefix_ = Prefix::None;
  std::string prefix_text_;   // what Prefix::Always prepends (" " or "▁")
  std::string space_char_;    // "▁" for SentencePiece vocabularies
  std::string decode_space_;  // what token_to_piece turns back into ' ' ("▁"), empty: nothing
  std::string meta_repl_ = "\xe2\x96\x81";  // Metaspace replacement
  bool byte_level_prefix_space_ = false;    // ByteLevel(add_prefix_space=true)
  bool metaspace_split_ = false;
  std::vector<PreStep> pre_;
  bool strip_leading_space_ = false;
  uint64_t serial_ = 0;  // tells one tokenizer's per-thread word cache from another's

  int32_t bos_ = -1, eos_ = -1, pad_ = -1, unk_ = -1;
  bool add_bos_ = false, add_eos_ = false;

  // Derived in finalize().
  tok::PairMap pairs_;  // BPE: (left,right)->(rank,merged); SPM: ->merged
  // BPE merge list (texts), from the loader; finalize() builds pairs_ from it and frees it.
  std::vector<std::pair<std::string, std::string>> merges_;
  int32_t byte_ids_[256];  // token for each byte (byte-level char or <0xNN>), -1
  bool isolated_[128];     // characters no merge can cross (see encode_word)
  bool has_isolated_ = false;
  tok::TextIndex raw_to_id_;  // byte-level, ignore_merges: keys in pieces_ (decoded bytes) -> id
  std::vector<Special> specials_;             // longest first
  std::vector<uint32_t> special_first_[256];  // indices into specials_, by first byte
};

}  // namespace qlft
