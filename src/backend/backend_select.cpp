// make_backend: the CPU backend, or the CUDA one from the CUDA plugin.
#include "backend/backend_select.h"

#include "backend/cuda_plugin.h"
#include "core/error.h"

namespace qlft {

std::unique_ptr<Backend> make_backend(const std::string& name, MemoryTracker* tracker,
                                      const std::string& precision, bool tf32) {
  if (name == "cuda") {
    CudaBackendOptions o;
    o.gemm_precision = precision;
    o.autocast = precision == "bf16" || precision == "fp16";
    o.tf32 = tf32;
    return cuda_plugin::get("backend=cuda").make_backend(tracker, o);
  }
  QLFT_CHECK_ARG(name == "cpu" || name.empty(), "backend: unknown backend '%s' (cpu|cuda)",
                 name.c_str());
  return make_cpu_backend(tracker);
}

}  // namespace qlft
