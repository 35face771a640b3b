// The typed run description: every setting of the key table (config/keys.cpp) as the value its
// consumer uses (enums, counts, bytes), parsed once from a validated Config by parse_run_spec.
// Only src/api/ and src/config/ see Config; every other room takes its part of a RunSpec
// (BackendSpec for the backend, OptimSpec for the optimizer, ...), so a setting's string value
// is compared in one place: run_spec.cpp.
//
// Adding a setting: a row in kKeys (keys.cpp), a field in the part of its consumer here, one
// line in parse_run_spec (run_spec.cpp); the consumer reads the field (docs/ARCHITECTURE.md,
// "Settings").
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace qlft {

class Config;

// ---- value types -------------------------------------------------------------------------------

enum class BackendKind { Cpu, Cuda };                           // backend
enum class Precision { FP32, BF16, FP16 };                      // train.precision
enum class QuantType { NF4, INT8, Keep };                       // quant.type
enum class OptimizerKind { AdamW, AdamW8bit, PagedAdamW8bit };  // optim.name
enum class ScheduleKind { Constant, Linear, Cosine };           // sched.name
enum class OffloadTarget { None, Cpu, Nvme };                   // offload.optimizer, offload.params
enum class DistBackend { None, Mpi, Nccl };                     // dist.backend
enum class LoraInit { Default, Loftq, Pissa, Olora };           // lora.init
enum class Objective { Sft, Dpo, Ipo, Orpo, Simpo, Kto };       // train.objective

// The key table's spelling of each value ("bf16", "paged_adamw8bit", ...): for messages,
// checkpoints and cache keys, never for deciding anything.
const char* name_of(BackendKind v);
const char* name_of(Precision v);
const char* name_of(QuantType v);
const char* name_of(OptimizerKind v);
const char* name_of(ScheduleKind v);
const char* name_of(OffloadTarget v);
const char* name_of(DistBackend v);
const char* name_of(LoraInit v);
const char* name_of(Objective v);

// bf16 or fp16: matmul inputs and stored activations rounded to 16 bits (autocast).
inline bool is_low_precision(Precision p) {
  return p != Precision::FP32;
}

// train.micro_batch: a count, or auto (the auto-tuner picks the largest that fits).
struct MicroBatch {
  bool is_auto = false;
  int n = 4;  // the count; 1 while auto is not yet resolved
  static MicroBatch automatic() { return MicroBatch{true, 1}; }
  static MicroBatch of(int n) { return MicroBatch{false, n}; }
};

}  // namespace qlft

namespace qlft::data {
// data.format, data.template, data.train_on, data.overflow (the dataset pipeline's own values).
enum class DataFormat { Auto, Text, Alpaca, Chat };
enum class TemplateKind { Auto, None, ChatML, Llama3, Llama2, Mistral, Alpaca };
enum class TrainOn { Completion, All };
enum class Overflow { Split, Truncate, Reject };
// data.separator: how a .txt file splits into documents. "\n\n" (the default) means blank lines,
// "none" the whole file; any other string is split at as written.
enum class TextSplit { BlankLines, Whole, AtSeparator };

// The key table's spelling (data.format, data.template), as name_of above.
const char* format_name(DataFormat f);
const char* template_name(TemplateKind t);
// "\n" "\t" "\r" "\\" escapes of data.separator (others stay as written).
std::string unescape(const std::string& s);
}  // namespace qlft::data

namespace qlft {

// ---- the parts, one per consumer ------------------------------------------------------------

// backend, train.precision, cuda.tf32, cuda.graphs, threads: what make_backend
// (backend/backend_select.h) builds a backend from; the precision reaches the kernels only through
// it.
struct BackendSpec {
  BackendKind kind = BackendKind::Cpu;
  Precision precision = Precision::FP32;
  bool tf32 = false;    // cuda.tf32
  bool graphs = false;  // cuda.graphs
  int threads = 0;      // 0: every core the process may run on
};

struct MemorySpec {
  uint64_t limit = 0;  // memory.limit in bytes; 0 = unlimited
};

struct LogSpec {
  bool set = false;   // log.level given (logging is process-wide: only a given level changes it)
  int32_t level = 1;  // QLFT_LOG_* of log.level
};

// quant.*: how the loader stores base linear weights.
struct QuantSpec {
  QuantType type = QuantType::NF4;
  bool double_quant = true;
  int blocksize = 64;
};

// The hyperparameters an adapter is made with: the spec's, kept as they are by the adapter's own
// LoraConfig (model/lora.h).
struct LoraHyperparams {
  int r = 8;
  float alpha = 16.f;
  float dropout = 0.f;
  bool use_rslora = false;
  bool use_dora = false;  // lora.use_dora: a magnitude per output row (model/lora_dora.h)
};

// lora.* and seed.
struct LoraSpec : LoraHyperparams {
  std::vector<std::string> target_modules = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                             "gate_proj", "up_proj", "down_proj"};
  std::string init_from;  // a PEFT adapter directory, or empty
  LoraInit init = LoraInit::Default;
  uint64_t seed = 42;  // the `seed` key: LoRA init and dropout masks
};

