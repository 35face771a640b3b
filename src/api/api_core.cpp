// Versioning, status strings, last error and logging.
#include <cstring>
#include <string>

#include "backend/cpu/f32_blas.h"
#include "backend/cpu/gemm_bf16.h"
#include "backend/cuda_plugin.h"
#include "core/cpu_isa.h"
#include "core/error.h"
#include "core/log.h"
#include "qlft.h"

namespace {
#define QLFT_STR2(x) #x
#define QLFT_STR(x) QLFT_STR2(x)
constexpr const char* kVersion =
    QLFT_STR(QLFT_VERSION_MAJOR) "." QLFT_STR(QLFT_VERSION_MINOR) "." QLFT_STR(QLFT_VERSION_PATCH);

#if defined(__AVX512BF16__)
#define QLFT_SIMD "avx512bf16"
#elif defined(__AVX512F__)
#define QLFT_SIMD "avx512"
#elif defined(__AVX2__)
#define QLFT_SIMD "avx2"
#elif defined(__SSE4_2__) && defined(__POPCNT__)
#define QLFT_SIMD "x86-64-v2"
#else
#define QLFT_SIMD "generic"
#endif
}  // namespace

extern "C" {

uint32_t qlft_version_number(void) {
  return QLFT_VERSION_NUMBER;
}
const char* qlft_version_string(void) {
  return kVersion;
}

const char* qlft_build_info(void) {
  // simd: what the compiler may use everywhere; cpu: the level found at run time; isa: the level
  // the dispatched kernels use (cpu capped by QLFT_CPU_ISA); blas: OpenBLAS's kernel set, and
  // the library the fp32 GEMMs use (backend/cpu/f32_blas.h); bf16gemm: the engine of the bf16
  // GEMMs (cpu::gemm_bf16_native: oneDNN's native bf16, else sgemm on the rounded values), which
  // tests that expect a path compare with (tests/support/path_expectation.sh). cuda: whether
  // the CUDA plugin (backend/cuda_plugin.h) loads here, with the libraries it needs.
  static const std::string info = [] {
    std::string isa, sgemm = "?", bf16gemm = "?";
    try {
      isa = qlft::cpu_isa_name(qlft::cpu_isa());
      sgemm = qlft::cpu::f32_blas_onednn_auto() ? "onednn" : "openblas";
      bf16gemm = qlft::cpu::gemm_bf16_native() ? "onednn" : "sgemm";
    } catch (const qlft::Error&) {
      isa = "invalid-QLFT_CPU_ISA";
    }
    return std::string("qlft " QLFT_STR(QLFT_VERSION_MAJOR) "." QLFT_STR(
               QLFT_VERSION_MINOR) "." QLFT_STR(QLFT_VERSION_PATCH) " cuda=") +
           (qlft::cuda_plugin::loadable(nullptr) ? "1" : "0") +
           " mpi=" QLFT_STR(QLFT_HAVE_MPI) " simd=" QLFT_SIMD " cpu=" +
           qlft::cpu_isa_name(qlft::cpu_isa_detected()) + " isa=" + isa +
           " blas=openblas:" + qlft::cpu::openblas_core() + " sgemm=" + sgemm +
           " bf16gemm=" + bf16gemm + " threads=openmp";
  }();
  return info.c_str();
}

const char* qlft_status_string(int32_t status) {
  switch (status) {
    case QLFT_OK:
      return "QLFT_OK";
    case QLFT_ERR_INVALID_ARGUMENT:
      return "QLFT_ERR_INVALID_ARGUMENT";
    case QLFT_ERR_IO:
      return "QLFT_ERR_IO";
    case QLFT_ERR_FORMAT:
      return "QLFT_ERR_FORMAT";
    case QLFT_ERR_UNSUPPORTED:
      return "QLFT_ERR_UNSUPPORTED";
    case QLFT_ERR_OUT_OF_MEMORY:
      return "QLFT_ERR_OUT_OF_MEMORY";
    case QLFT_ERR_NUMERICAL:
      return "QLFT_ERR_NUMERICAL";
    case QLFT_ERR_CANCELLED:
      return "QLFT_ERR_CANCELLED";
    case QLFT_ERR_BACKEND:
      return "QLFT_ERR_BACKEND";
    case QLFT_ERR_DISTRIBUTED:
      return "QLFT_ERR_DISTRIBUTED";
    case QLFT_ERR_INTERNAL:
      return "QLFT_ERR_INTERNAL";
    default:
      return "QLFT_ERR_UNKNOWN";
  }
}

const char* qlft_last_error(void) {
  return qlft::last_error();
}

void qlft_set_log_callback(qlft_log_fn fn, void* user_data, int32_t max_level) {
  qlft::set_log_callback(fn, user_data, max_level);
}

}  // extern "C"
