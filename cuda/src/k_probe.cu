// Whether this build carries kernels the current device can run (an sm_75 card with an
// sm_80..sm_90 build has none): asks the runtime for a kernel's attributes.
#include <string>

#include "check.h"

namespace qlft::cu {

namespace {
__global__ void __launch_bounds__(32) k_probe(int* p) {
  if (p) *p = 1;
}
}  // namespace

bool kernels_loadable(std::string* why) {
  cudaFuncAttributes attr;
  const cudaError_t e = cudaFuncGetAttributes(&attr, k_probe);
  if (e == cudaSuccess) return true;
  (void)cudaGetLastError();
  if (why)
    *why = std::string("no kernel image for this device in this build (") + cudaGetErrorName(e) +
           "); rebuild with CMAKE_CUDA_ARCHITECTURES including its compute capability";
  return false;
}

}  // namespace qlft::cu
