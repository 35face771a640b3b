// qlft_tokenize / qlft_detokenize: the model's tokenizer through the C ABI.
#include <cstring>

#include "api/handles.h"
#include "core/error.h"

using qlft::guard;

extern "C" {

int32_t qlft_tokenize(const qlft_model* model, const char* text, size_t text_len, int32_t add_bos,
                      int32_t parse_special, int32_t* ids, size_t capacity, size_t* n_ids) {
  return guard([&] {
    QLFT_CHECK_ARG(model && (text || text_len == 0), "qlft_tokenize: model and text must be given");
    std::vector<int32_t> v = model->need_tokenizer().encode(
        std::string_view(text ? text : "", text_len), add_bos != 0, false, parse_special != 0);
    if (n_ids) *n_ids = v.size();
    if (capacity == 0 && !ids) return;  // size query
    QLFT_CHECK_ARG(ids && capacity >= v.size(),
                   "qlft_tokenize: %zu ids do not fit the buffer of %zu", v.size(), capacity);
    std::memcpy(ids, v.data(), v.size() * sizeof(int32_t));
  });
}

int32_t qlft_detokenize(const qlft_model* model, const int32_t* ids, size_t n_ids, char* buf,
                        size_t buf_size, size_t* needed) {
  return guard([&] {
    QLFT_CHECK_ARG(model && (ids || n_ids == 0), "qlft_detokenize: model and ids must be given");
    const qlft::Tokenizer& t = model->need_tokenizer();
    for (size_t i = 0; i < n_ids; ++i)
      QLFT_CHECK_ARG(ids[i] >= 0 && ids[i] < t.vocab_size(),
                     "qlft_detokenize: id %d at position %zu is outside the vocabulary (%d)",
                     ids[i], i, t.vocab_size());
    std::string s = t.decode(ids, n_ids, true);
    if (needed) *needed = s.size() + 1;
    if (buf_size == 0 && !buf) return;
    QLFT_CHECK_ARG(buf && buf_size > s.size(),
                   "qlft_detokenize: %zu bytes do not fit the buffer of %zu", s.size() + 1,
                   buf_size);
    std::memcpy(buf, s.c_str(), s.size() + 1);
  });
}

}  // extern "C"
