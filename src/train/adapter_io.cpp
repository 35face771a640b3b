#include "train/adapter_io.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/atomic_file.h"
#include "formats/gguf_writer.h"
#include "formats/json_file.h"
#include "formats/safetensors.h"
#include "formats/safetensors_writer.h"

namespace qlft {

namespace {

std::string peft_key(int layer, Proj p, const char* ab) {
  const char* group = static_cast<int>(p) < 4 ? "self_attn" : "mlp";
  return "base_model.model.model.layers." + std::to_string(layer) + "." + group + "." +
         proj_peft_name(p) + ".lora_" + ab + ".weight";
}

void make_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    throw_error(QLFT_ERR_IO, "%s: cannot create directory: %s", dir.c_str(), std::strerror(errno));
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw_error(QLFT_ERR_IO, "%s: exists and is not a directory", dir.c_str());
}

}  // namespace

void save_peft_adapter(const LoraAdapter& lora, const std::string& dir,
                       const std::string& base_model) {
  const LoraConfig& c = lora.config();
  make_dir(dir);
  SafetensorsWriter w;
  w.set_metadata("format", "pt");
  for (int l = 0; l < lora.n_layers(); ++l)
    for (int pi = 0; pi < kProjCount; ++pi) {
      Proj p = static_cast<Proj>(pi);
      if (!lora.targets(p)) continue;
      const LoraSlot& s = lora.slot(l, p);
      std::vector<float> a = lora.get_hf(l, p, LoraAdapter::Part::A);
      std::vector<float> b = lora.get_hf(l, p, LoraAdapter::Part::B);
      w.add_f32(peft_key(l, p, "A"), {c.r, s.in}, a.data());
      w.add_f32(peft_key(l, p, "B"), {s.out, c.r}, b.data());
    }
  nlohmann::json targets = nlohmann::json::array();
  for (int pi = 0; pi < kProjCount; ++pi)
    if (c.targets[pi]) targets.push_back(proj_peft_name(static_cast<Proj>(pi)));
  nlohmann::json j = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", base_model},
      {"r", c.r},
      {"lora_alpha", c.alpha},
      {"lora_dropout", c.dropout},
      {"use_rslora", c.use_rslora},
      {"target_modules", targets},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"modules_to_save", nullptr},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"rank_pattern", nlohmann::json::object()},
      {"alpha_pattern", nlohmann::json::object()},
      {"use_dora", false},
      {"revision", nullptr},
  };
  // Tensors first: a reader that finds adapter_config.json finds complete weights beside it.
  w.write(dir + "/adapter_model.safetensors");
  write_file_atomic(dir + "/adapter_config.json", j.dump(2) + "\n");
}

LoraConfig read_peft_config(const std::string& dir) {
  JsonFile j = JsonFile::load(dir + "/adapter_config.json");
  std::string type = j.get_string("peft_type", "LORA");
  QLFT_CHECK_FORMAT(type == "LORA", "%s: peft_type is '%s', only LORA is supported",
                    j.path().c_str(), type.c_str());
  LoraConfig c;
  c.r = static_cast<int>(j.get_int("r"));
  QLFT_CHECK_FORMAT(c.r > 0 && c.r <= 65536, "%s: r must be in 1..65536", j.path().c_str());
  c.alpha = static_cast<float>(j.get_float("lora_alpha", c.r));
  c.dropout = static_cast<float>(j.get_float("lora_dropout", 0.0));
  c.use_rslora = j.get_bool("use_rslora", false);
  QLFT_CHECK_FORMAT(!j.get_bool("use_dora", false), "%s: DoRA adapters are not supported",
                    j.path().c_str());
  const nlohmann::json& t =
      j.root().contains("target_modules") ? j.root()["target_modules"] : nlohmann::json();
  std::string list;
  if (t.is_array()) {
    for (const auto& x : t) {
      QLFT_CHECK_FORMAT(x.is_string(), "%s: target_modules must be strings", j.path().c_str());
      list += x.get<std::string>() + ",";
    }
  } else if (t.is_string()) {
    throw_error(QLFT_ERR_UNSUPPORTED, "%s: target_modules as a regex ('%s') is not supported",
                j.path().c_str(), t.get<std::string>().c_str());
  } else {
    throw_error(QLFT_ERR_FORMAT, "%s: target_modules is missing", j.path().c_str());
  }
  try {
    c.set_targets(list);
  } catch (const Error& e) {
    throw_error(QLFT_ERR_FORMAT, "%s: %s", j.path().c_str(), e.what());
  }
  return c;
}

