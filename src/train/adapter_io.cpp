#include "train/adapter_io.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <utility>
#include <nlohmann/json.hpp>

#include "arch/families.h"
#include "config/keys.h"
#include "core/error.h"
#include "formats/atomic_file.h"
#include "formats/gguf_writer.h"
#include "formats/json_file.h"
#include "formats/safetensors.h"
#include "formats/safetensors_writer.h"
#include "formats/temp_marker.h"
#include "train/adapter_io_moe.h"

namespace qlft {

namespace {

// name: the module's (proj_peft_name, or a fused family's qkv_proj / gate_up_proj), under the
// model's decoder (ModelShapes::hf_prefix: model.language_model. for an image-text model).
std::string peft_module(const LoraAdapter& lora, int layer, Proj p, const char* name) {
  const char* group = static_cast<int>(p) < 4 ? "self_attn" : "mlp";
  return "base_model.model." + lora.model_shapes().hf_prefix + "layers." + std::to_string(layer) +
         "." + group + "." + name;
}

std::string peft_key(const LoraAdapter& lora, int layer, const LoraModule& m, const char* ab) {
  return peft_module(lora, layer, m.first, m.peft) + ".lora_" + ab + ".weight";
}

// DoRA's magnitude as PEFT saves it (its ".lora_magnitude_vector.<adapter>.weight" with the
// adapter name and ".weight" taken out).
std::string peft_magnitude_key(const LoraAdapter& lora, int layer, Proj p) {
  return peft_module(lora, layer, p, proj_peft_name(p)) + ".lora_magnitude_vector";
}

// target_modules of an image-text model's adapter: PEFT matches a list by the modules' last
// names, which would reach the vision tower's q_proj / k_proj / v_proj too, and a string as a
// regex over the whole module name. qlft writes this one and reads its names back.
constexpr const char* kLanguageModelTargets = ".*language_model.*\\.(";

void make_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0)
    throw_error(QLFT_ERR_IO, "%s: cannot create directory: %s", dir.c_str(), std::strerror(errno));
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

std::string parent_of(const std::string& p) {
  size_t s = p.find_last_not_of('/');
  s = s == std::string::npos ? std::string::npos : p.rfind('/', s);
  if (s == std::string::npos) return ".";
  return s == 0 ? "/" : p.substr(0, s);
}

// Puts the complete directory tmp at dir in one step: a reader sees the old adapter or the new
// one, never a mix. An existing dir is swapped out atomically (renameat2 RENAME_EXCHANGE) and
// removed; where the file system cannot exchange, the old directory is moved aside to
// <dir>.old.<pid> first (a crash in that window leaves it there; the CLI's run directory puts
// it back on its next start).
void install_dir(const std::string& tmp, const std::string& dir) {
  crash_point();
  struct stat st;
  const bool exists = ::lstat(dir.c_str(), &st) == 0;
  if (exists && !S_ISDIR(st.st_mode))
    throw_error(QLFT_ERR_IO, "%s: exists and is not a directory", dir.c_str());
  if (!exists) {
    if (::rename(tmp.c_str(), dir.c_str()) != 0)
      throw_error(QLFT_ERR_IO, "%s: rename from %s failed: %s", dir.c_str(), tmp.c_str(),
                  std::strerror(errno));
  } else if (temp::mark_path(dir, tmp),  // the old adapter lands at tmp: a marked leftover there
             ::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    crash_point();
    std::error_code ec;
    std::filesystem::remove_all(tmp, ec);  // now the old adapter; a leftover is only garbage
  } else {
    const std::string old = temp::old_path(dir);
    temp::mark_path(dir, old);
    if (::rename(dir.c_str(), old.c_str()) != 0)
      throw_error(QLFT_ERR_IO, "%s: cannot move the old adapter aside: %s", dir.c_str(),
                  std::strerror(errno));
    crash_point();
    if (::rename(tmp.c_str(), dir.c_str()) != 0) {
      int e = errno;
      ::rename(old.c_str(), dir.c_str());
      throw_error(QLFT_ERR_IO, "%s: rename from %s failed: %s", dir.c_str(), tmp.c_str(),
                  std::strerror(e));
    }
    std::error_code ec;
    std::filesystem::remove_all(old, ec);
  }
  crash_point();
  temp::unmark_path(dir);  // its marker named the temporary; this is the adapter now
  fsync_dir(parent_of(dir));
}

// The new adapter keeps the permissions of the one it replaces: the directory's and each file's
// (a 0600 adapter stays 0600); new files keep the writers' default.
void keep_modes(const std::string& old_dir, const std::string& tmp) {
  struct stat st;
  if (::stat(old_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return;
  ::chmod(tmp.c_str(), st.st_mode & 07777);
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(tmp, ec)) {
    const std::string old = old_dir + "/" + e.path().filename().string();
    if (::stat(old.c_str(), &st) == 0 && S_ISREG(st.st_mode))
      ::chmod(e.path().c_str(), st.st_mode & 07777);
  }
}

// An existing directory at the adapter's path is replaced whole, so it must hold an adapter and
// nothing else: a directory with other files (a model, data) is refused, never deleted.
void check_replaceable(const std::string& dir) {
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) return;
  if (!S_ISDIR(st.st_mode))
    throw_error(QLFT_ERR_IO, "%s: exists and is not a directory", dir.c_str());
  static const char* kAdapterFiles[] = {"adapter_config.json", "adapter_model.safetensors",
                                        "adapter_model.bin", "README.md", kBaseStorageFile};
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    bool ok = n.find(".tmp.") != std::string::npos;
    for (const char* a : kAdapterFiles) ok |= n == a;
    if (!ok)
      throw_error(QLFT_ERR_INVALID_ARGUMENT,
                  "%s: exists and holds '%s', which is not part of a PEFT adapter; the adapter "
                  "directory is replaced whole, so choose an empty or new path",
                  dir.c_str(), n.c_str());
  }
}

