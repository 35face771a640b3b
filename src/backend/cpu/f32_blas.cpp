#include "backend/cpu/f32_blas.h"

#include <cblas.h>

#include <algorithm>
#include <cctype>
#include <string>

#include "core/log.h"

namespace qlft::cpu {

namespace {

bool same_name(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

}  // namespace

CpuIsa openblas_core_isa(std::string_view core) {
  for (const char* n : {"SkylakeX", "Cooperlake", "SapphireRapids"})
    if (same_name(core, n)) return CpuIsa::Avx512;
  for (const char* n : {"Haswell", "Zen"})
    if (same_name(core, n)) return CpuIsa::Avx2;
  return CpuIsa::Baseline;
}

bool openblas_behind(std::string_view core, CpuIsa cpu) {
  return openblas_core_isa(core) < std::min(cpu, CpuIsa::Avx512);
}

const char* openblas_core() {
  static const std::string name = [] {
    const char* n = openblas_get_corename();
    return std::string(n && *n ? n : "unknown");
  }();
  return name.c_str();
}

bool f32_blas_onednn_auto() {
  static const bool onednn = [] {
    const bool behind = openblas_behind(openblas_core(), cpu_isa());
    if (behind)
      QLFT_LOG_I("OpenBLAS runs its %s kernels on this %s CPU: fp32 GEMMs go to oneDNN instead",
                 openblas_core(), cpu_isa_name(cpu_isa()));
    return behind;
  }();
  return onednn;
}

}  // namespace qlft::cpu
