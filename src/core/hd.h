// QLFT_HD marks arithmetic shared between the CPU backend and CUDA kernels: host+device. Every use
// is written `QLFT_HD inline`, so the macro itself carries no inline specifier (nvcc rejects a
// second one).
#pragma once

#if defined(__CUDACC__)
#define QLFT_HD __host__ __device__
#else
#define QLFT_HD
#endif
