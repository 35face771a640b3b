// RoPE scaling: transformers' _compute_{linear_scaling,dynamic_ntk,llama3,yarn}_parameters with
// their tensor arithmetic in float32 (a Python scalar meeting a float32 tensor is rounded to
// float first, as torch does), their Python-scalar arithmetic in double.
#include "model/rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/gguf.h"
#include "model/model.h"

namespace qlft {

namespace {

constexpr double kPi = 3.14159265358979323846;
// The largest scaling value accepted (factors, betas, lengths): it fits float and int, so no
// conversion below can overflow; real models use factors up to ~64 and lengths up to ~1e6.
constexpr double kMaxValue = 1e9;

// A positive finite number under key k of object o (named `where` in errors); def when absent
// or null, and required (def < 0 means none) otherwise.
double number(const nlohmann::json& o, const char* k, double def, const std::string& path,
              const std::string& where) {
  if (!o.contains(k) || o[k].is_null()) {
    QLFT_CHECK_FORMAT(def >= 0, "%s: key '%s.%s' is missing (RoPE scaling '%s' needs it)",
                      path.c_str(), where.c_str(), k, where.c_str());
    return def;
  }
  QLFT_CHECK_FORMAT(o[k].is_number(), "%s: key '%s.%s' is not a number", path.c_str(),
                    where.c_str(), k);
  const double v = o[k].get<double>();
  QLFT_CHECK_FORMAT(std::isfinite(v) && v > 0 && v <= kMaxValue,
                    "%s: key '%s.%s' = %g must be in (0, %g]", path.c_str(), where.c_str(), k, v,
                    kMaxValue);
  return v;
}

void check_values(const RopeScaling& s, const std::string& path, const std::string& where) {
  if (s.type == RopeType::Llama3)
    QLFT_CHECK_FORMAT(s.high_freq_factor > s.low_freq_factor,
                      "%s: '%s': high_freq_factor %g must exceed low_freq_factor %g", path.c_str(),
                      where.c_str(), s.high_freq_factor, s.low_freq_factor);
  if (s.type == RopeType::Llama3 || s.type == RopeType::Yarn)
    QLFT_CHECK_FORMAT(s.original_context > 0,
                      "%s: '%s': original_max_position_embeddings %d must be positive",
                      path.c_str(), where.c_str(), s.original_context);
}

float get_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.f : static_cast<float>(0.1 * mscale * std::log(scale) + 1.0);
}

}  // namespace

