// QLFT_HD marks arithmetic shared between the CPU backend and CUDA kernels: host+device inline.
#pragma once

#if defined(__CUDACC__)
#define QLFT_HD __host__ __device__ __forceinline__
#else
#define QLFT_HD
#endif
