#include "data/model_template.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/mapped_file.h"
#include "model/model.h"

namespace qlft::data {

std::string hf_chat_template(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  try {
    fs::path jinja = fs::path(model_dir) / "chat_template.jinja";
    if (fs::is_regular_file(jinja, ec)) return read_text_file(jinja.string(), 16 << 20);
    fs::path cfg = fs::path(model_dir) / "tokenizer_config.json";
    if (!fs::is_regular_file(cfg, ec)) return {};
    nlohmann::json j = nlohmann::json::parse(read_text_file(cfg.string(), 64 << 20));
    auto it = j.find("chat_template");
    if (it == j.end()) return {};
    if (it->is_string()) return it->get<std::string>();
    if (it->is_array())
      for (const auto& t : *it)
        if (t.is_object() && t.value("name", "") == "default" && t.contains("template") &&
            t["template"].is_string())
          return t["template"].get<std::string>();
  } catch (const std::exception&) {
    // Unreadable or malformed: treated as no template.
  }
  return {};
}

std::string model_chat_template(const Model& model) {
  if (model.gguf) {
    const GgufValue* v = model.gguf->find("tokenizer.chat_template");
    if (v) {
      try {
        return model.gguf->get_string("tokenizer.chat_template");
      } catch (const Error&) {
        return {};  // not a string
      }
    }
    return {};
  }
  if (!model.hf_dir.empty()) return hf_chat_template(model.hf_dir);
  return {};
}

}  // namespace qlft::data
