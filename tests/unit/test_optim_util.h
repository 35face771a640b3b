// Shared by the optimizer tests: reading tests/reference/fixtures/optim/ (made by
// tests/reference/gen_optim_fixtures.py from torch, bitsandbytes and transformers).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "formats/safetensors.h"
#include "support/test_support.h"

namespace optim_test {

inline nlohmann::json fixture_json() {
  std::ifstream f(qlft_test::fixture_path("optim/optim.json"));
  EXPECT_TRUE(f.good()) << "missing optim/optim.json: run tests/reference/gen_optim_fixtures.py";
  return nlohmann::json::parse(f);
}

class Fixture {
 public:
  explicit Fixture(const std::string& file)
      : set_(qlft::SafetensorsSet::open(qlft_test::fixture_path("optim/" + file))) {}

  bool has(const std::string& name) const { return set_->find(name) != nullptr; }

  std::vector<float> f32(const std::string& name) const {
    const qlft::SafeTensorInfo* t = info(name, qlft::DType::F32);
    std::vector<float> v(t->nbytes / sizeof(float));
    std::memcpy(v.data(), t->data, t->nbytes);
    return v;
  }
  // An F16 tensor widened to float (exactly).
  std::vector<float> f16(const std::string& name) const {
    const qlft::SafeTensorInfo* t = info(name, qlft::DType::F16);
    std::vector<uint16_t> h(t->nbytes / 2);
    std::memcpy(h.data(), t->data, t->nbytes);
    std::vector<float> v(h.size());
    qlft::f16_to_f32_n(h.data(), v.data(), h.size());
    return v;
  }
  std::vector<uint8_t> u8(const std::string& name) const {
    const qlft::SafeTensorInfo* t = info(name, qlft::DType::U8);
    return std::vector<uint8_t>(t->data, t->data + t->nbytes);
  }

 private:
  const qlft::SafeTensorInfo* info(const std::string& name, qlft::DType dt) const {
    const qlft::SafeTensorInfo* t = set_->find(name);
    if (!t) throw std::runtime_error("fixture tensor missing: " + name);
    if (t->dtype != dt) throw std::runtime_error("fixture tensor has another dtype: " + name);
    return t;
  }
  std::unique_ptr<qlft::SafetensorsSet> set_;
};

}  // namespace optim_test
