/*
 * qlft.h - the public C ABI of qlft, an embedded QLoRA fine-tuning runtime.
 *
 * This is the only public header. It is C99 and stable: functions and struct fields are only
 * ever appended. Every result struct starts with `uint32_t struct_size`, which the caller sets to
 * sizeof(struct) before the call so that an older caller keeps working with a newer library.
 *
 * Conventions
 *  - Every function that can fail returns a status (`QLFT_OK` = 0 or a `QLFT_ERR_*` code); the
 *    detail is in `qlft_last_error()`, which is thread-local and valid until the next failing call
 *    on the same thread.
 *  - Objects are opaque handles created by `qlft_X_create`/`qlft_X_load` into an out-parameter and
 *    released by `qlft_X_free`; `qlft_X_free(NULL)` is a no-op.
 *  - Objects made from a runtime or a model must not outlive it.
 *  - Distinct handles may be used from different threads at once; one handle from one thread at
 *    a time. A model may be shared read-only by several trainers.
 *  - Settings are string key/value pairs on a `qlft_config`; the keys are listed by
 *    `qlft_config_key_count`/`qlft_config_key_at` and in docs/CONFIG.md.
 */
#ifndef QLFT_H
#define QLFT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* On Windows the library's own build (which defines QLFT_BUILDING) exports each function and a
 * client of the DLL imports it; a client linking a static build defines QLFT_STATIC. */
#if defined(_WIN32) && defined(QLFT_STATIC)
#define QLFT_API
#elif defined(_WIN32) && defined(QLFT_BUILDING)
#define QLFT_API __declspec(dllexport)
#elif defined(_WIN32)
#define QLFT_API __declspec(dllimport)
#elif defined(__GNUC__)
#define QLFT_API __attribute__((visibility("default")))
#else
#define QLFT_API
#endif

/* ---- Versioning ------------------------------------------------------------------------- */

#define QLFT_VERSION_MAJOR 0
#define QLFT_VERSION_MINOR 1
#define QLFT_VERSION_PATCH 0
#define QLFT_VERSION_NUMBER \
  (QLFT_VERSION_MAJOR * 10000 + QLFT_VERSION_MINOR * 100 + QLFT_VERSION_PATCH)

/* The version of the library linked at run time (compare with QLFT_VERSION_NUMBER). */
QLFT_API uint32_t qlft_version_number(void);
QLFT_API const char* qlft_version_string(void);
/* "qlft 0.1.0 cuda=0 mpi=0 simd=avx2 cpu=avx512_bf16 isa=avx2 blas=openblas:SkylakeX
 * sgemm=openblas threads=openmp": cuda=1 when the CUDA backend's plugin (libqlft-cuda.so beside
 * the library, or $QLFT_CUDA_PLUGIN) loads with the libraries it needs, simd is what the build
 * may use everywhere, cpu the level found at run time, isa the level the dispatched kernels use
 * (cpu capped by the environment variable QLFT_CPU_ISA), blas the kernel set OpenBLAS chose for
 * this CPU, sgemm the library that runs the plain fp32 GEMMs (oneDNN where OpenBLAS's kernels are
 * older than the CPU). */
QLFT_API const char* qlft_build_info(void);

/* ---- Status codes ----------------------------------------------------------------------- */

#define QLFT_OK 0
#define QLFT_ERR_INVALID_ARGUMENT 1
#define QLFT_ERR_IO 2
#define QLFT_ERR_FORMAT 3
#define QLFT_ERR_UNSUPPORTED 4
#define QLFT_ERR_OUT_OF_MEMORY 5
#define QLFT_ERR_NUMERICAL 6
#define QLFT_ERR_CANCELLED 7
#define QLFT_ERR_BACKEND 8
#define QLFT_ERR_DISTRIBUTED 9
#define QLFT_ERR_INTERNAL 10

/* A static name for a status: "QLFT_ERR_FORMAT". Unknown codes give "QLFT_ERR_UNKNOWN". */
QLFT_API const char* qlft_status_string(int32_t status);
/* The detail of the last failure on this thread ("" if none). */
QLFT_API const char* qlft_last_error(void);

/* ---- Logging ---------------------------------------------------------------------------- */

#define QLFT_LOG_ERROR 0
#define QLFT_LOG_WARN 1
#define QLFT_LOG_INFO 2
#define QLFT_LOG_DEBUG 3

