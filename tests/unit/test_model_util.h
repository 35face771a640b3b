// Shared by the test_model_*.cpp suites: reading the PyTorch/PEFT fixtures of
// tests/reference/gen_model_fixtures.py and setting up a model with its LoRA adapter.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
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

// The fixture's A / B of every adapted module as PEFT holds it (a fused family's qkv_proj /
// gate_up_proj whole: l<layer>.<module>.A / B) and, where it has them, each MoE layer's expert /
// router factors (l<layer>.{gate_up,down,router}.A / B: PEFT's lora_A [E r, in] / lora_B
// [out, r E]).
inline void load_lora_modules(const Fixture& f, LoraAdapter& a) {
  const char* const moe[kMoePartCount] = {"gate_up", "down", "router"};
  for (int l = 0; l < a.n_layers(); ++l) {
    for (int pi = 0; pi < kProjCount; ++pi) {
      const Proj p = static_cast<Proj>(pi);
      const LoraModule mod = a.module(p);
      const std::string k = "l" + std::to_string(l) + "." + mod.peft + ".";
      if (!a.targets(p) || mod.first != p || !f.has(k + "A")) continue;
      std::vector<float> A = f.f32(k + "A"), B = f.f32(k + "B");
      a.set_module_hf(l, p, A.data(), static_cast<int64_t>(A.size()), B.data(),
                      static_cast<int64_t>(B.size()));
    }
    for (int p = 0; p < kMoePartCount; ++p) {
      const std::string k = "l" + std::to_string(l) + "." + moe[p] + ".";
      if (!a.moe_active(l, MoePart(p)) || !f.has(k + "A")) continue;
      std::vector<float> A = f.f32(k + "A"), B = f.f32(k + "B");
      a.set_moe_peft(l, MoePart(p), A.data(), static_cast<int64_t>(A.size()), B.data(),
                     static_cast<int64_t>(B.size()));
    }
  }
}

// Every LoRA gradient of a (HF row order) against the fixture's {prefix}l{layer}.{proj}.gA / gB
// within tol (normalized error); the count compared, and the worst error into *worst.
inline int check_lora_grads(LoraAdapter& a, const Fixture& f, const std::string& prefix, double tol,
                            double* worst = nullptr) {
  int n = 0;
  for (int l = 0; l < a.n_layers(); ++l)
    for (int p = 0; p < kProjCount; ++p) {
      const std::string k =
          prefix + "l" + std::to_string(l) + "." + proj_peft_name(static_cast<Proj>(p)) + ".";
      if (!f.has(k + "gA")) continue;
      for (auto [part, name] :
           {std::pair{LoraAdapter::Part::dA, "gA"}, std::pair{LoraAdapter::Part::dB, "gB"}}) {
        std::vector<float> g = a.get_hf(l, static_cast<Proj>(p), part), gr = f.f32(k + name);
        EXPECT_EQ(g.size(), gr.size()) << k << name;
        if (g.size() != gr.size()) continue;
        const double e = qlft_test::max_rel_error(g.data(), gr.data(), g.size());
        EXPECT_LT(e, tol) << k << name;
        if (worst) *worst = std::max(*worst, e);
        ++n;
      }
    }
  return n;
}

inline LoadOptions keep() {
  LoadOptions o;
  o.quant_type = qlft::QuantType::Keep;
  return o;
}

// A copy of the model directory src (config.json and model.safetensors) in a temporary
// directory named by tag, its config.json edited by edit.
inline std::string edited_model_dir(const std::string& src,
                                    const std::function<void(nlohmann::json&)>& edit,
                                    const char* tag) {
  const std::string dir = qlft_test::temp_dir(tag);
  const std::vector<uint8_t> cfg = qlft_test::read_file(src + "/config.json");
  nlohmann::json j = nlohmann::json::parse(cfg.begin(), cfg.end());
  edit(j);
  const std::string text = j.dump();
  qlft_test::write_file(dir + "/config.json", text.data(), text.size());
  const std::vector<uint8_t> st = qlft_test::read_file(src + "/model.safetensors");
  qlft_test::write_file(dir + "/model.safetensors", st.data(), st.size());
  return dir;
}

inline std::string model_fixture(const std::string& rel) {
  return qlft_test::fixture_path("model/" + rel);
}

}  // namespace model_test
