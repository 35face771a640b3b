// The handles one C API test holds, freed in reverse order of creation (a NULL handle is a
// no-op for every qlft_*_free), and a config setter that fails the test with the API's message.
#pragma once

#include <gtest/gtest.h>

#include "qlft.h"

namespace qlft_test {

struct Session {
  qlft_config* cfg = nullptr;
  qlft_runtime* rt = nullptr;
  qlft_model* model = nullptr;
  qlft_dataset* data = nullptr;
  qlft_trainer* trainer = nullptr;
  ~Session() {
    qlft_trainer_free(trainer);
    qlft_dataset_free(data);
    qlft_model_free(model);
    qlft_runtime_free(rt);
    qlft_config_free(cfg);
  }
  void set(const char* k, const char* v) {
    ASSERT_EQ(qlft_config_set(cfg, k, v), QLFT_OK) << k << ": " << qlft_last_error();
  }
};

}  // namespace qlft_test