typedef void (*qlft_log_fn)(int32_t level, const char* message, void* user_data);

/* Process-wide. Messages above max_level are dropped. fn = NULL restores the default, which
 * writes warnings and errors to stderr. The callback may be called from any thread. A config
 * that sets log.level changes max_level (process-wide too) when qlft_runtime_create gets it;
 * the last of the two wins. */
QLFT_API void qlft_set_log_callback(qlft_log_fn fn, void* user_data, int32_t max_level);

/* ---- Settings --------------------------------------------------------------------------- */

typedef struct qlft_config qlft_config;

QLFT_API int32_t qlft_config_create(qlft_config** out);
QLFT_API void qlft_config_free(qlft_config* config);
/* Validates against the key table: unknown key, wrong type or out of range is
 * QLFT_ERR_INVALID_ARGUMENT and leaves the config unchanged. */
QLFT_API int32_t qlft_config_set(qlft_config* config, const char* key, const char* value);
/* Copies the value (or the default when unset) into buf with its NUL. *needed (if not NULL)
 * receives the size with the NUL; a too-small buffer is QLFT_ERR_INVALID_ARGUMENT. */
QLFT_API int32_t qlft_config_get(const qlft_config* config, const char* key, char* buf,
                                 size_t buf_size, size_t* needed);

/* Applies a YAML run file: nested maps are dotted keys (`lora: {r: 16}` sets lora.r), lists
 * become comma-separated values. All-or-nothing; errors name the file, line and key. */
QLFT_API int32_t qlft_config_load_file(qlft_config* config, const char* path);

typedef struct qlft_config_key {
  uint32_t struct_size;
  const char* name;          /* "lora.r" */
  const char* type;          /* "int", "float", "bool", "string", "enum", "size" */
  const char* default_value; /* as a string */
  const char* allowed;       /* "1..65536", "nf4|int8|keep", or "" */
  const char* doc;           /* one sentence */
} qlft_config_key;

QLFT_API size_t qlft_config_key_count(void);
QLFT_API int32_t qlft_config_key_at(size_t index, qlft_config_key* out);

/* Added with typed settings: what a config's settings mean, as the library's spec parser reads
 * them (the defaults when config is NULL), for clients that act on a setting without comparing
 * its string. A config the parser refuses (settings that contradict each other) returns its
 * error naming the keys. */
typedef struct qlft_run_settings {
  uint32_t struct_size;
  int32_t micro_batch_auto;    /* 1: train.micro_batch=auto (the tuner picks the count) */
  uint32_t micro_batch;        /* train.micro_batch; 1 while auto */
  uint32_t seq_len;            /* data.seq_len */
  uint64_t memory_limit;       /* memory.limit in bytes; 0 = unlimited */
  int32_t distributed;         /* 1: dist.backend is mpi or nccl (ranks train together) */
  int32_t zero3_shard_adapter; /* 1: dist.zero3_shard_adapter=true */
  int64_t save_every;          /* train.save_every; 0 = only at the end */
} qlft_run_settings;

QLFT_API int32_t qlft_config_run_settings(const qlft_config* config, qlft_run_settings* out);

/* ---- Runtime ---------------------------------------------------------------------------- */

typedef struct qlft_runtime qlft_runtime;

/* Reads backend, threads and memory.limit from config (may be NULL for defaults).
 * `threads` belongs to the runtime: each call that computes with it or with objects made from it
 * runs its kernels and GEMMs on exactly that many OS threads (the calling thread and threads - 1
 * OpenMP workers of that thread), whichever thread calls. Nothing process-wide is changed: the
 * calling thread's omp_get_max_threads() and OpenBLAS's thread count stay as the program set
 * them, so runtimes with different counts and the program's own OpenMP/BLAS code coexist. */
QLFT_API int32_t qlft_runtime_create(const qlft_config* config, qlft_runtime** out);
QLFT_API void qlft_runtime_free(qlft_runtime* runtime);

#define QLFT_MEM_WEIGHTS 0
#define QLFT_MEM_ADAPTER 1
#define QLFT_MEM_GRADIENTS 2
#define QLFT_MEM_OPTIMIZER 3
#define QLFT_MEM_ACTIVATIONS 4
#define QLFT_MEM_WORKSPACE 5
#define QLFT_MEM_COMMUNICATION 6
#define QLFT_MEM_CATEGORY_COUNT 7

/* "weights", "adapter", ... */
QLFT_API const char* qlft_memory_category_name(int32_t category);

