// Deliberately breaks every rule of check_cuda_sources.sh (the lint's own test: it must fail).
void bad(float* p, int n) {
  cudaMalloc(&p, n);
  k_bad<<<1, 32>>>(p);
  cudaMemset(p, 0, n);
  cublasLtCreate(nullptr);
}
