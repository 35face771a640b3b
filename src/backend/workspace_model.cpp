#include "backend/workspace_model.h"

#include "core/error.h"

namespace qlft {

// Defined beside each backend's model (backend/cpu/cpu_workspace.cpp, backend/cuda_workspace.cpp).
std::unique_ptr<WorkspaceModel> make_cpu_workspace_model(const WorkspaceModelSettings& s);
std::unique_ptr<WorkspaceModel> make_cuda_workspace_model(const WorkspaceModelSettings& s);

std::unique_ptr<WorkspaceModel> make_workspace_model(const std::string& backend,
                                                     const WorkspaceModelSettings& s) {
  if (backend == "cuda") return make_cuda_workspace_model(s);
  QLFT_CHECK_ARG(backend == "cpu" || backend.empty(), "backend: unknown backend '%s' (cpu|cuda)",
                 backend.c_str());
  return make_cpu_workspace_model(s);
}

}  // namespace qlft