typedef struct qlft_memory_report {
  uint32_t struct_size;
  uint64_t limit;                              /* memory.limit in bytes, 0 = unlimited */
  uint64_t allocated[QLFT_MEM_CATEGORY_COUNT]; /* bytes in live buffers now */
  uint64_t reserved[QLFT_MEM_CATEGORY_COUNT];  /* bytes held from the OS now (>= allocated) */
  uint64_t peak[QLFT_MEM_CATEGORY_COUNT];      /* highest `reserved` seen */
  uint64_t total_reserved;                     /* sum of reserved + freed blocks kept for reuse */
  uint64_t total_peak;                         /* highest total reserved seen */
  uint64_t process_peak_rss;                   /* from the OS, bytes */
} qlft_memory_report;

QLFT_API int32_t qlft_runtime_memory_report(const qlft_runtime* runtime, qlft_memory_report* out);

/* ---- Model ------------------------------------------------------------------------------ */

typedef struct qlft_model qlft_model;

/* path: a .gguf file, a .safetensors file, or a directory with config.json and
 * model.safetensors (or model.safetensors.index.json). config keys used: quant.type,
 * quant.double_quant. config may be NULL. */
QLFT_API int32_t qlft_model_load(qlft_runtime* runtime, const char* path, const qlft_config* config,
                                 qlft_model** out);
QLFT_API void qlft_model_free(qlft_model* model);

/* Filled by qlft_model_info(). */
typedef struct qlft_model_details {
  uint32_t struct_size;
  char architecture[32];  /* "llama", "qwen2" */
  char quant_type[16];    /* "nf4", "int8", "f32", "q4_0", "mixed", ... */
  char source_format[16]; /* "gguf", "safetensors" */
  uint32_t n_layers;
  uint32_t dim;
  uint32_t n_heads;
  uint32_t n_kv_heads;
  uint32_t head_dim;
  uint32_t ffn_dim;
  uint32_t vocab_size;
  uint32_t context_length;
  float rope_theta;
  float rms_norm_eps;
  uint32_t tied_embeddings;     /* 1 if the output head shares the token embedding */
  uint32_t rope_adjacent_pairs; /* 1 = GGUF llama row order, 0 = Hugging Face rotate-half */
  uint64_t n_params;            /* parameters of the base model */
  uint64_t weight_bytes;        /* bytes the loaded (possibly quantized) weights occupy */
} qlft_model_details;

QLFT_API int32_t qlft_model_info(const qlft_model* model, qlft_model_details* out);

/* What qlft_model_describe writes: the family's Hugging Face class ("Qwen3ForCausalLM"), or how
 * the model differs from plain Llama ("q/k RMSNorm per head, tied head", "sliding window 4096
 * on 28 of 36 layers", "fused qkv_proj and gate_up_proj (split on load)", "rope scaling
 * llama3"; "none" for plain Llama). */
#define QLFT_DESCRIBE_HF_CLASS 0
#define QLFT_DESCRIBE_DELTAS 1
/* Copies the text `what` names into buf with its NUL; *needed (if not NULL) receives the size
 * with the NUL. buf NULL with buf_size 0 only asks the size; a too-small buffer is
 * QLFT_ERR_INVALID_ARGUMENT. */
QLFT_API int32_t qlft_model_describe(const qlft_model* model, int32_t what, char* buf,
                                     size_t buf_size, size_t* needed);

/* ---- Tokenizer -------------------------------------------------------------------------- */

/* Encodes text (text_len bytes, not NUL-terminated necessarily) with the model's tokenizer.
 * add_bos: 1 prepends BOS when the vocabulary has one, 0 adds nothing, QLFT_ADD_SPECIAL_AS_MODEL
 * (-1) adds BOS and EOS as the model's own tokenizer does (GGUF tokenizer.ggml.add_bos_token /
 * add_eos_token or llama.cpp's default for the vocabulary; tokenizer_config.json's flags or
 * tokenizer.json's post-processor): the ids llama.cpp and transformers give. parse_special:
 * spellings of special tokens in the text become their ids. Writes up to capacity ids; *n_ids
 * receives the full count (call with capacity 0 to size the buffer; too small a buffer is
 * QLFT_ERR_INVALID_ARGUMENT). */
