// The YAML/JSON run configuration (load_config_text), then the typed views the runtime builds
// from it (TrainSettings, DataOptions), which parse and range-check the values.
#include "config/config.h"
#include "config/config_file.h"
#include "data/dataset.h"
#include "fuzz_common.h"
#include "train/trainer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  qlft_fuzz::expect_only_qlft_errors([&] {
    qlft::Config cfg;
    qlft::load_config_text(cfg, text, "fuzz.yaml");
    qlft_fuzz::expect_only_qlft_errors(
        [&] { (void)qlft::TrainSettings::from_spec(qlft::parse_run_spec(cfg)); });
    qlft_fuzz::expect_only_qlft_errors([&] { (void)qlft::parse_run_spec(cfg).data; });
  });
  return 0;
}