void load_peft_adapter(LoraAdapter& lora, const std::string& dir) {
  LoraConfig file = read_peft_config(dir);
  const LoraConfig& c = lora.config();
  const std::string cfg_path = dir + "/adapter_config.json";
  QLFT_CHECK_ARG(file.r == c.r, "%s: r is %d but the trainer's lora.r is %d", cfg_path.c_str(),
                 file.r, c.r);
  QLFT_CHECK_ARG(std::fabs(file.alpha - c.alpha) <= 1e-6f * std::fabs(c.alpha),
                 "%s: lora_alpha is %g but the trainer's lora.alpha is %g", cfg_path.c_str(),
                 file.alpha, c.alpha);
  QLFT_CHECK_ARG(file.use_rslora == c.use_rslora, "%s: use_rslora differs from lora.use_rslora",
                 cfg_path.c_str());
  QLFT_CHECK_ARG(file.targets_string() == c.targets_string(),
                 "%s: target_modules %s differ from lora.target_modules %s", cfg_path.c_str(),
                 file.targets_string().c_str(), c.targets_string().c_str());
  auto st = SafetensorsSet::open(dir + "/adapter_model.safetensors");
  // Read everything first, then assign: a bad file leaves the adapter as it was.
  struct Pending {
    int layer;
    Proj p;
    std::vector<float> a, b;
  };
  std::vector<Pending> pending;
  for (int l = 0; l < lora.n_layers(); ++l)
    for (int pi = 0; pi < kProjCount; ++pi) {
      Proj p = static_cast<Proj>(pi);
      if (!lora.targets(p)) continue;
      const LoraSlot& s = lora.slot(l, p);
      Pending pd{l, p, {}, {}};
      const char* parts[2] = {"A", "B"};
      for (int k = 0; k < 2; ++k) {
        std::string key = peft_key(l, p, parts[k]);
        const SafeTensorInfo* t = st->find(key);
        if (!t) {  // PEFT also writes the adapter name into keys in some versions
          std::string alt = key;
          alt.replace(alt.rfind(".weight"), 7, ".default.weight");
          t = st->find(alt);
        }
        QLFT_CHECK_FORMAT(t, "%s/adapter_model.safetensors: tensor '%s' is missing", dir.c_str(),
                          key.c_str());
        int64_t rows = k == 0 ? c.r : s.out, cols = k == 0 ? s.in : c.r;
        QLFT_CHECK_FORMAT(t->shape.size() == 2 && t->shape[0] == rows && t->shape[1] == cols,
                          "%s: tensor '%s' should have shape [%lld, %lld]", t->file->c_str(),
                          key.c_str(), static_cast<long long>(rows), static_cast<long long>(cols));
        std::vector<float>& dst = k == 0 ? pd.a : pd.b;
        dst.resize(rows * cols);
        to_f32_n(t->dtype, t->data, dst.data(), dst.size());
        for (float v : dst)
          QLFT_CHECK_FORMAT(std::isfinite(v), "%s: tensor '%s' holds a non-finite value",
                            t->file->c_str(), key.c_str());
      }
      pending.push_back(std::move(pd));
    }
  for (Pending& pd : pending)
    lora.set_hf(pd.layer, pd.p, pd.a.data(), static_cast<int64_t>(pd.a.size()), pd.b.data(),
                static_cast<int64_t>(pd.b.size()));
}

void save_gguf_lora_adapter(const LoraAdapter& lora, const std::string& path) {
  const LoraConfig& c = lora.config();
  const ModelConfig& m = lora.model_config();
  GgufWriter w;
  // llama.cpp has no "mistral" architecture: its converter writes Mistral models as "llama",
  // and the loader requires the adapter's architecture to equal the base model's.
  w.add_string("general.architecture", m.arch == "mistral" ? "llama" : m.arch);
  w.add_string("general.type", "adapter");
  w.add_string("adapter.type", "lora");
  // llama.cpp scales by alpha / r; rsLoRA's alpha / sqrt(r) needs alpha * sqrt(r) there.
  float alpha = c.use_rslora ? c.alpha * std::sqrt(static_cast<float>(c.r)) : c.alpha;
  w.add_f32("adapter.lora.alpha", alpha);
  // llama.cpp's llama/mistral base weights have q/k rows permuted to adjacent pairs; qwen2's not.
  const bool adjacent = m.arch != "qwen2";
  for (int l = 0; l < lora.n_layers(); ++l)
    for (int pi = 0; pi < kProjCount; ++pi) {
      Proj p = static_cast<Proj>(pi);
      if (!lora.targets(p)) continue;
      const LoraSlot& s = lora.slot(l, p);
      std::vector<float> a = lora.get_hf(l, p, LoraAdapter::Part::A);
      std::vector<float> b = lora.get_hf(l, p, LoraAdapter::Part::B);
      if (adjacent && (p == Proj::Q || p == Proj::K)) {
        std::vector<float> perm(b.size());
        int heads = p == Proj::Q ? m.n_heads : m.n_kv_heads;
        permute_rows_hf_to_adjacent(b.data(), perm.data(), heads, m.head_dim, c.r);
        b.swap(perm);
      }
      std::string base = "blk." + std::to_string(l) + "." + proj_gguf_name(p) + ".weight";
      w.add_tensor_f32(base + ".lora_a", {s.in, c.r}, a.data());
      w.add_tensor_f32(base + ".lora_b", {c.r, s.out}, b.data());
    }
  w.write(path);
}

}  // namespace qlft