#define QLFT_ADD_SPECIAL_AS_MODEL (-1)
QLFT_API int32_t qlft_tokenize(const qlft_model* model, const char* text, size_t text_len,
                               int32_t add_bos, int32_t parse_special, int32_t* ids,
                               size_t capacity, size_t* n_ids);
/* Decodes ids to UTF-8 text (special tokens skipped) into buf with its NUL; *needed receives
 * the size with the NUL. */
QLFT_API int32_t qlft_detokenize(const qlft_model* model, const int32_t* ids, size_t n_ids,
                                 char* buf, size_t buf_size, size_t* needed);

/* A tokenizer loaded alone, without the model's weights: path is a GGUF file (only its
 * tokenizer.ggml.* metadata is read, so a vocabulary-only GGUF works), a Hugging Face model
 * directory or .safetensors file (the tokenizer.json beside it, with tokenizer_config.json when
 * present), or a tokenizer.json. _encode and _decode behave as qlft_tokenize / qlft_detokenize. */
typedef struct qlft_tokenizer qlft_tokenizer;
QLFT_API int32_t qlft_tokenizer_load(const char* path, qlft_tokenizer** out);
QLFT_API void qlft_tokenizer_free(qlft_tokenizer* tokenizer);
QLFT_API int32_t qlft_tokenizer_encode(const qlft_tokenizer* tokenizer, const char* text,
                                       size_t text_len, int32_t add_bos, int32_t parse_special,
                                       int32_t* ids, size_t capacity, size_t* n_ids);
QLFT_API int32_t qlft_tokenizer_decode(const qlft_tokenizer* tokenizer, const int32_t* ids,
                                       size_t n_ids, char* buf, size_t buf_size, size_t* needed);

/* ---- Dataset ---------------------------------------------------------------------------- */

typedef struct qlft_dataset qlft_dataset;

/* Reads path (.txt, .json, .jsonl) and tokenizes it with the model's tokenizer, using the
 * data.* settings (format, template, seq_len, packing, split, seed). Bad records fail with
 * QLFT_ERR_FORMAT naming file and line, or are skipped and counted (data.on_error = skip).
 * The dataset must not outlive the model. */
QLFT_API int32_t qlft_dataset_load(const qlft_model* model, const char* path,
                                   const qlft_config* config, qlft_dataset** out);
QLFT_API void qlft_dataset_free(qlft_dataset* dataset);

#define QLFT_HISTOGRAM_BUCKETS 16

typedef struct qlft_dataset_stats {
  uint32_t struct_size;
  uint64_t records;         /* records read (after skipping bad ones) */
  uint64_t dropped_records; /* skipped with data.on_error = skip */
  uint64_t tokens;          /* tokens after templating */
  uint64_t trained_tokens;  /* tokens whose loss is trained (not masked) */
  uint64_t train_sequences; /* packed or padded rows of data.seq_len */
  uint64_t eval_sequences;
  double fill_ratio;                                 /* non-padding token slots / all slots */
  uint32_t histogram_bucket_width;                   /* tokens per bucket of record lengths */
  uint64_t length_histogram[QLFT_HISTOGRAM_BUCKETS]; /* last bucket collects the rest */
} qlft_dataset_stats;

QLFT_API int32_t qlft_dataset_get_stats(const qlft_dataset* dataset, qlft_dataset_stats* out);

/* ---- Trainer ---------------------------------------------------------------------------- */

typedef struct qlft_trainer qlft_trainer;

typedef struct qlft_step_stats {
  uint32_t struct_size;
  uint64_t step;        /* optimizer steps done, counting this one */
  uint64_t total_steps; /* train.max_steps, or the steps of train.epochs */
  float loss;           /* mean token loss of this step's micro-batches */
  float learning_rate;
  float grad_norm;  /* before clipping */
  float loss_scale; /* fp16 loss scale (1 otherwise) */
  uint32_t skipped; /* 1 if the step was skipped (non-finite gradients) */
  uint64_t tokens;  /* trained tokens in this step */
  double tokens_per_second;
  double elapsed_seconds;
  double eta_seconds;
  uint64_t memory_reserved; /* runtime-owned bytes now */
  uint64_t memory_peak;     /* highest runtime-owned bytes so far */
  float eval_loss;          /* NaN unless an evaluation ran after this step */
  /* Fields after eval_loss (struct_size says whether the library filled them): what this step
   * moved between host and device memory and how often the host waited for the device; all 0
   * on backend=cpu. */
  uint64_t host_to_device_bytes;
  uint64_t device_to_host_bytes;
  uint64_t device_syncs;
  /* Added with launch counting: the kernels and library calls (cuBLASLt matmuls) the step
   * submitted to the device; 0 on backend=cpu. */
  uint64_t device_launches;
  /* Added with preference objectives (train.objective != sft): TRL's logged values, means over
   * the step's micro-batches: the implicit rewards of the chosen and rejected answers, their
   * margin, the share of pairs whose margin is > 0, and the answers' log-probabilities under
   * the policy (summed; ORPO and SimPO: per token, as TRL logs them); ORPO's / SimPO's NLL term
   * and KTO's KL estimate. NaN on sft steps and where the objective logs none (KTO:
   * rewards_accuracies; nll_loss and kl outside those objectives). */
  double rewards_chosen;
  double rewards_rejected;
  double rewards_margins;
  double rewards_accuracies;
  double logps_chosen;
  double logps_rejected;
  double nll_loss;
  double kl;
} qlft_step_stats;