// data.* (the dataset pipeline, data/dataset.h).
struct DataSpec {
  std::string path;
  data::DataFormat format = data::DataFormat::Auto;
  data::TemplateKind chat_template = data::TemplateKind::Auto;
  data::TrainOn train_on = data::TrainOn::Completion;  // text documents train on every token
  int seq_len = 512;
  bool pack = true;
  data::Overflow overflow = data::Overflow::Split;
  data::TextSplit split = data::TextSplit::BlankLines;
  std::string separator;  // unescaped; with TextSplit::AtSeparator only
  double eval_fraction = 0.0;
  uint64_t seed = 1234;
  int epochs = 1;
  bool skip_bad = false;                // data.on_error=skip
  uint64_t max_record_bytes = 1 << 20;  // 0 = no limit
  // {{key}} -> value in every text field of every record (data.vars "key=value,...").
  std::vector<std::pair<std::string, std::string>> vars;
};

// optim.*.
struct OptimSpec {
  OptimizerKind kind = OptimizerKind::AdamW;
  double lr = 2e-4;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;
  double max_grad_norm = 1.0;      // 0 disables clipping (the trainer's, not the optimizer's)
  double loraplus_lr_ratio = 1.0;  // LoRA+: B's learning rate is this times A's
};

// sched.*.
struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::Linear;
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.0;
};

// scaler.* (fp16 loss scaling).
struct ScalerSpec {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

// offload.*.
struct OffloadSpec {
  OffloadTarget optimizer = OffloadTarget::None;
  OffloadTarget params = OffloadTarget::None;
  int buffers = 2;  // NVMe buffers in flight besides the one in use
  std::string dir;  // "" = the system temp dir
};

// dist.*.
struct DistSpec {
  DistBackend backend = DistBackend::None;
  int zero_stage = 0;
  double timeout_s = 300;
  uint64_t row_chunk_bytes = 2 << 20;  // dist.row_chunk_kib in bytes
  uint64_t bucket_bytes = 256 << 10;   // dist.bucket_kib in bytes
  bool shard_adapter = false;          // dist.zero3_shard_adapter
  bool prefetch = true;                // dist.zero3_prefetch, auto resolved (off over MPI)
};

// train.*.
struct TrainSpec {
  MicroBatch micro_batch;
  int accumulation = 1;
  bool accumulation_set = false;  // train.accumulation given (not derived from effective_batch)
  int64_t effective_batch = 0;    // 0: micro_batch x accumulation x ranks
  double autotune_margin = 0.05;
  std::string autotune_cache;        // train.autotune_cache resolved: a path, or "" for off
  int64_t max_steps = 0;             // 0: data.epochs passes
  int grad_checkpointing = 0;        // 0 off, 1 every layer, N every N-th
  int64_t mlp_tile_rows = -1;        // train.mlp_tile_rows: rows per MLP tile, 0 whole, -1 auto
  bool offload_checkpoints = false;  // train.offload_checkpoints=on
  // train.offload_checkpoints=auto: the trainer and the planner engage it where the step does
  // not fit memory.limit without it (plan_offload_checkpoints, train/planner.h).
  bool offload_checkpoints_auto = false;
  int64_t eval_every = 0, save_every = 0;
  std::string output_dir = "qlft-out";
  // moe.aux_loss (-1 auto: the model's output_router_logits, 0 off, 1 on) and moe.aux_loss_coef
  // (< 0 auto: the model's router_aux_loss_coef).
  int moe_aux_loss = -1;
  double moe_aux_coef = -1;
  bool stop_on_nonfinite = false;  // train.on_nonfinite=stop
  int max_nonfinite = 10;
  uint64_t seed = 42;  // the `seed` key
};

// train.objective and pref.* (train/preference.h; TRL's DPOConfig / CPOConfig / ORPOConfig /
// KTOConfig names).
struct PrefSpec {
  Objective objective = Objective::Sft;
  double beta = 0.1;              // DPO / IPO / KTO / SimPO beta; ORPO's lambda (ORPOConfig.beta)
  double label_smoothing = 0;     // SimPO (CPO's conservative loss)
  double simpo_gamma = 0.5;       // SimPO's target margin
  double cpo_alpha = 0;           // SimPO: weight of the NLL term on the chosen answers
  double desirable_weight = 1;    // KTO
  double undesirable_weight = 1;  // KTO
  bool precompute_ref = false;    // pref.precompute_ref (train/preference_ref_cache.h)
};

// generate.*.
struct GenerateSpec {
  int max_tokens = 128;
  float temperature = 0.f;
  int top_k = 0;
  float top_p = 1.f;
  uint64_t seed = 0;
  bool stop_at_eos = true;
  bool chat = false;
};

struct RunSpec {
  BackendSpec backend;
  MemorySpec memory;
  LogSpec log;
  QuantSpec quant;
  LoraSpec lora;
  DataSpec data;
  OptimSpec optim;
  ScheduleSpec sched;
  ScalerSpec scaler;
  OffloadSpec offload;
  DistSpec dist;
  TrainSpec train;
  PrefSpec pref;
  GenerateSpec generate;
};

// Every key of c (defaults where unset) as a RunSpec. Throws QLFT_ERR_INVALID_ARGUMENT naming
// the key for a value the typed form refuses (data.vars without '=').
RunSpec parse_run_spec(const Config& c);

}  // namespace qlft
