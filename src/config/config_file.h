// YAML run files (`--config run.yaml`): nested maps flatten to dotted keys, so
//   lora: {r: 16, alpha: 32}
// sets lora.r and lora.alpha. Lists become comma-separated values (lora.target_modules).
#pragma once

#include <string>

#include "config/config.h"

namespace qlft {

// Applies every key of the YAML file at path to cfg. All-or-nothing: on an error (unreadable
// file, YAML syntax, unknown key, invalid value) cfg is unchanged and the QLFT_ERR_* message
// names the file, line and key.
void load_config_file(Config& cfg, const std::string& path);
void load_config_text(Config& cfg, const std::string& text, const std::string& name);

}  // namespace qlft