/* Return nonzero to stop training after this step (qlft_trainer_train returns
 * QLFT_ERR_CANCELLED). The callback may save, evaluate, export, generate with, query or cancel
 * its trainer; qlft_trainer_step, _train, _load_adapter and _resume on it return
 * QLFT_ERR_INVALID_ARGUMENT there, and qlft_trainer_free is carried out when the callback
 * returns (training then ends with QLFT_ERR_CANCELLED). */
typedef int32_t (*qlft_progress_fn)(const qlft_step_stats* stats, void* user_data);

/* Creates LoRA adapters (lora.*) on the model and an optimizer (optim.*). train_data may be
 * NULL for a trainer used only to evaluate, load adapters or generate. The trainer must not
 * outlive the model or the dataset. */
QLFT_API int32_t qlft_trainer_create(qlft_model* model, qlft_dataset* train_data,
                                     const qlft_config* config, qlft_trainer** out);
QLFT_API void qlft_trainer_free(qlft_trainer* trainer);
/* One optimizer step (train.accumulation micro-batches). */
QLFT_API int32_t qlft_trainer_step(qlft_trainer* trainer, qlft_step_stats* out);
/* The device launches of the trainer's last step (qlft_step_stats.device_launches) by kernel, as
 * a JSON object in name order: {"cublasLtMatmul": 115, "k_rmsnorm_fwd<...>": 5, ...} (kernel
 * names with their template arguments; "{}" on backend=cpu and before a step). Copied into buf
 * with its NUL; *needed (if not NULL) receives the size with the NUL. buf NULL with buf_size 0
 * only asks the size; a too-small buffer is QLFT_ERR_INVALID_ARGUMENT. */
QLFT_API int32_t qlft_trainer_step_launches(const qlft_trainer* trainer, char* buf, size_t buf_size,
                                            size_t* needed);
/* Steps until train.max_steps / train.epochs, evaluating and checkpointing as configured. */
QLFT_API int32_t qlft_trainer_train(qlft_trainer* trainer, qlft_progress_fn progress,
                                    void* user_data);
/* Asks a running qlft_trainer_train to stop after the current step (a running
 * qlft_trainer_step stops at its next micro-batch, rolled back). A cancel sent while neither
 * runs is discarded when the next one starts. Safe from another thread and from a signal
 * handler. */
QLFT_API void qlft_trainer_cancel(qlft_trainer* trainer);

typedef struct qlft_eval_result {
  uint32_t struct_size;
  double loss;       /* mean token loss over the held-out split */
  double perplexity; /* exp(loss) */
  uint64_t tokens;
} qlft_eval_result;

/* Evaluates on data (or, if NULL, the held-out split of the training data). Distributed
 * (dist.*): any rank may call it alone, e.g. rank 0 only (with dist.zero_stage=3 on CPU ranks it
 * reads the base weights it lacks from the model file); with dist.backend=nccl and ZeRO-3, or
 * with dist.zero3_shard_adapter, every rank must call it (one rank alone fails with
 * QLFT_ERR_DISTRIBUTED after dist.timeout_s). */
QLFT_API int32_t qlft_trainer_evaluate(qlft_trainer* trainer, qlft_dataset* data,
                                       qlft_eval_result* out);

/* format: "peft" (a directory with adapter_model.safetensors + adapter_config.json),
 * "gguf" (a llama.cpp LoRA adapter file; QLFT_ERR_UNSUPPORTED, nothing written, for a DoRA
 * adapter: llama.cpp's format has no magnitude). Written atomically. With dist.zero3_shard_adapter
 * on several ranks every rank must call it: the adapter is gathered and rank 0 writes it. */
