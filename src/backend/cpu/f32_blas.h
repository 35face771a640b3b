// Which library runs the CPU backend's plain fp32 GEMMs (sgemm(), cpu_common.cpp).
//
// OpenBLAS picks its kernels from the CPU model at load time, and a model newer than the OpenBLAS
// build falls back to old ones: Debian 12's OpenBLAS 0.3.21 runs its generic SSE3 "Prescott"
// kernels on an Emerald Rapids (family 6 model 207), 34 GFLOP/s on 2 threads where oneDNN's fp32
// GEMM gives 229 (docs/PERFORMANCE.md, "fp32 BLAS on a CPU newer than OpenBLAS"). oneDNN's
// dnnl_sgemm dispatches on CPUID features instead, so it takes over where OpenBLAS's kernels are
// older than the CPU; elsewhere OpenBLAS stays, as measured (CpuTuning::f32_blas).
#pragma once

#include <string_view>

#include "core/cpu_isa.h"

namespace qlft::cpu {

// The instruction-set level of the kernels OpenBLAS runs under core name `core`
// (openblas_get_corename(), case-insensitive): avx512 for SkylakeX, Cooperlake and
// SapphireRapids; avx2 for Haswell and Zen; baseline for every other name (SSE-era and AVX-only
// cores, and names this table does not know).
CpuIsa openblas_core_isa(std::string_view core);

// Whether those kernels are behind a CPU at level `cpu`: below min(cpu, avx512) (no fp32 GEMM
// kernel gains from levels above AVX-512).
bool openblas_behind(std::string_view core, CpuIsa cpu);

// OpenBLAS's core name in this process ("unknown" when it gives none).
const char* openblas_core();

// CpuTuning::F32Blas::Auto for this process: oneDNN when openblas_behind(openblas_core(),
// cpu_isa()). Decided once; logged (info) once when it picks oneDNN.
bool f32_blas_onednn_auto();

}  // namespace qlft::cpu
