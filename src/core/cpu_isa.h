// The CPU's instruction-set level, found at run time and optionally capped by the user.
//
// Kernels with ISA-specific paths (bulk 16-bit conversions, the bf16 GEMM engine choice) ask
// cpu_isa() and run the best path at or below it, so one build runs on every x86-64 CPU and the
// test suite can exercise each fallback on a CPU that has more (QLFT_CPU_ISA=avx2 on an AMX
// machine runs what a Zen 3 runs).
#pragma once

namespace qlft {

// Ordered: each level includes the ones below it.
enum class CpuIsa : int {
  Baseline = 0,    // x86-64 SSE2: scalar kernels
  Avx2 = 1,        // AVX2 + FMA + F16C
  Avx512 = 2,      // AVX-512 F/BW/VL/DQ (Skylake-SP, Cascade Lake, Zen 4)
  Avx512Bf16 = 3,  // + AVX512-BF16 (Cooper Lake, Zen 4, Sapphire Rapids)
  Amx = 4,         // + AMX-BF16 tiles (Sapphire Rapids and later)
};

// What this CPU and its OS offer (CPUID and XGETBV; AMX also needs the kernel's permission).
CpuIsa cpu_isa_detected();

// The level kernels use: the detected level capped by the environment variable QLFT_CPU_ISA
// (baseline | avx2 | avx512 | avx512_bf16 | amx). A value that is not one of these throws
// QLFT_ERR_INVALID_ARGUMENT naming the variable and the allowed values. Read once per process.
CpuIsa cpu_isa();

const char* cpu_isa_name(CpuIsa isa);

// Parses a level name as QLFT_CPU_ISA spells it; false when unknown.
bool cpu_isa_parse(const char* name, CpuIsa* out);

}  // namespace qlft
