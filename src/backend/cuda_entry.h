// Plain C++ entry points into the CUDA backend library (cuda/). Declared here so src/ never
// includes CUDA headers; defined only in builds with QLFT_CUDA=ON.
#pragma once

#include <string>

namespace qlft {

// Number of usable CUDA devices; 0 with *why set (e.g. "no CUDA driver") when there are none.
int cuda_device_count(std::string* why);
// "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)" for device i.
std::string cuda_device_description(int device);

}  // namespace qlft
