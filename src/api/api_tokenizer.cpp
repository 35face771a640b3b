// qlft_tokenize / qlft_detokenize: the model's tokenizer through the C ABI; qlft_tokenizer_*:
// the same on a tokenizer loaded alone (no weights), for tools that need only the vocabulary.
#include <cstring>

#include "api/handles.h"
#include "core/error.h"

using qlft::guard;

struct qlft_tokenizer {
  std::unique_ptr<qlft::Tokenizer> tok;
};

namespace {

// add_bos: 1 BOS, 0 none, negative: BOS and EOS as the model's tokenizer adds them.
void encode_into(const qlft::Tokenizer& t, const char* fn, const char* text, size_t text_len,
                 int32_t add_bos, int32_t parse_special, int32_t* ids, size_t capacity,
                 size_t* n_ids) {
  std::string_view s(text ? text : "", text_len);
  std::vector<int32_t> v = add_bos < 0 ? t.encode_as_model(s, parse_special != 0)
                                       : t.encode(s, add_bos != 0, false, parse_special != 0);
  if (n_ids) *n_ids = v.size();
  if (capacity == 0 && !ids) return;  // size query
  QLFT_CHECK_ARG(ids && capacity >= v.size(), "%s: %zu ids do not fit the buffer of %zu", fn,
                 v.size(), capacity);
  std::memcpy(ids, v.data(), v.size() * sizeof(int32_t));
}

void decode_into(const qlft::Tokenizer& t, const char* fn, const int32_t* ids, size_t n_ids,
                 char* buf, size_t buf_size, size_t* needed) {
  for (size_t i = 0; i < n_ids; ++i)
    QLFT_CHECK_ARG(ids[i] >= 0 && ids[i] < t.vocab_size(),
                   "%s: id %d at position %zu is outside the vocabulary (%d)", fn, ids[i], i,
                   t.vocab_size());
  std::string s = t.decode(ids, n_ids, true);
  if (needed) *needed = s.size() + 1;
  if (buf_size == 0 && !buf) return;
  QLFT_CHECK_ARG(buf && buf_size > s.size(), "%s: %zu bytes do not fit the buffer of %zu", fn,
                 s.size() + 1, buf_size);
  std::memcpy(buf, s.c_str(), s.size() + 1);
}

}  // namespace

extern "C" {

int32_t qlft_tokenize(const qlft_model* model, const char* text, size_t text_len, int32_t add_bos,
                      int32_t parse_special, int32_t* ids, size_t capacity, size_t* n_ids) {
  return guard([&] {
    QLFT_CHECK_ARG(model && (text || text_len == 0), "qlft_tokenize: model and text must be given");
    encode_into(model->need_tokenizer(), "qlft_tokenize", text, text_len, add_bos, parse_special,
                ids, capacity, n_ids);
  });
}

int32_t qlft_detokenize(const qlft_model* model, const int32_t* ids, size_t n_ids, char* buf,
                        size_t buf_size, size_t* needed) {
  return guard([&] {
    QLFT_CHECK_ARG(model && (ids || n_ids == 0), "qlft_detokenize: model and ids must be given");
    decode_into(model->need_tokenizer(), "qlft_detokenize", ids, n_ids, buf, buf_size, needed);
  });
}

int32_t qlft_tokenizer_load(const char* path, qlft_tokenizer** out) {
  return guard([&] {
    QLFT_CHECK_ARG(out, "qlft_tokenizer_load: out is NULL");
    *out = nullptr;
    QLFT_CHECK_ARG(path && *path, "qlft_tokenizer_load: path is NULL or empty");
    auto t = std::make_unique<qlft_tokenizer>();
    t->tok = qlft::Tokenizer::from_path(path);
    *out = t.release();
  });
}

void qlft_tokenizer_free(qlft_tokenizer* tokenizer) {
  delete tokenizer;
}

int32_t qlft_tokenizer_encode(const qlft_tokenizer* tokenizer, const char* text, size_t text_len,
                              int32_t add_bos, int32_t parse_special, int32_t* ids, size_t capacity,
                              size_t* n_ids) {
  return guard([&] {
    QLFT_CHECK_ARG(tokenizer && (text || text_len == 0),
                   "qlft_tokenizer_encode: tokenizer and text must be given");
    encode_into(*tokenizer->tok, "qlft_tokenizer_encode", text, text_len, add_bos, parse_special,
                ids, capacity, n_ids);
  });
}

int32_t qlft_tokenizer_decode(const qlft_tokenizer* tokenizer, const int32_t* ids, size_t n_ids,
                              char* buf, size_t buf_size, size_t* needed) {
  return guard([&] {
    QLFT_CHECK_ARG(tokenizer && (ids || n_ids == 0),
                   "qlft_tokenizer_decode: tokenizer and ids must be given");
    decode_into(*tokenizer->tok, "qlft_tokenizer_decode", ids, n_ids, buf, buf_size, needed);
  });
}

}  // extern "C"
