// qlft-finetune config-doc: prints docs/CONFIG.md from the library's key table.
#include <cstdio>

#include "cli.h"

namespace cli {

int cmd_config_doc(int, char**) {
  std::printf(
      "# Settings\n\n"
      "Generated from the key table in `src/config/keys.cpp` by `qlft-finetune config-doc > "
      "docs/CONFIG.md`; do not edit by hand.\n"
      "Every key is accepted by `qlft_config_set`, as a CLI flag (`--key value`) and in a YAML "
      "config file.\n\n"
      "| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n");
  size_t n = qlft_config_key_count();
  for (size_t i = 0; i < n; ++i) {
    qlft_config_key k{};
    k.struct_size = sizeof k;
    if (qlft_config_key_at(i, &k) != QLFT_OK) return fail("config-doc", QLFT_ERR_INTERNAL);
    std::printf("| `%s` | %s | `%s` | %s | %s |\n", k.name, k.type, k.default_value, k.allowed,
                k.doc);
  }
  return kOk;
}

}  // namespace cli
