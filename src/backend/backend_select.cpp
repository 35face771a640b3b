// make_backend and make_workspace_model: the CPU backend, or the CUDA one from the CUDA plugin.
#include "backend/backend_select.h"

#include "backend/autocast_backend.h"
#include "backend/cuda_plugin.h"
#include "core/error.h"

namespace qlft {

// Defined beside each backend's model (backend/cpu/cpu_workspace.cpp, backend/cuda_workspace.cpp).
std::unique_ptr<WorkspaceModel> make_cpu_workspace_model(const WorkspaceModelSettings& s);
std::unique_ptr<WorkspaceModel> make_cuda_workspace_model(const WorkspaceModelSettings& s);

std::unique_ptr<Backend> make_backend(const BackendSpec& s, MemoryTracker* tracker) {
  switch (s.kind) {
    case BackendKind::Cuda: {
      CudaBackendOptions o;
      o.spec = s;
      o.autocast = is_low_precision(s.precision);
      return cuda_plugin::get("backend=cuda").make_backend(tracker, o);
    }
    case BackendKind::Cpu: {
      std::unique_ptr<Backend> b = make_cpu_backend(tracker, s);
      if (!is_low_precision(s.precision)) return b;
      return make_autocast_backend(std::move(b),
                                   s.precision == Precision::BF16 ? DType::BF16 : DType::F16);
    }
  }
  throw_error(QLFT_ERR_INVALID_ARGUMENT, "backend: unknown backend %d", static_cast<int>(s.kind));
}

std::unique_ptr<WorkspaceModel> make_workspace_model(BackendKind kind,
                                                     const WorkspaceModelSettings& s) {
  return kind == BackendKind::Cuda ? make_cuda_workspace_model(s) : make_cpu_workspace_model(s);
}

}  // namespace qlft