QLFT_API int32_t qlft_trainer_save_adapter(qlft_trainer* trainer, const char* path,
                                           const char* format);
/* Loads a PEFT adapter directory (its r, alpha and targets must match the trainer's). With
 * dist.zero3_shard_adapter each rank must call it (each keeps its own tensors). */
QLFT_API int32_t qlft_trainer_load_adapter(qlft_trainer* trainer, const char* path);
/* A checkpoint holds LoRA weights, optimizer, scheduler, loss scaler, RNG and data position;
 * written atomically. Resuming continues exactly where the checkpoint was taken. */
QLFT_API int32_t qlft_trainer_save_checkpoint(qlft_trainer* trainer, const char* path);
QLFT_API int32_t qlft_trainer_resume(qlft_trainer* trainer, const char* path);
/* Distributed training (dist.backend = mpi or nccl, processes started by mpirun): this
 * process's rank and the number of ranks (0 and 1 for a single process). Every rank must call
 * qlft_trainer_step / qlft_trainer_train, qlft_trainer_save_checkpoint (rank 0 alone writes the
 * file; the others send it their optimizer state) and qlft_trainer_resume; only rank 0 should
 * write adapters, logs and metrics (with dist.zero3_shard_adapter every rank calls
 * qlft_trainer_save_adapter and rank 0 writes). Either out pointer may be NULL. */
QLFT_API int32_t qlft_trainer_dist_info(const qlft_trainer* trainer, int32_t* rank,
                                        int32_t* world_size);
QLFT_API int32_t qlft_trainer_memory_report(const qlft_trainer* trainer, qlft_memory_report* out);
/* Writes the base model merged with the trainer's LoRA adapter (base weights dequantized +
 * scale * B A) as a standalone model. format: "safetensors" (path is a directory: an F32
 * model.safetensors with Hugging Face names + config.json), "gguf-f16" or "gguf-bf16" (path is a
 * GGUF file with llama.cpp names, tokenizer metadata copied from a GGUF source). Atomic files. */
QLFT_API int32_t qlft_trainer_export_merged(qlft_trainer* trainer, const char* path,
                                            const char* format);

/* ---- Memory planning -------------------------------------------------------------------- */

/* Predicted bytes per memory category (QLFT_MEM_*), counted as qlft_memory_report counts them. */
typedef struct qlft_memory_estimate {
  uint32_t struct_size;
  uint64_t peak[QLFT_MEM_CATEGORY_COUNT];  /* per category, over loading and training */
  uint64_t train[QLFT_MEM_CATEGORY_COUNT]; /* per category at the training-step peak */
  uint64_t train_peak;                     /* total during a training step */
  uint64_t load_peak;                      /* total while loading the weights */
  uint64_t total_peak;                     /* max(train_peak, load_peak) */
  uint32_t micro_batch;     /* the micro-batch estimated (train.micro_batch; 1 for auto) */
  uint32_t max_micro_batch; /* largest micro-batch predicted to fit memory.limit; 0 when no
                               limit is set or not even 1 fits */
  /* Added with backend=cuda planning (a smaller struct_size leaves them out): the part of `train`
   * in device memory (the runner's tensors, the kernels' scratch and the cuBLASLt workspace,
   * resident weight copies, the adapter's device copy and gradients, the device AdamW state),
   * also counted in `train` and `train_peak`, which add host and device. All 0 on the CPU
   * backend. With backend=cuda memory.limit budgets device_train_peak (and max_micro_batch is
   * against it). */
  uint64_t device_train[QLFT_MEM_CATEGORY_COUNT];
  uint64_t device_train_peak;
  /* Added with process accounting: this process's resident bytes outside the categories when
   * the estimate was made (program and library pages, the runtime's tables and the tokenizer,
   * MPI's and oneDNN's own memory): its resident set less the host bytes its runtime counts
   * (with a loaded model; with a model path, this process's resident set, a lower bound: a
   * training run also loads the tokenizer and touches more of its libraries). process_peak_rss:
   * the predicted peak resident set, process_base + total_peak less device bytes + what the
   * first step maps beyond them on the CPU backend (compute library code and JIT kernels,
   * allocator slack: 12 MiB). */
  uint64_t process_base;
  uint64_t process_peak_rss;
  /* Added with context planning: the longest data.seq_len predicted to fit memory.limit at
   * micro-batch 1 with the other settings as given (searched up to 4,194,304 tokens); 0 when no
   * limit is set or not even one token fits. */
  uint32_t max_seq_len;
  /* Added with automatic checkpoint offload: 1 when the plan keeps the checkpointed layers'
   * inputs in pinned host memory (train.offload_checkpoints=on, or auto on a device backend
   * where the step would exceed memory.limit without it), else 0. */
  uint32_t offload_checkpoints;
  /* Added with image-text checkpoints: 1 when the model is the text model of an image-text
   * checkpoint (Gemma3ForConditionalGeneration), whose vision tower and projector are neither
   * loaded nor counted, else 0. */
  uint32_t text_model_only;
} qlft_memory_estimate;

