#include "core/cpu_isa.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"

namespace qlft {
namespace {

struct Cpuid {
  uint32_t a = 0, b = 0, c = 0, d = 0;
};

Cpuid cpuid(uint32_t leaf, uint32_t sub) {
  Cpuid r;
  if (__get_cpuid_max(0, nullptr) < leaf) return r;
  __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
  return r;
}

bool bit(uint32_t v, int i) {
  return (v >> i) & 1u;
}

// XCR0: which register states the OS saves on a context switch. A CPU feature whose state the
// OS does not save cannot be used even when CPUID lists it.
uint64_t xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

// Linux hands AMX tile data to a process only after it asks (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA); oneDNN asks as well, asking twice is harmless.
bool amx_permitted() {
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

CpuIsa detect() {
  const Cpuid l1 = cpuid(1, 0);
  const bool osxsave = bit(l1.c, 27);
  if (!osxsave) return CpuIsa::Baseline;
  const uint64_t xcr = xcr0();
  const bool ymm_state = (xcr & 0x6) == 0x6;           // SSE + AVX state
  const bool zmm_state = (xcr & 0xe6) == 0xe6;         // + opmask, ZMM_Hi256, Hi16_ZMM
  const bool tile_state = (xcr & 0x60000) == 0x60000;  // XTILECFG + XTILEDATA
  const Cpuid l7 = cpuid(7, 0), l7s1 = cpuid(7, 1);
  const bool avx2 = ymm_state && bit(l1.c, 28) /*avx*/ && bit(l1.c, 12) /*fma*/ &&
                    bit(l1.c, 29) /*f16c*/ && bit(l7.b, 5) /*avx2*/;
  if (!avx2) return CpuIsa::Baseline;
  const bool avx512 = zmm_state && bit(l7.b, 16) /*f*/ && bit(l7.b, 17) /*dq*/ &&
                      bit(l7.b, 30) /*bw*/ && bit(l7.b, 31) /*vl*/;
  if (!avx512) return CpuIsa::Avx2;
  if (!bit(l7s1.a, 5) /*avx512_bf16*/) return CpuIsa::Avx512;
  const bool amx = tile_state && bit(l7.d, 22) /*amx_bf16*/ && bit(l7.d, 24) /*amx_tile*/;
  if (!amx || !amx_permitted()) return CpuIsa::Avx512Bf16;
  return CpuIsa::Amx;
}

const char* const kNames[] = {"baseline", "avx2", "avx512", "avx512_bf16", "amx"};

}  // namespace

CpuIsa cpu_isa_detected() {
  static const CpuIsa isa = detect();
  return isa;
}

bool cpu_isa_parse(const char* name, CpuIsa* out) {
  for (int i = 0; i < 5; ++i)
    if (std::strcmp(name, kNames[i]) == 0) {
      *out = static_cast<CpuIsa>(i);
      return true;
    }
  return false;
}

const char* cpu_isa_name(CpuIsa isa) {
  const int i = static_cast<int>(isa);
  return i >= 0 && i < 5 ? kNames[i] : "?";
}

CpuIsa cpu_isa() {
  // The cap is read once: kernels and oneDNN's own ISA limit (set from it before the first
  // primitive) must agree for the whole process.
  static const struct Level {
    CpuIsa isa;
    std::string error;
  } level = [] {
    Level l{cpu_isa_detected(), {}};
    const char* cap = std::getenv("QLFT_CPU_ISA");
    if (cap == nullptr || *cap == '\0') return l;
    CpuIsa c;
    if (!cpu_isa_parse(cap, &c)) {
      l.error = std::string("QLFT_CPU_ISA: unknown level '") + cap +
                "' (expected baseline, avx2, avx512, avx512_bf16 or amx)";
      return l;
    }
    if (c < l.isa) l.isa = c;
    return l;
  }();
  if (!level.error.empty()) throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s", level.error.c_str());
  return level.isa;
}

}  // namespace qlft
