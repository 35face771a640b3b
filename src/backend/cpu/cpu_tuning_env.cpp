// QLFT_CPU_TUNE: developer overrides of CpuTuning by field name (cpu_backend.h).
#include <cstdlib>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace qlft::cpu {

namespace {

int64_t parse_int(const std::string& name, const std::string& v) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  QLFT_CHECK_ARG(!v.empty() && end && *end == '\0', "QLFT_CPU_TUNE: %s=%s is not an integer",
                 name.c_str(), v.c_str());
  return int64_t(x);
}

bool parse_bool(const std::string& name, const std::string& v) {
  QLFT_CHECK_ARG(v == "0" || v == "1", "QLFT_CPU_TUNE: %s=%s must be 0 or 1", name.c_str(),
                 v.c_str());
  return v == "1";
}

// The fields QLFT_CPU_TUNE names, by their names in cpu_backend.h.
struct IntField {
  const char* name;
  int64_t CpuTuning::*field;
};
struct BoolField {
  const char* name;
  bool CpuTuning::*field;
};
constexpr IntField kIntFields[] = {{"attn_block_q", &CpuTuning::attn_block_q},
                                   {"attn_stair_rows", &CpuTuning::attn_stair_rows},
                                   {"attn_stair_rows_bf16", &CpuTuning::attn_stair_rows_bf16}};
constexpr BoolField kBoolFields[] = {{"reuse_scratch", &CpuTuning::reuse_scratch},
                                     {"f32_xwt_onednn", &CpuTuning::f32_xwt_onednn},
                                     {"f32_thin_onednn", &CpuTuning::f32_thin_onednn},
                                     {"f32_attn_onednn", &CpuTuning::f32_attn_onednn},
                                     {"flush_denormals", &CpuTuning::flush_denormals}};

void set_field(CpuTuning& t, const std::string& name, const std::string& v) {
  for (const IntField& f : kIntFields)
    if (name == f.name) {
      t.*f.field = parse_int(name, v);
      return;
    }
  for (const BoolField& f : kBoolFields)
    if (name == f.name) {
      t.*f.field = parse_bool(name, v);
      return;
    }
  // The engine choices, by their enumerators' names in lower case.
  if (name == "bf16_gemm" || name == "f32_blas") {
    const bool bf16 = name == "bf16_gemm";
    const char* third = bf16 ? "sgemm" : "openblas";
    QLFT_CHECK_ARG(v == "auto" || v == "onednn" || v == third,
                   "QLFT_CPU_TUNE: %s=%s must be auto, onednn or %s", name.c_str(), v.c_str(),
                   third);
    const int i = v == "auto" ? 0 : v == "onednn" ? 1 : 2;
    if (bf16)
      t.bf16_gemm = i == 0   ? CpuTuning::Bf16Gemm::Auto
                    : i == 1 ? CpuTuning::Bf16Gemm::OneDnn
                             : CpuTuning::Bf16Gemm::Sgemm;
    else
      t.f32_blas = i == 0   ? CpuTuning::F32Blas::Auto
                   : i == 1 ? CpuTuning::F32Blas::OneDnn
                            : CpuTuning::F32Blas::OpenBlas;
    return;
  }
  QLFT_CHECK_ARG(false, "QLFT_CPU_TUNE: unknown setting '%s'", name.c_str());
}

}  // namespace

void apply_tuning_env(CpuTuning& t, const char* spec) {
  const std::string s(spec);
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = s.find(',', pos);
    const size_t end = comma == std::string::npos ? s.size() : comma;
    const std::string item = s.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    QLFT_CHECK_ARG(eq != std::string::npos, "QLFT_CPU_TUNE: '%s' is not name=value", item.c_str());
    set_field(t, item.substr(0, eq), item.substr(eq + 1));
  }
}

}  // namespace qlft::cpu