/* Predicts what training will hold, before anything is allocated: weights, adapter, gradients
 * and optimizer state exactly, activations exactly (the runner's own sizes), workspace from
 * the backend's block sizes, assuming every target is trained. Give exactly one of model (a
 * loaded model) and model_path (a .gguf file or an HF model directory: only headers and
 * config.json are read; quant.* settings apply). Settings used: train.precision,
 * train.grad_checkpointing, data.seq_len, train.micro_batch, train.accumulation, optim.name,
 * lora.*, threads, backend, memory.limit. config may be NULL. */
QLFT_API int32_t qlft_estimate_memory(const qlft_model* model, const char* model_path,
                                      const qlft_config* config, qlft_memory_estimate* out);
/* The trainer's micro-batch and accumulation (what train.micro_batch = auto chose). */
QLFT_API int32_t qlft_trainer_batch_shape(const qlft_trainer* trainer, uint32_t* micro_batch,
                                          uint32_t* accumulation);

/* ---- Generation ------------------------------------------------------------------------- */

/* Receives generated text as it becomes complete UTF-8; return nonzero to stop. */
typedef int32_t (*qlft_text_fn)(const char* text, void* user_data);

/* Generates from prompt with the generate.* settings (max_tokens, temperature, top_k, top_p,
 * seed); with the trainer's adapter when trainer is not NULL. Trainers never change the model
 * (ZeRO-3 and offload stream their own copies of its weights). A model loaded deferred (its
 * config had dist.zero_stage=3 over several MPI ranks, or offload.params=nvme) reads its base
 * weights from the model file per token: slow, but no collective, so one rank may call it
 * alone. */
QLFT_API int32_t qlft_generate(const qlft_model* model, const qlft_trainer* trainer,
                               const char* prompt, const qlft_config* config, qlft_text_fn on_text,
                               void* user_data);

/* Streaming generation, one token per call (the same ids as qlft_generate for the same
 * arguments). Why a generation ended: */
#define QLFT_FINISH_NONE 0      /* not ended: more tokens follow */
#define QLFT_FINISH_EOS 1       /* the end-of-sequence token (generate.stop_at_eos) */
#define QLFT_FINISH_LENGTH 2    /* generate.max_tokens tokens, or the model's context is full */
#define QLFT_FINISH_STOP 3      /* the text reached one of the stop strings */
#define QLFT_FINISH_CANCELLED 4 /* qlft_generation_cancel */

typedef struct qlft_generation qlft_generation;

typedef struct qlft_generated_token {
  uint32_t struct_size;
  int32_t id;            /* the sampled token id; -1 when this event ends a cancelled generation */
  uint32_t index;        /* 0 for the first generated token */
  int32_t finish_reason; /* QLFT_FINISH_NONE, or why the generation ended with this event */
  const char* text;      /* the text that became final with this token: complete UTF-8,
                            NUL-terminated, often "" (a character or a possible stop string not
                            yet complete); owned by the generation, valid until the next call */
  size_t text_len;
} qlft_generated_token;

/* Starts generating from prompt with the generate.* settings, with the trainer's adapter when
 * trainer is not NULL (the trainer must not train, load or resume until the generation is
 * freed). stop: n_stop strings (stop may be NULL when n_stop is 0); the generation ends at the
 * first occurrence of any of them in the generated text, which is not delivered (text that
 * might begin a stop string is held back until it cannot). Nothing is computed before the
 * first qlft_generation_next. The generation must not outlive the model or the trainer. */