RopeScaling rope_scaling_from_hf(const nlohmann::json& root, const std::string& path, int max_pos) {
  RopeScaling s;
  // transformers: rope_parameters = rope_scaling or rope_parameters.
  const char* key = nullptr;
  for (const char* k : {"rope_scaling", "rope_parameters"})
    if (root.contains(k) && root[k].is_object() && !root[k].empty()) {
      key = k;
      break;
    }
  if (!key) return s;
  const std::string where = key;
  const nlohmann::json& o = root[key];
  std::string type = "default";
  for (const char* k : {"rope_type", "type"})
    if (o.contains(k)) {
      QLFT_CHECK_FORMAT(o[k].is_string(), "%s: key '%s.%s' is not a string", path.c_str(), key, k);
      type = o[k].get<std::string>();
      break;
    }
  for (const auto* src : {&root, &o})
    if (src->contains("partial_rotary_factor") && (*src)["partial_rotary_factor"].is_number() &&
        (*src)["partial_rotary_factor"].get<double>() != 1.0)
      throw_error(QLFT_ERR_UNSUPPORTED,
                  "%s: key 'partial_rotary_factor' = %g: partial rotary embeddings are not "
                  "supported",
                  path.c_str(), (*src)["partial_rotary_factor"].get<double>());
  if (type == "default") return s;
  if (type == "linear")
    s.type = RopeType::Linear;
  else if (type == "dynamic")
    s.type = RopeType::Dynamic;
  else if (type == "llama3")
    s.type = RopeType::Llama3;
  else if (type == "yarn")
    s.type = RopeType::Yarn;
  else if (type == "longrope" || type == "su")  // "su": early Phi-3 configs' name of it
    s.type = RopeType::LongRope;
  else
    throw_error(QLFT_ERR_UNSUPPORTED,
                "%s: key '%s.rope_type' = '%s': this RoPE scaling is not supported (default, "
                "linear, dynamic, llama3, yarn and longrope are)",
                path.c_str(), key, type.c_str());
  // Phi3-style configs keep the pretraining length beside, not inside, the scaling object;
  // transformers gives that one priority.
  double orig = max_pos;
  const bool root_orig = root.contains("original_max_position_embeddings") &&
                         root["original_max_position_embeddings"].is_number();
  if (root_orig)
    orig = number(root, "original_max_position_embeddings", -1, path, "config");
  else
    orig = number(o, "original_max_position_embeddings", max_pos, path, where);
  s.original_context = static_cast<int>(orig);
  if (s.type == RopeType::LongRope) {
    // transformers' _compute_longrope_parameters: with the config's own
    // original_max_position_embeddings (Phi-3) the factor is max_position_embeddings / it.
    s.factor = root_orig ? double(max_pos) / orig : number(o, "factor", 1, path, where);
    if (o.contains("attention_factor") && !o["attention_factor"].is_null()) {
      s.attention_factor = number(o, "attention_factor", -1, path, where);
      s.has_attention_factor = true;
    }
    for (auto [k, dst] :
         {std::pair{"short_factor", &s.short_factor}, {"long_factor", &s.long_factor}}) {
      QLFT_CHECK_FORMAT(o.contains(k) && o[k].is_array() && !o[k].empty(),
                        "%s: key '%s.%s' is missing or not a list (RoPE scaling 'longrope' needs "
                        "it)",
                        path.c_str(), key, k);
      for (const nlohmann::json& v : o[k]) {
        QLFT_CHECK_FORMAT(v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0 &&
                              v.get<double>() <= kMaxValue,
                          "%s: key '%s.%s' holds %s, not a positive number", path.c_str(), key, k,
                          v.dump().c_str());
        dst->push_back(v.get<float>());
      }
    }
    QLFT_CHECK_FORMAT(s.short_factor.size() == s.long_factor.size(),
                      "%s: '%s': short_factor has %zu values, long_factor %zu", path.c_str(), key,
                      s.short_factor.size(), s.long_factor.size());
  } else if (s.type == RopeType::Yarn) {
    // factor may be null: max_position_embeddings / original (DeepSeek-V3's convention).
    s.factor = number(o, "factor", double(max_pos) / orig, path, where);
    if (o.contains("attention_factor") && !o["attention_factor"].is_null()) {
      s.attention_factor = number(o, "attention_factor", -1, path, where);
      s.has_attention_factor = true;
    }
    // 0 is allowed here: transformers treats it as absent.
    for (auto [k, dst] : {std::pair{"mscale", &s.mscale}, {"mscale_all_dim", &s.mscale_all_dim}})
      if (o.contains(k) && o[k].is_number() && o[k].get<double>() == 0.0)
        *dst = 0;
      else
        *dst = number(o, k, 0, path, where);
    s.beta_fast = number(o, "beta_fast", 32, path, where);
    s.beta_slow = number(o, "beta_slow", 1, path, where);
    if (o.contains("truncate") && !o["truncate"].is_null()) {
      QLFT_CHECK_FORMAT(o["truncate"].is_boolean(), "%s: key '%s.truncate' is not a boolean",
                        path.c_str(), key);
      s.truncate = o["truncate"].get<bool>();
    }
  } else {
    s.factor = number(o, "factor", -1, path, where);
  }
  if (s.type == RopeType::Llama3) {
    s.low_freq_factor = number(o, "low_freq_factor", -1, path, where);
    s.high_freq_factor = number(o, "high_freq_factor", -1, path, where);
  }
  check_values(s, path, where);
  return s;
}