// Removes a half-written temporary adapter directory when saving fails.
struct TempDir {
  std::string path;
  bool keep = false;
  ~TempDir() {
    if (keep) return;
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// One of an adapter's tensors (an export's deferred tensor).
struct AdapterPart {
  int layer = 0;
  Proj p = Proj::Q;
  LoraAdapter::Part part = LoraAdapter::Part::A;
};

// An adapter tensor's host values (A or B of a slot).
void check_finite(const Buffer& values, const std::string& what) {
  const float* v = values.as<float>();
  for (size_t i = 0; i < values.size() / sizeof(float); ++i)
    if (!std::isfinite(v[i]))
      throw_error(QLFT_ERR_NUMERICAL,
                  "%s holds a non-finite value: the adapter is not written (training diverged; "
                  "the last finite checkpoint is kept)",
                  what.c_str());
}

// Both adapter writers: every adapted module's A and B (and DoRA's magnitude), named as the
// file names them (names(layer, module) -> {A's name, B's name}), checked finite, declared to
// the writer by add(a, b, m, slot, out) with out B's rows (a fused module's: its parts'),
// and mapped back from name to part for the writer's deferred fetch of each tensor's values
// (LoraAdapter::get_module_hf: a fused module's B is its parts' rows stacked).
template <class Names, class Add>
std::map<std::string, AdapterPart> adapter_parts(const LoraAdapter& lora, const Names& names,
                                                 const Add& add) {
  std::map<std::string, AdapterPart> parts;
  for (int l = 0; l < lora.n_layers(); ++l)
    for (int pi = 0; pi < kProjCount; ++pi) {
      const Proj p = static_cast<Proj>(pi);
      const LoraModule mod = lora.module(p);
      // (an MoE layer has no dense gate / up / down: its targets adapt the experts)
      if (!lora.targets(p) || mod.first != p || !lora.active(l, p)) continue;
      const LoraSlot& s = lora.slot(l, p);
      const auto [a, b] = names(l, mod);
      check_finite(s.A, a);
      int64_t out = 0;
      for (Proj part : mod.parts) {
        check_finite(lora.slot(l, part).B, b);
        out += lora.slot(l, part).out;
      }
      // DoRA's magnitude (only the PEFT writer is handed a DoRA adapter): its name, else "".
      const std::string m = s.M.empty() ? "" : peft_magnitude_key(lora, l, p);
      if (!m.empty()) check_finite(s.M, m);
      add(a, b, m, s, out);
      parts[a] = {l, p, LoraAdapter::Part::A};
      parts[b] = {l, p, LoraAdapter::Part::B};
      if (!m.empty()) parts[m] = {l, p, LoraAdapter::Part::M};
    }
  return parts;
}

// Whether a layer of lora's model has projection p (an MoE layer's gate / up / down adapt its
// experts: target_parameters).
bool any_layer_has(const LoraAdapter& lora, Proj p) {
  for (int l = 0; l < lora.n_layers(); ++l)
    if (lora.active(l, p)) return true;
  return false;
}

// A value of adapter_config.json held to the range of the setting it corresponds to.
double checked_number(const JsonFile& j, const char* field, double fallback, const char* key) {
  const KeyDef* k = find_key(key);
  double v = j.get_float(field, fallback);
  QLFT_CHECK_FORMAT(std::isfinite(v) && (!k || (v >= k->min && v <= k->max)),
                    "%s: %s is %g, outside %s (the range of the setting %s)", j.path().c_str(),
                    field, v, k ? key_allowed(*k).c_str() : "finite", key);
  return v;
}

}  // namespace

void save_peft_adapter(const LoraAdapter& lora, const std::string& dir,
                       const std::string& base_model, const BaseStorage& base) {
  QLFT_CHECK_ARG(!dir.empty(), "the adapter directory path is empty");
  // A PiSSA / OLoRA start is written as PEFT converts one (path_initial_model_for_weight_
  // conversion): a plain rank-2r adapter on the original base.
  if (lora.has_start())
    return save_peft_adapter(*lora.folded_start(nullptr), dir, base_model, base);
  const LoraConfig& c = lora.config();
  // Everything goes into <dir>.tmp.<pid> first, then one rename puts it at dir.
  std::string target = dir;
  while (target.size() > 1 && target.back() == '/') target.pop_back();
  check_replaceable(target);
  TempDir tmp{temp::temp_path(target)};
  // Killed saves' temporaries of this adapter (marked, their process gone); nothing else.
  temp::remove_stale(parent_of(target), target.substr(target.rfind('/') + 1), false);
  make_dir(tmp.path);
  temp::mark_path(tmp.path, tmp.path);
  // Each tensor's HF-order values are made when the writer reaches it, one at a time: no copy
  // of the whole adapter (with two, it was 9.8 MiB of rank 0's peak heap for SmolLM2, r 8).
  SafetensorsWriter w;
  w.set_metadata("format", "pt");
  std::map<std::string, AdapterPart> parts = adapter_parts(
      lora,
      [&lora](int l, const LoraModule& mod) {
        return std::pair{peft_key(lora, l, mod, "A"), peft_key(lora, l, mod, "B")};
      },
      [&](const std::string& a, const std::string& b, const std::string& m, const LoraSlot& s,
          int64_t out) {
        w.add_tensor_deferred(a, DType::F32, {c.r, s.in}, s.A.size());
        w.add_tensor_deferred(b, DType::F32, {out, c.r}, static_cast<size_t>(out) * c.r * 4);
        if (!m.empty()) w.add_tensor_deferred(m, DType::F32, {s.out}, s.M.size());
      });
  const std::map<std::string, MoePeftTensor> moe = peft_moe_tensors(lora);
  for (const auto& [name, t] : moe) {  // an MoE layer's expert / router LoRA
    const MoeLoraSlot& s = lora.moe_slot(t.layer, t.p);
    check_finite(t.b ? s.B : s.A, name);
    const int64_t er = int64_t(s.experts) * s.r;
    w.add_tensor_deferred(name, DType::F32,
                          t.b ? std::vector<int64_t>{s.out, er} : std::vector<int64_t>{er, s.in},
                          size_t(t.b ? s.b_n() : s.a_n()) * 4);
  }
  std::vector<float> scratch;
  auto fetch = [&](const std::string& name) -> const void* {
    if (auto it = moe.find(name); it != moe.end()) {
      scratch = lora.get_moe_peft(it->second.layer, it->second.p, it->second.b);
      return scratch.data();
    }
    const AdapterPart& at = parts.at(name);
    scratch = lora.get_module_hf(at.layer, at.p, at.part);
    return scratch.data();
  };
  nlohmann::json targets = nlohmann::json::array();  // by module: qkv_proj for a fused family
  for (int pi = 0; pi < kProjCount; ++pi)
    if (const LoraModule mod = lora.module(static_cast<Proj>(pi));
        c.targets[pi] && mod.first == static_cast<Proj>(pi) && any_layer_has(lora, mod.first))
      targets.push_back(mod.peft);
  if (lora.model_shapes().image_text) {  // the language model's projections alone
    std::string re = kLanguageModelTargets;
    for (size_t i = 0; i < targets.size(); ++i)
      re += (i ? "|" : "") + targets[i].get<std::string>();
    targets = re + ")";
  }
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
      {"use_dora", c.use_dora},
      {"revision", nullptr},
  };
  write_peft_moe_config(lora, j);
  try {
    w.write(tmp.path + "/adapter_model.safetensors", fetch);
    write_file_atomic(tmp.path + "/adapter_config.json", j.dump(2) + "\n");
    // How the base was stored while training, as settings (JSON is YAML: the CLI loads this
    // file as a config fragment); PEFT ignores files it does not know.
    if (!base.quant_type.empty()) {
      nlohmann::json b = {{"quant.type", base.quant_type},
                          {"quant.double_quant", base.double_quant},
                          {"quant.blocksize", base.blocksize}};
      write_file_atomic(tmp.path + "/" + kBaseStorageFile, b.dump(2) + "\n");
    }
  } catch (const Error& e) {
    throw_error(e.status(), "%s: the adapter was not saved (the previous one is kept): %s",
                target.c_str(), e.what());
  }
  keep_modes(target, tmp.path);
  fsync_dir(tmp.path);
  install_dir(tmp.path, target);
  tmp.keep = true;
}

