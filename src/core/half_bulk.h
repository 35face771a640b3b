// The bulk 16-bit conversions of core/dtype.h, one path per ISA level, reachable one by one so
// tests can hold every path the CPU runs to the scalar rules of core/half.h.
//
// The numeric contract is the scalar code's on every path: bf16 rounds to nearest even with
// subnormals kept and NaN quieted (the native VCVTNEPS2BF16 flushes subnormal inputs, so that
// path patches those lanes); f16 is what the F16C instructions give, NaN payloads included.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/cpu_isa.h"
#include "core/dtype.h"

namespace qlft {

enum class BulkOp { F32ToBf16, Bf16ToF32, F32ToF16, F16ToF32, RoundThroughBf16 };

// Runs op over n elements with the path of ISA level `isa` (the best path at or below it).
// Returns false, converting nothing, when this CPU (with the QLFT_CPU_ISA cap) cannot run that
// level. src and dst are float* or uint16_t* as the op implies.
bool bulk_convert_at(CpuIsa isa, BulkOp op, const void* src, void* dst, size_t n);

// The level whose own code bulk_convert_at(isa, op, ...) runs: e.g. Amx runs the Avx512Bf16
// conversions, and only f32 -> bf16 (and its round trip) has an Avx512Bf16 path.
CpuIsa bulk_convert_path(CpuIsa isa, BulkOp op);

}  // namespace qlft