RopeScaling rope_scaling_from_gguf(const GgufFile& g, const std::string& a) {
  RopeScaling s;
  const std::string key = a + "rope.scaling.type";
  const std::string type = g.get_string(key, "none");
  if (type == "none" || type.empty()) return s;
  auto positive = [&](const std::string& k, double def) {
    QLFT_CHECK_FORMAT(def > 0 || g.find(k), "%s: '%s' is missing (RoPE scaling '%s' needs it)",
                      g.path().c_str(), k.c_str(), type.c_str());
    const double v = g.get_float(k, def);
    QLFT_CHECK_FORMAT(std::isfinite(v) && v > 0 && v <= kMaxValue,
                      "%s: '%s' = %g must be in (0, %g]", g.path().c_str(), k.c_str(), v,
                      kMaxValue);
    return v;
  };
  if (type == "linear") {
    s.type = RopeType::Linear;
    s.factor = positive(a + "rope.scaling.factor", -1);
  } else if (type == "yarn") {
    s.type = RopeType::Yarn;
    s.factor = positive(a + "rope.scaling.factor", -1);
    s.original_context = static_cast<int>(
        g.get_int_in(a + "rope.scaling.original_context_length", 1, int64_t(1) << 30));
    s.beta_fast = positive(a + "rope.scaling.yarn_beta_fast", 32);
    s.beta_slow = positive(a + "rope.scaling.yarn_beta_slow", 1);
    // llama.cpp multiplies its attn_factor by yarn's 1 + 0.1 ln(factor) (ggml's rope_yarn).
    if (g.find(a + "rope.scaling.attn_factor")) {
      s.attention_factor = positive(a + "rope.scaling.attn_factor", 1) * get_mscale(s.factor, 1.0);
      s.has_attention_factor = true;
    }
    // Keys whose yarn variants transformers' yarn does not have: refused, not ignored.
    for (const char* k : {"yarn_log_multiplier", "yarn_ext_factor", "yarn_attn_factor"})
      if (g.find(a + "rope.scaling." + k))
        throw_error(QLFT_ERR_UNSUPPORTED, "%s: '%srope.scaling.%s' is not supported",
                    g.path().c_str(), a.c_str(), k);
  } else {
    throw_error(QLFT_ERR_UNSUPPORTED,
                "%s: '%s' = '%s': this RoPE scaling is not supported (none, linear and yarn are; "
                "llama3 comes as the tensor rope_freqs.weight)",
                g.path().c_str(), key.c_str(), type.c_str());
  }
  check_values(s, g.path(), key);
  return s;
}

double rope_attention_factor(const RopeScaling& s) {
  if (s.type == RopeType::LongRope) {
    if (s.has_attention_factor) return s.attention_factor;
    return s.factor <= 1 ? 1.0
                         : std::sqrt(1 + std::log(s.factor) / std::log(double(s.original_context)));
  }
  if (s.type != RopeType::Yarn) return 1.0;
  if (s.has_attention_factor) return s.attention_factor;
  if (s.mscale > 0 && s.mscale_all_dim > 0)
    return double(get_mscale(s.factor, s.mscale) / get_mscale(s.factor, s.mscale_all_dim));
  return get_mscale(s.factor, 1.0);
}

