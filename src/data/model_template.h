// Where a model keeps its Jinja chat template: GGUF metadata tokenizer.chat_template, or beside a
// Hugging Face model chat_template.jinja / tokenizer_config.json's "chat_template" (a string, or a
// list of {name, template} of which "default" is taken).
#pragma once

#include <string>

namespace qlft {
struct Model;
}

namespace qlft::data {

// "" when the model has none. Never throws for a missing or malformed file: a model without a
// usable template trains with the alpaca template (see resolve_template).
std::string model_chat_template(const Model& model);
std::string hf_chat_template(const std::string& model_dir);

}  // namespace qlft::data
