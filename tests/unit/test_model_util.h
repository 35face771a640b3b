// Shared by the test_model_*.cpp suites: reading the PyTorch/PEFT fixtures of
// tests/reference/gen_model_fixtures.py and setting up a model with its LoRA adapter.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "formats/safetensors.h"
#include "model/llama.h"
#include "model/lora.h"
#include "model/model.h"
#include "support/test_support.h"

namespace model_test {

using namespace qlft;

// A fixture .safetensors file: float and int32 tensors by name, plus the metadata strings.
struct Fixture {
  std::unique_ptr<SafetensorsFile> file;
  std::map<std::string, const SafeTensorInfo*> t;

  explicit Fixture(const std::string& path) : file(SafetensorsFile::open(path)) {
    for (const SafeTensorInfo& i : file->tensors()) t[i.name] = &i;
  }
  bool has(const std::string& n) const { return t.count(n) != 0; }
  std::vector<float> f32(const std::string& n) const {
    auto it = t.find(n);
    if (it == t.end()) throw std::runtime_error("fixture tensor missing: " + n);
    std::vector<float> v(it->second->numel());
    to_f32_n(it->second->dtype, it->second->data, v.data(), v.size());
    return v;
  }
  std::vector<int32_t> i32(const std::string& n) const {
    auto it = t.find(n);
    if (it == t.end() || it->second->dtype != DType::I32)
      throw std::runtime_error("fixture int32 tensor missing: " + n);
    std::vector<int32_t> v(it->second->numel());
    std::memcpy(v.data(), it->second->data, v.size() * 4);
    return v;
  }
  std::string meta(const std::string& k) const {
    auto it = file->metadata().find(k);
    return it == file->metadata().end() ? std::string() : it->second;
  }
  std::vector<int64_t> shape(const std::string& n) const { return t.at(n)->shape; }
};

inline LoraConfig lora_config_of(const Fixture& f) {
  LoraConfig c;
  c.r = std::stoi(f.meta("r"));
  c.alpha = std::stof(f.meta("alpha"));
  c.use_rslora = f.meta("use_rslora") == "true";
  c.set_targets(f.meta("targets"));
  return c;
}

// Copies every fixture A/B (HF row order) into the adapter.
inline void load_lora(const Fixture& f, LoraAdapter& a) {
  for (int l = 0; l < a.n_layers(); ++l)
    for (int p = 0; p < kProjCount; ++p) {
      std::string k = "l" + std::to_string(l) + "." + proj_peft_name(static_cast<Proj>(p)) + ".";
      if (!f.has(k + "A")) continue;
      std::vector<float> A = f.f32(k + "A"), B = f.f32(k + "B");
      a.set_hf(l, static_cast<Proj>(p), A.data(), A.size(), B.data(), B.size());
    }
}

inline LoadOptions keep() {
  LoadOptions o;
  o.quant_type = qlft::QuantType::Keep;
  return o;
}

inline std::string model_fixture(const std::string& rel) {
  return qlft_test::fixture_path("model/" + rel);
}

}  // namespace model_test
