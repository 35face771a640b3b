// The tokenizer that comes with a model: loaded right after the weights, kept on the handle.
#include <sys/stat.h>

#include "api/handles.h"
#include "core/error.h"

namespace qlft {

void attach_tokenizer(qlft_model& m) {
  try {
    if (m.model->gguf) {
      m.tokenizer = Tokenizer::from_gguf(*m.model->gguf);
      m.model->gguf->drop_metadata_pages();  // read: the tokenizer holds what it needs
    } else {
      std::string p = m.model->hf_dir + "/tokenizer.json";
      struct stat st;
      if (::stat(p.c_str(), &st) != 0) {
        m.tokenizer_error = p + ": not found (the model has no tokenizer)";
        return;
      }
      m.tokenizer = Tokenizer::from_hf_json_file(p);
    }
  } catch (const Error& e) {
    m.tokenizer.reset();
    m.tokenizer_error = e.what();
  }
}

}  // namespace qlft

const qlft::Tokenizer& qlft_model::need_tokenizer() const {
  if (!tokenizer)
    qlft::throw_error(QLFT_ERR_FORMAT, "%s: no usable tokenizer: %s", model->path.c_str(),
                      tokenizer_error.c_str());
  return *tokenizer;
}
