#include "train/adapter_io_moe.h"

#include <cmath>
#include <vector>

#include "core/error.h"

namespace qlft {

namespace {
const char* const kPeftParam[kMoePartCount] = {"gate_up_proj", "down_proj", "gate.weight"};
constexpr const char* kGateUpPattern = ".*\\.gate_up_proj";
}  // namespace

std::string peft_moe_key(const LoraAdapter& lora, int layer, MoePart p, const char* ab) {
  // PEFT nests a module's ParamWrappers: gate_up_proj's is the inner one beside down_proj's.
  const char* module = p == MoePart::Router ? "gate"
                       : p == MoePart::GateUp && lora.moe_active(layer, MoePart::Down)
                           ? "experts.base_layer"
                           : "experts";
  return "base_model.model." + lora.model_shapes().hf_prefix + "layers." + std::to_string(layer) +
         ".mlp." + module + ".lora_" + ab + ".weight";
}

std::map<std::string, MoePeftTensor> peft_moe_tensors(const LoraAdapter& lora) {
  std::map<std::string, MoePeftTensor> m;
  for (int l = 0; l < lora.n_layers(); ++l)
    for (int p = 0; p < kMoePartCount; ++p)
      if (lora.moe_active(l, MoePart(p)))
        for (bool b : {false, true})
          m[peft_moe_key(lora, l, MoePart(p), b ? "B" : "A")] = {l, MoePart(p), b};
  return m;
}

void write_peft_moe_config(const LoraAdapter& lora, nlohmann::json& j) {
  if (!lora.has_moe()) return;
  bool on[kMoePartCount] = {};
  for (int l = 0; l < lora.n_layers(); ++l)
    for (int p = 0; p < kMoePartCount; ++p) on[p] |= lora.moe_active(l, MoePart(p));
  nlohmann::json tp = nlohmann::json::array();
  for (int p = 0; p < kMoePartCount; ++p)
    if (on[p]) tp.push_back(kPeftParam[p]);
  j["target_parameters"] = tp;
  if (on[int(MoePart::GateUp)]) {
    const LoraConfig& c = lora.config();
    j["rank_pattern"] = {{kGateUpPattern, 2 * c.r}};
    j["alpha_pattern"] = {{kGateUpPattern, 2 * c.alpha}};
  }
}

void read_peft_moe_config(const JsonFile& j, LoraConfig& c) {
  const nlohmann::json& tp =
      j.root().contains("target_parameters") ? j.root()["target_parameters"] : nlohmann::json();
  if (tp.is_null() || tp.empty()) return;
  QLFT_CHECK_FORMAT(tp.is_array(), "%s: target_parameters must be a list", j.path().c_str());
  for (const auto& x : tp) {
    const std::string n = x.is_string() ? x.get<std::string>() : "";
    auto ends = [&n](const std::string& s) {
      return n == s || (n.size() > s.size() &&
                        n.compare(n.size() - s.size() - 1, s.size() + 1, "." + s) == 0);
    };
    if (ends("gate_up_proj"))
      c.targets[int(Proj::Gate)] = c.targets[int(Proj::Up)] = true;
    else if (ends("down_proj"))
      c.targets[int(Proj::Down)] = true;
    else if (ends("gate.weight"))
      c.router = true;
    else
      throw_error(QLFT_ERR_UNSUPPORTED,
                  "%s: target_parameters '%s' is not one qlft adapts (gate_up_proj, down_proj, "
                  "gate.weight)",
                  j.path().c_str(), x.dump().c_str());
  }
  if (!c.targets[int(Proj::Gate)]) return;
  for (const auto& [field, want] : {std::pair<const char*, double>{"rank_pattern", 2.0 * c.r},
                                    {"alpha_pattern", 2.0 * c.alpha}}) {
    const nlohmann::json& pat = j.root().contains(field) ? j.root()[field] : nlohmann::json();
    const bool ok = pat.is_object() && pat.size() == 1 && pat.contains(kGateUpPattern) &&
                    pat[kGateUpPattern].is_number() &&
                    std::fabs(pat[kGateUpPattern].get<double>() - want) <= 1e-6 * want;
    QLFT_CHECK_FORMAT(ok,
                      "%s: %s is %s; PEFT adapts target_parameters gate_up_proj with {\"%s\": %g} "
                      "(twice r / lora_alpha), the only pattern qlft reads",
                      j.path().c_str(), field, pat.dump().c_str(), kGateUpPattern, want);
  }
}

std::function<void()> read_peft_moe_tensors(LoraAdapter& lora, const SafetensorsSet& st,
                                            const std::string& dir) {
  struct Pending {
    int layer;
    MoePart p;
    std::vector<float> a, b;
  };
  std::vector<Pending> pending;
  for (int l = 0; l < lora.n_layers(); ++l)
    for (int p = 0; p < kMoePartCount; ++p) {
      if (!lora.moe_active(l, MoePart(p))) continue;
      const MoeLoraSlot& s = static_cast<const LoraAdapter&>(lora).moe_slot(l, MoePart(p));
      Pending pd{l, MoePart(p), {}, {}};
      for (bool b : {false, true}) {
        const std::string key = peft_moe_key(lora, l, MoePart(p), b ? "B" : "A");
        const SafeTensorInfo* t = st.find(key);
        QLFT_CHECK_FORMAT(t, "%s/adapter_model.safetensors: tensor '%s' is missing", dir.c_str(),
                          key.c_str());
        const int64_t rows = b ? s.out : int64_t(s.experts) * s.r,
                      cols = b ? int64_t(s.experts) * s.r : s.in;
        QLFT_CHECK_FORMAT(t->shape.size() == 2 && t->shape[0] == rows && t->shape[1] == cols,
                          "%s: tensor '%s' should have shape [%lld, %lld]", t->file->c_str(),
                          key.c_str(), static_cast<long long>(rows), static_cast<long long>(cols));
        std::vector<float>& dst = b ? pd.b : pd.a;
        dst.resize(size_t(rows * cols));
        to_f32_n(t->dtype, t->data, dst.data(), dst.size());
        for (float v : dst)
          QLFT_CHECK_FORMAT(std::isfinite(v), "%s: tensor '%s' holds a non-finite value",
                            t->file->c_str(), key.c_str());
      }
      pending.push_back(std::move(pd));
    }
  return [&lora, pending = std::move(pending)] {
    for (const Pending& pd : pending)
      lora.set_moe_peft(pd.layer, pd.p, pd.a.data(), int64_t(pd.a.size()), pd.b.data(),
                        int64_t(pd.b.size()));
  };
}

}  // namespace qlft