RopeFreqs rope_freqs(const ModelConfig& c, int64_t seq_len) {
  const RopeScaling& s = c.rope;
  const int dim = c.head_dim, half = dim / 2;
  const float base = c.rope_theta;
  RopeFreqs f;
  f.inv_freq.resize(static_cast<size_t>(half));
  float* inv = f.inv_freq.data();
  const float factor = static_cast<float>(s.factor);
  switch (s.type) {
    case RopeType::Default:
      for (int i = 0; i < half; ++i) inv[i] = rope_inv_freq(base, i, dim);
      break;
    case RopeType::Linear:
      for (int i = 0; i < half; ++i) inv[i] = rope_inv_freq(base, i, dim) / factor;
      break;
    case RopeType::Dynamic: {
      // At or below max_position_embeddings transformers keeps the original frequencies.
      if (seq_len <= c.context_length) {
        for (int i = 0; i < half; ++i) inv[i] = rope_inv_freq(base, i, dim);
        break;
      }
      // seq_len is a tensor there: the new base is float32 arithmetic throughout.
      const float t = factor * static_cast<float>(seq_len) / static_cast<float>(c.context_length) -
                      static_cast<float>(s.factor - 1.0);
      const float b = base * powf(t, static_cast<float>(double(dim) / double(dim - 2)));
      for (int i = 0; i < half; ++i) inv[i] = rope_inv_freq(b, i, dim);
      break;
    }
    case RopeType::Llama3: {
      const float orig = static_cast<float>(s.original_context);
      const float low_wl = static_cast<float>(s.original_context / s.low_freq_factor);
      const float high_wl = static_cast<float>(s.original_context / s.high_freq_factor);
      const float lo = static_cast<float>(s.low_freq_factor);
      const float span = static_cast<float>(s.high_freq_factor - s.low_freq_factor);
      const float two_pi = static_cast<float>(2 * kPi);
      for (int i = 0; i < half; ++i) {
        const float f0 = rope_inv_freq(base, i, dim);
        const float wl = two_pi / f0;
        const float fl = wl > low_wl ? f0 / factor : f0;
        const float smooth = (orig / wl - lo) / span;
        const float smoothed = (1.f - smooth) * fl / factor + smooth * fl;
        const bool medium = !(wl < high_wl) && !(wl > low_wl);
        inv[i] = medium ? smoothed : fl;
      }
      break;
    }
    case RopeType::Yarn: {
      auto correction_dim = [&](double rot) {
        return (dim * std::log(s.original_context / (rot * 2 * kPi))) /
               (2 * std::log(double(base)));
      };
      double lo = correction_dim(s.beta_fast), hi = correction_dim(s.beta_slow);
      if (s.truncate) {
        lo = std::floor(lo);
        hi = std::ceil(hi);
      }
      lo = std::max(lo, 0.0);
      hi = std::min(hi, double(dim - 1));
      if (lo == hi) hi += 0.001;  // transformers' guard against a zero-width ramp
      const float lo_f = static_cast<float>(lo), width = static_cast<float>(hi - lo);
      for (int i = 0; i < half; ++i) {
        const float pos_freq = powf(base, static_cast<float>(2 * i) / static_cast<float>(dim));
        const float extrap = 1.f / pos_freq, interp = 1.f / (factor * pos_freq);
        const float ramp = std::min(std::max((static_cast<float>(i) - lo_f) / width, 0.f), 1.f);
        const float ext = 1.f - ramp;  // how much of pair i keeps its original frequency
        inv[i] = interp * (1.f - ext) + extrap * ext;
      }
      f.scale = static_cast<float>(rope_attention_factor(s));
      break;
    }
    case RopeType::LongRope: {
      // transformers picks long_factor once max(position) + 1 passes the original length.
      const std::vector<float>& ext = seq_len > s.original_context ? s.long_factor : s.short_factor;
      QLFT_CHECK_FORMAT(ext.size() == size_t(half),
                        "longrope: %zu factors per list, head_dim %d needs %d", ext.size(), dim,
                        half);
      for (int i = 0; i < half; ++i)
        inv[i] = 1.f /
                 (ext[size_t(i)] * powf(base, static_cast<float>(2 * i) / static_cast<float>(dim)));
      f.scale = static_cast<float>(rope_attention_factor(s));
      break;
    }
  }
  // llama.cpp's llama3 form: per-pair divisors of the plain frequencies.
  if (!s.freq_divisors.empty())
    for (int i = 0; i < half; ++i) inv[i] /= s.freq_divisors[static_cast<size_t>(i)];
  return f;
}

int rope_context_length(const ModelConfig& c) {
  const int n = c.context_length > 0 ? c.context_length : 2048;
  if (c.rope.type != RopeType::Dynamic || c.rope.factor <= 1) return n;
  return static_cast<int>(std::min(double(n) * c.rope.factor, double(1 << 24)));
}

nlohmann::json rope_scaling_json(const ModelConfig& c) {
  const RopeScaling& s = c.rope;
  if (s.type == RopeType::Default) return nullptr;
  nlohmann::json j = {{"rope_type", rope_type_name(s.type)}, {"factor", s.factor}};
  if (s.type == RopeType::Llama3) {
    j["low_freq_factor"] = s.low_freq_factor;
    j["high_freq_factor"] = s.high_freq_factor;
  }
  if (s.type == RopeType::Llama3 || s.type == RopeType::Yarn)
    j["original_max_position_embeddings"] = s.original_context;
  if (s.type == RopeType::LongRope) {
    j["original_max_position_embeddings"] = s.original_context;
    j["short_factor"] = s.short_factor;
    j["long_factor"] = s.long_factor;
    j["attention_factor"] = rope_attention_factor(s);  // as computed: no reader re-derives it
  }
  if (s.type == RopeType::Yarn) {
    j["beta_fast"] = s.beta_fast;
    j["beta_slow"] = s.beta_slow;
    j["truncate"] = s.truncate;
    // The factor as computed, so a reader need not re-derive it from mscale.
    j["attention_factor"] = rope_attention_factor(s);
  }
  return j;
}

nlohmann::json rope_parameters_json(const ModelConfig& c) {
  nlohmann::json j = rope_scaling_json(c);
  if (j.is_null()) j = {{"rope_type", "default"}};
  j["rope_theta"] = static_cast<double>(c.rope_theta);
  return j;
}

}  // namespace qlft
