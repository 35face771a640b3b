// The one place src/ chooses a backend: its operations (make_backend) and the model of the
// scratch its kernels hold, for the memory planner (make_workspace_model), both keyed by the
// `backend` setting (BackendSpec, config/run_spec.h).
#pragma once

#include <memory>

#include "backend/backend.h"
#include "backend/workspace_model.h"
#include "config/run_spec.h"

namespace qlft {

// s.kind: Cpu, or Cuda through the CUDA plugin (backend/cuda_plugin.h; QLFT_ERR_UNSUPPORTED
// naming the file and the missing library when it cannot be loaded). s.precision reaches the
// kernels here and only here: a bf16 / fp16 CUDA backend rounds its own operands; on the CPU the
// backend is wrapped in the autocast backend (backend/autocast_backend.h). s.tf32: cuda.tf32.
std::unique_ptr<Backend> make_backend(const BackendSpec& s, MemoryTracker* tracker);

// The workspace model of backend `kind` (no device or plugin needed: a plan for backend=cuda
// runs anywhere).
std::unique_ptr<WorkspaceModel> make_workspace_model(BackendKind kind,
                                                     const WorkspaceModelSettings& s);

}  // namespace qlft
