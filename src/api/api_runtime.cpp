// qlft_runtime: backend choice, threads and the memory budget.
#include "api/handles.h"
#include "backend/cuda_plugin.h"
#include "core/cpu_isa.h"
#include "core/error.h"
#include "core/log.h"
#include "core/threads.h"
#include "parallel/mpi_plugin_loader.h"
#include "core/state_store.h"
#include "train/adapter_io.h"

using qlft::guard;

namespace qlft {
// The report of a runtime's tracker; fn names the entry point in errors (the trainer's report
// is its runtime's).
void memory_report(const qlft_runtime* runtime, qlft_memory_report* out, const char* fn) {
  QLFT_CHECK_ARG(out, "%s: out is NULL", fn);
  QLFT_CHECK_ARG(out->struct_size >= sizeof(uint32_t) + sizeof(uint64_t),
                 "%s: set out->struct_size = sizeof(qlft_memory_report)", fn);
  MemorySnapshot s = runtime->tracker.snapshot();
  qlft_memory_report r{};
  r.struct_size = sizeof(r);
  r.limit = s.limit;
  for (int i = 0; i < QLFT_MEM_CATEGORY_COUNT; ++i) {
    r.allocated[i] = s.allocated[i];
    r.reserved[i] = s.reserved[i];
    r.peak[i] = s.peak[i];
  }
  r.total_reserved = s.total_reserved;
  r.total_peak = s.total_peak;
  r.process_peak_rss = process_peak_rss();
  copy_out(r, out);
}
}  // namespace qlft

extern "C" {

int32_t qlft_runtime_create(const qlft_config* config, qlft_runtime** out) {
  return guard([&] {
    QLFT_CHECK_ARG(out, "qlft_runtime_create: out is NULL");
    *out = nullptr;
    const qlft::Config& c = qlft::config_or_default(config);
    qlft::cpu_isa();  // a bad QLFT_CPU_ISA fails here, naming the variable
    auto rt = std::make_unique<qlft_runtime>();
    const qlft::RunSpec spec = qlft::parse_run_spec(c);
    rt->backend = spec.backend;
    rt->backend.precision = qlft::Precision::FP32;  // generation's; training brings its own
    const bool cuda = spec.backend.kind == qlft::BackendKind::Cuda;
    if (cuda) {
      std::string why;
      int n = qlft::cuda_plugin::get("backend=cuda").device_count(&why);
      if (n == 0)
        qlft::throw_error(QLFT_ERR_BACKEND, "backend=cuda: no usable CUDA device (%s)",
                          why.c_str());
    }
    // Logging is process-wide: a config that sets log.level changes the level for everything
    // (the last of this and qlft_set_log_callback's max_level wins).
    if (spec.log.set) qlft::set_log_level(spec.log.level);
    // Only recorded: each C API call that computes gives it to its own OS thread for the call
    // (qlft::ThreadScope), so nothing process-wide (OpenMP, OpenBLAS) changes here.
    const int threads = spec.backend.threads;
    rt->threads = threads > 0 ? threads : qlft::available_cores();
    rt->tracker.set_limit(spec.memory.limit);
    // memory.limit is the GPU's budget with backend=cuda: device bytes only (the host keeps the
    // loaded weights and the adapter's host copy outside it).
    if (cuda) rt->tracker.set_limit_space(qlft::MemSpace::Device);
    // What a run will need from outside the model and data, checked before they load.
    if (!spec.offload.dir.empty()) qlft::check_offload_dir(spec.offload.dir);
    if (spec.dist.backend != qlft::DistBackend::None)
      qlft::dist::require_mpi_plugin();  // mpi, nccl over mpi
    if (!spec.lora.init_from.empty()) qlft::read_peft_config(spec.lora.init_from);
    *out = rt.release();
  });
}

void qlft_runtime_free(qlft_runtime* runtime) {
  delete runtime;
}

const char* qlft_memory_category_name(int32_t category) {
  if (category < 0 || category >= QLFT_MEM_CATEGORY_COUNT) return "unknown";
  return qlft::mem_category_name(static_cast<qlft::MemCategory>(category));
}

int32_t qlft_runtime_memory_report(const qlft_runtime* runtime, qlft_memory_report* out) {
  return guard([&] {
    QLFT_CHECK_ARG(runtime, "qlft_runtime_memory_report: runtime is NULL");
    qlft::memory_report(runtime, out, "qlft_runtime_memory_report");
  });
}

}  // extern "C"
