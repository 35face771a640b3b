// Finds, opens and checks the CUDA plugin (libqlft-cuda.so, backend/cuda_plugin_abi.h): every
// use of CUDA in libqlft goes through it, so libqlft has no CUDA, cuBLASLt or NCCL dependency.
#pragma once

#include <string>

#include "backend/cuda_plugin_abi.h"

namespace qlft::cuda_plugin {

// The file opened: $QLFT_CUDA_PLUGIN when set (a path), else libqlft-cuda.so in the directory
// of the file that holds this code (libqlft.so.0, or a test executable linking the static core).
std::string path();

// The plugin's table, opened on first use and kept. `what` names the request in the error
// ("backend=cuda", "dist.backend=nccl"). A plugin that cannot be opened (absent, or a library it
// needs missing) throws QLFT_ERR_UNSUPPORTED naming the file, dlerror()'s reason and
// QLFT_CUDA_PLUGIN; one from another build (ABI version, layout, project version) is refused.
const CudaPlugin& get(const char* what);

// Whether get() would succeed; `why` gets its error otherwise (qlft_build_info's cuda= field).
bool loadable(std::string* why);

}  // namespace qlft::cuda_plugin