QLFT_API int32_t qlft_generation_create(const qlft_model* model, const qlft_trainer* trainer,
                                        const char* prompt, const qlft_config* config,
                                        const char* const* stop, size_t n_stop,
                                        qlft_generation** out);
/* Computes the next token. The event with finish_reason != QLFT_FINISH_NONE is the last one
 * (it carries the final token, if any, and the rest of the text); later calls return it again
 * with id -1 and text "". One thread at a time. */
QLFT_API int32_t qlft_generation_next(qlft_generation* generation, qlft_generated_token* out);
/* Ends the generation: the next (or the running) qlft_generation_next returns
 * QLFT_FINISH_CANCELLED with id -1 and the text held back so far; a token being computed when
 * the cancel arrives is discarded, so at most one token is delivered after this returns.
 * Unlike a trainer (which is idle between calls), a generation is running from its creation to
 * its last event, so a cancel is never discarded. Safe from another thread and from a signal
 * handler. */
QLFT_API void qlft_generation_cancel(qlft_generation* generation);
QLFT_API void qlft_generation_free(qlft_generation* generation);

/* ---- Training report -------------------------------------------------------------------- */

/* One step of a run as qlft-finetune train logs it in <run dir>/metrics.jsonl: the data of the
 * training report (loss, learning rate, speed and the memory timeline), for embedding products
 * that draw their own. A value the record lacks or logged as null (not finite) is NaN; memory
 * per category is 0 in records written before it was logged. An evaluation made outside a step
 * (before training: step 0, or the checkpoint's step on resume; after the last step) is a record
 * of its own with only step and eval_loss set (loss and learning_rate NaN, tokens 0). */
typedef struct qlft_metrics_record {
  uint32_t struct_size;
  uint64_t step;
  double loss;
  double learning_rate;
  double grad_norm;
  double loss_scale;
  uint32_t skipped; /* 1 if the step was skipped (non-finite gradients) */
  uint64_t tokens;
  double tokens_per_second;
  double elapsed_seconds;   /* since this process's run started (a resumed run restarts it) */
  double eval_loss;         /* NaN unless an evaluation ran after this step */
  double margin;            /* preference runs: chosen-minus-rejected margin; NaN otherwise */
  uint64_t memory_reserved; /* runtime-owned bytes after the step */
  uint64_t memory_peak;     /* highest runtime-owned bytes so far */
  uint64_t memory[QLFT_MEM_CATEGORY_COUNT]; /* reserved bytes per category after the step */
  /* the highest reserved bytes per category so far (what `predicted` predicts) */
  uint64_t memory_category_peak[QLFT_MEM_CATEGORY_COUNT];
  uint64_t predicted[QLFT_MEM_CATEGORY_COUNT]; /* the planner's step-peak bytes per category
                                                  (qlft_memory_estimate.train) for the run */
  uint64_t predicted_total;                    /* qlft_memory_estimate.train_peak; 0: unknown */
} qlft_metrics_record;

/* Reads a metrics.jsonl file (path) into records: records[0].struct_size must be set and is the
 * stride of the array. Writes up to capacity records; *count receives the number in the file
 * (call with capacity 0 and records NULL to size the array; too small an array is
 * QLFT_ERR_INVALID_ARGUMENT). A last line still being written is left out; a malformed line is
 * QLFT_ERR_FORMAT naming the file and line. */
QLFT_API int32_t qlft_metrics_read(const char* path, qlft_metrics_record* records, size_t capacity,
                                   size_t* count);

typedef struct qlft_report_options {
  uint32_t struct_size;
  const char* output_path;  /* NULL or "": <run_dir>/report.html */
  const char* status;       /* shown in the header ("finished", "cancelled"); NULL: derived */
  uint32_t refresh_seconds; /* > 0: the page reloads itself every N seconds (a live view) */
} qlft_report_options;

/* Writes the training report of the run in run_dir (drawn from its metrics.jsonl alone): one
 * self-contained HTML file with inline SVG charts (no scripts, no network loads) of training
 * and evaluation loss with smoothing, learning rate, loss scale, tokens/s, gradient norm and
 * skipped steps, memory per category against the planner's prediction, and a header with the
 * model, adapter, data, run time, ETA and final figures. Written atomically, so it can be
 * regenerated while the run trains. options may be NULL. */
QLFT_API int32_t qlft_report_write(const char* run_dir, const qlft_report_options* options);

#ifdef __cplusplus
}
#endif

#endif /* QLFT_H */
