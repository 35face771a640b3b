#include "config/config_file.h"

#include <yaml-cpp/yaml.h>

#include <map>

#include "core/error.h"
#include "formats/mapped_file.h"

namespace qlft {

namespace {

// Setting name -> line that set it: a setting given twice (a duplicate key, or `train:` with
// `lr` beside `train.lr`) is refused instead of silently taking the last value.
using SeenKeys = std::map<std::string, int>;

void flatten(const YAML::Node& node, const std::string& prefix, const std::string& name,
             Config& staged, SeenKeys& seen) {
  const int line = node.Mark().line + 1;
  if (node.IsMap()) {
    for (const auto& kv : node) {
      std::string key;
      try {
        key = kv.first.as<std::string>();
      } catch (const YAML::Exception&) {
        throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s:%d: keys must be strings", name.c_str(),
                    kv.first.Mark().line + 1);
      }
      flatten(kv.second, prefix.empty() ? key : prefix + "." + key, name, staged, seen);
    }
    return;
  }
  auto [it, fresh] = seen.emplace(prefix, line);
  if (!fresh)
    throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s:%d: %s is set twice (first at line %d)",
                name.c_str(), line, prefix.c_str(), it->second);
  if (prefix.empty())
    throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s:%d: expected a map of settings at the top level",
                name.c_str(), line);
  std::string value;
  if (node.IsSequence()) {
    for (const auto& item : node) {
      if (!item.IsScalar())
        throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s:%d: %s: list items must be plain values",
                    name.c_str(), item.Mark().line + 1, prefix.c_str());
      if (!value.empty()) value += ",";
      value += item.Scalar();
    }
  } else if (node.IsScalar()) {
    value = node.Scalar();
  } else if (node.IsNull()) {
    throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s:%d: %s has no value", name.c_str(), line,
                prefix.c_str());
  }
  try {
    staged.set(prefix, value);
  } catch (const Error& e) {
    throw_error(e.status(), "%s:%d: %s", name.c_str(), line, e.what());
  }
}

}  // namespace

void load_config_text(Config& cfg, const std::string& text, const std::string& name) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s:%d: YAML syntax error: %s", name.c_str(),
                e.mark.line + 1, e.msg.c_str());
  }
  if (root.IsNull()) return;  // an empty file sets nothing
  Config staged = cfg;        // all-or-nothing
  SeenKeys seen;
  flatten(root, "", name, staged, seen);
  cfg = std::move(staged);
}

void load_config_file(Config& cfg, const std::string& path) {
  load_config_text(cfg, read_text_file(path, size_t(16) << 20), path);
}

}  // namespace qlft
