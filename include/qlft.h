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

#if defined(_WIN32)
#define QLFT_API __declspec(dllexport)
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
/* "qlft 0.1.0 cuda=0 mpi=0 simd=avx512bf16 blas=openblas threads=openmp" */
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
 * writes warnings and errors to stderr. The callback may be called from any thread. */
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

/* ---- Runtime ---------------------------------------------------------------------------- */

typedef struct qlft_runtime qlft_runtime;

/* Reads backend, threads and memory.limit from config (may be NULL for defaults). */
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
  uint64_t limit; /* memory.limit in bytes, 0 = unlimited */
  uint64_t allocated[QLFT_MEM_CATEGORY_COUNT]; /* bytes in live buffers now */
  uint64_t reserved[QLFT_MEM_CATEGORY_COUNT];  /* bytes held from the OS now (>= allocated) */
  uint64_t peak[QLFT_MEM_CATEGORY_COUNT];      /* highest `reserved` seen */
  uint64_t total_reserved;                     /* sum of reserved */
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
  char architecture[32]; /* "llama", "qwen2" */
  char quant_type[16];   /* "nf4", "int8", "f32", "q4_0", "mixed", ... */
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
  uint32_t tied_embeddings;    /* 1 if the output head shares the token embedding */
  uint32_t rope_adjacent_pairs; /* 1 = GGUF llama row order, 0 = Hugging Face rotate-half */
  uint64_t n_params;           /* parameters of the base model */
  uint64_t weight_bytes;       /* bytes the loaded (possibly quantized) weights occupy */
} qlft_model_details;

QLFT_API int32_t qlft_model_info(const qlft_model* model, qlft_model_details* out);

#ifdef __cplusplus
}
#endif

#endif /* QLFT_H */
