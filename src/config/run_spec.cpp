// parse_run_spec: the one place a setting's string value becomes the value its consumer uses.
#include "config/run_spec.h"

#include <initializer_list>
#include <iterator>

#include "config/config.h"
#include "core/enum_names.h"
#include "core/error.h"
#include "core/log.h"

namespace qlft {

namespace {

// Each enum's spelling, in its declaration order (the key table's choices).
const char* const kBackendNames[] = {"cpu", "cuda"};
const char* const kPrecisionNames[] = {"fp32", "bf16", "fp16"};
const char* const kQuantNames[] = {"nf4", "int8", "keep"};
const char* const kOptimizerNames[] = {"adamw", "adamw8bit", "paged_adamw8bit"};
const char* const kScheduleNames[] = {"constant", "linear", "cosine"};
const char* const kOffloadNames[] = {"none", "cpu", "nvme"};
const char* const kDistNames[] = {"none", "mpi", "nccl"};
const char* const kLoraInitNames[] = {"default", "loftq", "pissa", "olora"};
const char* const kObjectiveNames[] = {"sft", "dpo", "ipo", "orpo", "simpo", "kto"};
const char* const kFormatNames[] = {"auto", "text", "alpaca", "chat"};
const char* const kTemplateNames[] = {"auto",   "none",    "chatml", "llama3",
                                      "llama2", "mistral", "alpaca"};
const char* const kTrainOnNames[] = {"completion", "all"};
const char* const kOverflowNames[] = {"split", "truncate", "reject"};

// The enum value of key `key` (already validated against the key table's choices; a choice
// missing from `names` is a table/enum mismatch, reported naming the key).
template <class E, size_t N>
E pick(const Config& c, const char* key, const char* const (&names)[N]) {
  const std::string v = c.get(key);
  for (size_t i = 0; i < N; ++i)
    if (v == names[i]) return static_cast<E>(i);
  throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s: '%s' is not a known value", key, v.c_str());
}

int as_int(const Config& c, const char* key) {
  return static_cast<int>(c.get_int(key));
}

BackendSpec parse_backend(const Config& c) {
  BackendSpec s;
  s.kind = pick<BackendKind>(c, "backend", kBackendNames);
  s.precision = pick<Precision>(c, "train.precision", kPrecisionNames);
  s.tf32 = c.get_bool("cuda.tf32");
  s.graphs = c.get_bool("cuda.graphs");
  s.threads = as_int(c, "threads");
  return s;
}

LoraSpec parse_lora(const Config& c) {
  LoraSpec s;
  s.r = as_int(c, "lora.r");
  s.alpha = static_cast<float>(c.get_float("lora.alpha"));
  s.dropout = static_cast<float>(c.get_float("lora.dropout"));
  s.use_rslora = c.get_bool("lora.use_rslora");
  s.use_dora = c.get_bool("lora.use_dora");
  s.target_modules = c.get_list("lora.target_modules");
  s.init_from = c.get("lora.init_from");
  s.init = pick<LoraInit>(c, "lora.init", kLoraInitNames);
  s.seed = static_cast<uint64_t>(c.get_int("seed"));
  return s;
}

DataSpec parse_data(const Config& c) {
  DataSpec s;
  s.path = c.get("data.path");
  s.format = pick<data::DataFormat>(c, "data.format", kFormatNames);
  s.chat_template = pick<data::TemplateKind>(c, "data.template", kTemplateNames);
  s.train_on = pick<data::TrainOn>(c, "data.train_on", kTrainOnNames);
  s.seq_len = as_int(c, "data.seq_len");
  s.pack = c.get_bool("data.pack");
  s.overflow = pick<data::Overflow>(c, "data.overflow", kOverflowNames);
  const std::string sep = c.get("data.separator");
  s.separator = sep == "none" ? std::string() : data::unescape(sep);
  s.split = s.separator.empty()     ? data::TextSplit::Whole
            : s.separator == "\n\n" ? data::TextSplit::BlankLines
                                    : data::TextSplit::AtSeparator;
  if (s.split != data::TextSplit::AtSeparator) s.separator.clear();
  s.eval_fraction = c.get_float("data.eval_fraction");
  s.seed = static_cast<uint64_t>(c.get_int("data.seed"));
  s.epochs = as_int(c, "data.epochs");
  s.skip_bad = c.get("data.on_error") == "skip";
  s.max_record_bytes = c.get_size("data.max_record_bytes");
  for (const std::string& kv : c.get_list("data.vars")) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      throw_error(QLFT_ERR_INVALID_ARGUMENT, "data.vars: '%s' is not key=value", kv.c_str());
    s.vars.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return s;
}

// A float key and the double field of spec S it fills: parse_optim and parse_pref bind their
// many real-valued keys as one list each instead of one assignment a key.
template <class S>
struct FloatKey {
  const char* key;
  double S::*field;
};

template <class S>
void read_floats(const Config& c, S& s, std::initializer_list<FloatKey<S>> keys) {
  for (const FloatKey<S>& k : keys) s.*k.field = c.get_float(k.key);
}

OptimSpec parse_optim(const Config& c) {
  using O = OptimSpec;
  O s;
  s.kind = pick<OptimizerKind>(c, "optim.name", kOptimizerNames);
  read_floats<O>(c, s,
                 {{"optim.lr", &O::lr},
                  {"optim.beta1", &O::beta1},
                  {"optim.beta2", &O::beta2},
                  {"optim.eps", &O::eps},
                  {"optim.weight_decay", &O::weight_decay},
                  {"optim.max_grad_norm", &O::max_grad_norm},
                  {"optim.loraplus_lr_ratio", &O::loraplus_lr_ratio}});
  return s;
}

DistSpec parse_dist(const Config& c) {
  DistSpec s;
  s.backend = pick<DistBackend>(c, "dist.backend", kDistNames);
  s.zero_stage = as_int(c, "dist.zero_stage");
  s.timeout_s = c.get_float("dist.timeout_s");
  s.row_chunk_bytes = static_cast<uint64_t>(c.get_int("dist.row_chunk_kib")) << 10;
  s.bucket_bytes = static_cast<uint64_t>(c.get_int("dist.bucket_kib")) << 10;
  s.shard_adapter = c.get_bool("dist.zero3_shard_adapter");
  // auto: on over NCCL, where the gather overlaps the compute; off over MPI.
  const std::string p = c.get("dist.zero3_prefetch");
  s.prefetch = p == "auto" ? s.backend != DistBackend::Mpi : p == "true";
  return s;
}

PrefSpec parse_pref(const Config& c) {
  PrefSpec s;
  s.objective = pick<Objective>(c, "train.objective", kObjectiveNames);
  using P = PrefSpec;
  read_floats<P>(c, s,
                 {{"pref.beta", &P::beta},
                  {"pref.label_smoothing", &P::label_smoothing},
                  {"pref.simpo_gamma", &P::simpo_gamma},
                  {"pref.cpo_alpha", &P::cpo_alpha},
                  {"pref.desirable_weight", &P::desirable_weight},
                  {"pref.undesirable_weight", &P::undesirable_weight}});
  s.precompute_ref = c.get_bool("pref.precompute_ref");
  return s;
}

TrainSpec parse_train(const Config& c) {
  TrainSpec s;
  s.micro_batch = c.get("train.micro_batch") == "auto"
                      ? MicroBatch::automatic()
                      : MicroBatch::of(as_int(c, "train.micro_batch"));
  s.accumulation = as_int(c, "train.accumulation");
  s.accumulation_set = c.is_set("train.accumulation");
  s.effective_batch = c.get_int("train.effective_batch");
  s.autotune_margin = c.get_float("train.autotune_margin");
  s.max_steps = c.get_int("train.max_steps");
  s.grad_checkpointing = as_int(c, "train.grad_checkpointing");
  s.mlp_tile_rows = c.get("train.mlp_tile_rows") == "auto" ? -1 : c.get_int("train.mlp_tile_rows");
  s.offload_checkpoints = c.get("train.offload_checkpoints") == "on";
  s.offload_checkpoints_auto = c.get("train.offload_checkpoints") == "auto";
  const std::string aux = c.get("moe.aux_loss");
  s.moe_aux_loss = aux == "auto" ? -1 : aux == "on" ? 1 : 0;
  s.moe_aux_coef = c.get("moe.aux_loss_coef") == "auto" ? -1 : c.get_float("moe.aux_loss_coef");
  s.eval_every = c.get_int("train.eval_every");
  s.save_every = c.get_int("train.save_every");
  s.output_dir = c.get("train.output_dir");
  const std::string cache = c.get("train.autotune_cache");
  s.autotune_cache = cache == "off"  ? std::string()
                     : cache.empty() ? s.output_dir + "/autotune.json"
                                     : cache;
  s.stop_on_nonfinite = c.get("train.on_nonfinite") == "stop";
  s.max_nonfinite = as_int(c, "train.max_nonfinite");
  s.seed = static_cast<uint64_t>(c.get_int("seed"));
  return s;
}

}  // namespace

// name_of for each enum: its spelling in the key table.
#define QLFT_NAME_OF(E, names)  \
  const char* name_of(E v) {    \
    return enum_name(names, v); \
  }
QLFT_NAME_OF(BackendKind, kBackendNames)
QLFT_NAME_OF(Precision, kPrecisionNames)
QLFT_NAME_OF(QuantType, kQuantNames)
QLFT_NAME_OF(OptimizerKind, kOptimizerNames)
QLFT_NAME_OF(ScheduleKind, kScheduleNames)
QLFT_NAME_OF(OffloadTarget, kOffloadNames)
QLFT_NAME_OF(DistBackend, kDistNames)
QLFT_NAME_OF(LoraInit, kLoraInitNames)
QLFT_NAME_OF(Objective, kObjectiveNames)
#undef QLFT_NAME_OF

const char* data::format_name(DataFormat f) {
  return enum_name(kFormatNames, f);
}
const char* data::template_name(TemplateKind t) {
  return enum_name(kTemplateNames, t);
}

RunSpec parse_run_spec(const Config& c) {
  RunSpec r;
  r.backend = parse_backend(c);
  r.memory.limit = c.get_size("memory.limit");
  r.log.set = c.is_set("log.level");
  r.log.level = log_level_from_name(c.get("log.level"));
  r.quant.type = pick<QuantType>(c, "quant.type", kQuantNames);
  r.quant.double_quant = c.get_bool("quant.double_quant");
  r.quant.blocksize = as_int(c, "quant.blocksize");
  r.lora = parse_lora(c);
  r.data = parse_data(c);
  r.optim = parse_optim(c);
  r.sched.kind = pick<ScheduleKind>(c, "sched.name", kScheduleNames);
  r.sched.warmup_steps = c.get_int("sched.warmup_steps");
  r.sched.min_lr_ratio = c.get_float("sched.min_lr_ratio");
  r.scaler.init_scale = c.get_float("scaler.init_scale");
  r.scaler.growth_factor = c.get_float("scaler.growth_factor");
  r.scaler.backoff_factor = c.get_float("scaler.backoff_factor");
  r.scaler.growth_interval = c.get_int("scaler.growth_interval");
  r.offload.optimizer = pick<OffloadTarget>(c, "offload.optimizer", kOffloadNames);
  r.offload.params = pick<OffloadTarget>(c, "offload.params", kOffloadNames);
  r.offload.buffers = as_int(c, "offload.buffers");
  r.offload.dir = c.get("offload.dir");
  r.dist = parse_dist(c);
  r.train = parse_train(c);
  r.pref = parse_pref(c);
  r.generate.max_tokens = as_int(c, "generate.max_tokens");
  r.generate.temperature = static_cast<float>(c.get_float("generate.temperature"));
  r.generate.top_k = as_int(c, "generate.top_k");
  r.generate.top_p = static_cast<float>(c.get_float("generate.top_p"));
  r.generate.seed = static_cast<uint64_t>(c.get_int("generate.seed"));
  r.generate.stop_at_eos = c.get_bool("generate.stop_at_eos");
  r.generate.chat = c.get_bool("generate.chat");
  return r;
}

namespace data {

std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      const char c = s[++i];
      if (c == 'n')
        out += '\n';
      else if (c == 't')
        out += '\t';
      else if (c == 'r')
        out += '\r';
      else if (c == '\\')
        out += '\\';
      else {
        out += '\\';
        out += c;
      }
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace data

}  // namespace qlft