LoraConfig read_peft_config(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
    throw_error(QLFT_ERR_INVALID_ARGUMENT,
                "%s: not a directory; an adapter here is a PEFT directory (adapter_config.json + "
                "adapter_model.safetensors, as train writes to train.output_dir/adapter)%s",
                dir.c_str(),
                dir.size() > 5 && dir.compare(dir.size() - 5, 5, ".gguf") == 0
                    ? "; a .gguf adapter is for llama.cpp (llama-cli --lora)"
                    : "");
  JsonFile j = JsonFile::load(dir + "/adapter_config.json");
  std::string type = j.get_string("peft_type", "LORA");
  QLFT_CHECK_FORMAT(type == "LORA", "%s: peft_type is '%s', only LORA is supported",
                    j.path().c_str(), type.c_str());
  LoraConfig c;
  c.r = static_cast<int>(j.get_int("r"));
  QLFT_CHECK_FORMAT(c.r > 0 && c.r <= 65536, "%s: r must be in 1..65536", j.path().c_str());
  c.alpha = static_cast<float>(checked_number(j, "lora_alpha", c.r, "lora.alpha"));
  c.dropout = static_cast<float>(checked_number(j, "lora_dropout", 0.0, "lora.dropout"));
  c.use_rslora = j.get_bool("use_rslora", false);
  c.use_dora = j.get_bool("use_dora", false);
  const nlohmann::json& t =
      j.root().contains("target_modules") ? j.root()["target_modules"] : nlohmann::json();
  std::string list;
  if (t.is_array()) {
    for (const auto& x : t) {
      QLFT_CHECK_FORMAT(x.is_string(), "%s: target_modules must be strings", j.path().c_str());
      list += x.get<std::string>() + ",";
    }
  } else if (const std::string re = t.is_string() ? t.get<std::string>() : "";
             re.rfind(kLanguageModelTargets, 0) == 0 && re.back() == ')') {
    // An image-text model's: the names in the parentheses.
    std::string names = re.substr(std::strlen(kLanguageModelTargets));
    names.pop_back();
    for (char& ch : names)
      if (ch == '|') ch = ',';
    list = names + ",";
  } else if (t.is_string()) {
    throw_error(QLFT_ERR_UNSUPPORTED,
                "%s: target_modules as a regex ('%s') is not supported (only the form "
                "'%s...)' qlft writes for an image-text model's language model)",
                j.path().c_str(), re.c_str(), kLanguageModelTargets);
  } else {
    throw_error(QLFT_ERR_FORMAT, "%s: target_modules is missing", j.path().c_str());
  }
  try {
    c.set_targets(list);
  } catch (const Error& e) {
    throw_error(QLFT_ERR_FORMAT, "%s: %s", j.path().c_str(), e.what());
  }
  read_peft_moe_config(j, c);  // an MoE model's experts / router (target_parameters)
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
  QLFT_CHECK_ARG(file.use_dora == c.use_dora, "%s: use_dora differs from lora.use_dora",
                 cfg_path.c_str());
  QLFT_CHECK_ARG(file.targets_string() == c.targets_string(),
                 "%s: target_modules %s differ from lora.target_modules %s", cfg_path.c_str(),
                 file.targets_string().c_str(), c.targets_string().c_str());
  auto st = SafetensorsSet::open(dir + "/adapter_model.safetensors");
  // Read everything first, then assign: a bad file leaves the adapter as it was.
  struct Pending {
    int layer;
    Proj p;
    std::vector<float> a, b, m;
  };
  std::vector<Pending> pending;
  for (int l = 0; l < lora.n_layers(); ++l)
    for (int pi = 0; pi < kProjCount; ++pi) {
      Proj p = static_cast<Proj>(pi);
      const LoraModule mod = lora.module(p);  // a fused family's qkv_proj / gate_up_proj whole
      if (!lora.targets(p) || mod.first != p || !lora.active(l, p)) continue;  // (MoE: below)
      const LoraSlot& s = lora.slot(l, p);
      int64_t out = 0;
      for (Proj part : mod.parts) out += lora.slot(l, part).out;
      Pending pd{l, p, {}, {}, {}};
      const char* parts[2] = {"A", "B"};
      for (int k = 0; k < 2; ++k) {
        std::string key = peft_key(lora, l, mod, parts[k]);
        const SafeTensorInfo* t = st->find(key);
        if (!t) {  // PEFT also writes the adapter name into keys in some versions
          std::string alt = key;
          alt.replace(alt.rfind(".weight"), 7, ".default.weight");
          t = st->find(alt);
        }
        QLFT_CHECK_FORMAT(t, "%s/adapter_model.safetensors: tensor '%s' is missing", dir.c_str(),
                          key.c_str());
        int64_t rows = k == 0 ? c.r : out, cols = k == 0 ? s.in : c.r;
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
      if (c.use_dora) {
        const std::string key = peft_magnitude_key(lora, l, p);
        const SafeTensorInfo* t = st->find(key);
        QLFT_CHECK_FORMAT(t, "%s/adapter_model.safetensors: DoRA tensor '%s' is missing",
                          dir.c_str(), key.c_str());
        QLFT_CHECK_FORMAT(t->shape.size() == 1 && t->shape[0] == s.out,
                          "%s: tensor '%s' should have shape [%d]", t->file->c_str(), key.c_str(),
                          s.out);
        pd.m.resize(static_cast<size_t>(s.out));
        to_f32_n(t->dtype, t->data, pd.m.data(), pd.m.size());
        for (float v : pd.m)
          QLFT_CHECK_FORMAT(std::isfinite(v), "%s: tensor '%s' holds a non-finite value",
                            t->file->c_str(), key.c_str());
      }
      pending.push_back(std::move(pd));
    }
  const std::function<void()> set_moe = read_peft_moe_tensors(lora, *st, dir);
  set_moe();
  for (Pending& pd : pending) {
    lora.set_module_hf(pd.layer, pd.p, pd.a.data(), static_cast<int64_t>(pd.a.size()), pd.b.data(),
                       static_cast<int64_t>(pd.b.size()));
    if (!pd.m.empty())
      lora.set_magnitude_hf(pd.layer, pd.p, pd.m.data(), static_cast<int64_t>(pd.m.size()));
  }
}

// An MoE layer's expert / router LoRA in llama.cpp's LoRA GGUF: what convert_lora_to_gguf.py
// makes of the per-expert adapter PEFT's target_parameters factors equal (its base converter
// stacks the experts' w1 / w3 / w2 LoRA), applied by llama.cpp's build_lora_mm_id: lora_a
// [E, r, in] and lora_b [E, out, r] (ggml ne {in, r, E} / {r, out, E}) of ffn_gate_exps and
// ffn_up_exps (gate_up's A for both, B's gate rows / up rows), ffn_down_exps; the router's as
// ffn_gate_inp (2-D). llama.cpp scales each tensor by adapter.lora.alpha / its rank, so lora_b
// carries the part's own scale (PEFT's rank / alpha pattern: gate_up at 2r, 2 alpha) beside it.
struct MoeGgufPart {
  int layer = 0;
  MoePart p = MoePart::GateUp;
  bool b = false;
  int64_t row0 = 0, rows = 0;  // lora_b: the part's B rows written
  float factor = 1.f;          // lora_b: times this
};

std::map<std::string, MoeGgufPart> moe_gguf_parts(const LoraAdapter& lora, float alpha,
                                                  GgufWriter& w) {
  std::map<std::string, MoeGgufPart> parts;
  if (!lora.has_moe()) return parts;
  for (int l = 0; l < lora.n_layers(); ++l)
    for (int pi = 0; pi < kMoePartCount; ++pi) {
      const MoePart p = static_cast<MoePart>(pi);
      if (!lora.moe_active(l, p)) continue;
      const MoeLoraSlot& s = lora.moe_slot(l, p);
      const float factor = s.scale * static_cast<float>(s.r) / alpha;
      auto add = [&](const char* tensor, int64_t row0, int64_t rows) {
        const std::string base = "blk." + std::to_string(l) + "." + tensor + ".weight.lora_";
        check_finite(s.A, base + "a");
        check_finite(s.B, base + "b");
        std::vector<int64_t> a{s.in, s.r}, b{s.r, rows};
        if (p != MoePart::Router) a.push_back(s.experts), b.push_back(s.experts);
        w.add_tensor_deferred(base + "a", GgmlType::F32, a, static_cast<uint64_t>(s.a_n()) * 4);
        w.add_tensor_deferred(base + "b", GgmlType::F32, b,
                              static_cast<uint64_t>(s.experts) * rows * s.r * 4);
        parts[base + "a"] = MoeGgufPart{l, p, false, 0, 0, 1.f};
        parts[base + "b"] = MoeGgufPart{l, p, true, row0, rows, factor};
      };
      if (p == MoePart::GateUp) {
        add("ffn_gate_exps", 0, s.out / 2);
        add("ffn_up_exps", s.out / 2, s.out / 2);
      } else {
        add(p == MoePart::Down ? "ffn_down_exps" : "ffn_gate_inp", 0, s.out);
      }
    }
  return parts;
}

// A moe_gguf_parts tensor's values (B held expert by expert: [E, out, r]).
std::vector<float> moe_gguf_values(const LoraAdapter& lora, const MoeGgufPart& at) {
  const MoeLoraSlot& s = lora.moe_slot(at.layer, at.p);
  if (!at.b) return std::vector<float>(s.A.as<float>(), s.A.as<float>() + s.a_n());
  std::vector<float> v;
  v.reserve(static_cast<size_t>(s.experts * at.rows * s.r));
  for (int e = 0; e < s.experts; ++e) {
    const float* rows = s.B.as<float>() + (e * s.out + at.row0) * s.r;
    for (int64_t i = 0; i < at.rows * s.r; ++i) v.push_back(rows[i] * at.factor);
  }
  return v;
}

void save_gguf_lora_adapter(const LoraAdapter& lora, const std::string& path) {
  if (lora.config().use_dora)
    throw_error(QLFT_ERR_UNSUPPORTED,
                "%s: llama.cpp's LoRA GGUF has no DoRA magnitude; export a DoRA adapter as PEFT "
                "or as a merged model",
                path.c_str());
  if (lora.has_start()) return save_gguf_lora_adapter(*lora.folded_start(nullptr), path);
  const LoraConfig& c = lora.config();
  const ModelShapes& m = lora.model_shapes();
  const ArchFamily* fam = find_family(m.arch);
  QLFT_CHECK_ARG(fam, "GGUF LoRA export: architecture '%s' is not supported", m.arch.c_str());
  GgufWriter w;
  // llama.cpp has no "mistral" architecture: its converter writes Mistral models as "llama",
  // and the loader requires the adapter's architecture to equal the base model's.
  w.add_string("general.architecture", fam->gguf_arch);
  w.add_string("general.type", "adapter");
  w.add_string("adapter.type", "lora");
  // llama.cpp scales by alpha / r; rsLoRA's alpha / sqrt(r) needs alpha * sqrt(r) there.
  float alpha = c.use_rslora ? c.alpha * std::sqrt(static_cast<float>(c.r)) : c.alpha;
  w.add_f32("adapter.lora.alpha", alpha);
  // llama.cpp's llama/mistral base weights have q/k rows permuted to adjacent pairs; qwen2's not.
  const bool adjacent = fam->gguf_qk_adjacent;
  // As save_peft_adapter: each tensor made when the writer reaches it.
  std::map<std::string, AdapterPart> parts = adapter_parts(
      lora,
      // llama.cpp's phi3 applies LoRA to its fused attn_qkv and ffn_up by these names too.
      [](int l, const LoraModule& mod) {
        const std::string base = "blk." + std::to_string(l) + "." + mod.gguf + ".weight";
        return std::pair{base + ".lora_a", base + ".lora_b"};
      },
      [&](const std::string& a, const std::string& b, const std::string&, const LoraSlot& s,
          int64_t out) {
        w.add_tensor_deferred(a, GgmlType::F32, {s.in, c.r}, s.A.size());
        w.add_tensor_deferred(b, GgmlType::F32, {c.r, out}, static_cast<size_t>(out) * c.r * 4);
      });
  const std::map<std::string, MoeGgufPart> moe = moe_gguf_parts(lora, alpha, w);
  std::vector<float> scratch, perm;
  w.write(path, [&](const std::string& name) -> const void* {
    if (auto it = moe.find(name); it != moe.end()) {
      scratch = moe_gguf_values(lora, it->second);
      return scratch.data();
    }
    const AdapterPart& at = parts.at(name);
    scratch = lora.get_module_hf(at.layer, at.p, at.part);
    if (at.part == LoraAdapter::Part::B && adjacent && (at.p == Proj::Q || at.p == Proj::K)) {
      perm.resize(scratch.size());
      permute_rows_hf_to_adjacent(scratch.data(), perm.data(), m.heads_of(at.p), m.head_dim, c.r);
      return perm.data();
    }
    return scratch.data();
  });
}

}  // namespace qlft
