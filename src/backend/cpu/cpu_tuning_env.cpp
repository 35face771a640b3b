// QLFT_CPU_TUNE: developer overrides of CpuTuning by field name (cpu_backend.h).
#include <cerrno>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace qlft::cpu {

namespace {

int64_t parse_int(const std::string& name, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  QLFT_CHECK_ARG(!v.empty() && end && *end == '\0' && errno != ERANGE,
                 "QLFT_CPU_TUNE: %s=%s is not an integer", name.c_str(), v.c_str());
  return int64_t(x);
}

// v as one of the choices' names (an engine enum), refused listing them.
template <class E>
E parse_choice(const std::string& name, const std::string& v,
               std::initializer_list<std::pair<const char*, E>> choices) {
  std::string names;  // "a, b or c"
  size_t i = 0;
  for (const auto& [n, e] : choices) {
    if (v == n) return e;
    if (i > 0) names += i + 1 == choices.size() ? " or " : ", ";
    names += n;
    ++i;
  }
  QLFT_CHECK_ARG(false, "QLFT_CPU_TUNE: %s=%s must be %s", name.c_str(), v.c_str(), names.c_str());
  return choices.begin()->second;  // (not reached)
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
                                     {"bf16_lora_db_rows", &CpuTuning::bf16_lora_db_rows},
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
  using B = CpuTuning::Bf16Gemm;
  using F = CpuTuning::F32Blas;
  if (name == "bf16_gemm") {
    t.bf16_gemm =
        parse_choice<B>(name, v, {{"auto", B::Auto}, {"onednn", B::OneDnn}, {"sgemm", B::Sgemm}});
    return;
  }
  if (name == "attn_amx") {
    using A = CpuTuning::AttnAmx;
    t.attn_amx =
        parse_choice<A>(name, v, {{"off", A::Off}, {"on", A::On}, {"emulated", A::Emulated}});
    return;
  }
  if (name == "f32_blas") {
    t.f32_blas = parse_choice<F>(
        name, v, {{"auto", F::Auto}, {"onednn", F::OneDnn}, {"openblas", F::OpenBlas}});
    return;
  }
  QLFT_CHECK_ARG(false, "QLFT_CPU_TUNE: unknown setting '%s'", name.c_str());
}

}  // namespace

void apply_tuning_env(CpuTuning& t, const char* spec) {
  CpuTuning out = t;  // t changes only when the whole spec parses
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
    set_field(out, item.substr(0, eq), item.substr(eq + 1));
  }
  t = out;
}

}  // namespace qlft::cpu
