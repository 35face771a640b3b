/* A CUDA plugin whose dependency cannot be found (libqlft_fake_cudart.so, built into a directory
 * on no search path): what libqlft-cuda.so is on a machine without the CUDA libraries. */
int qlft_fake_cuda_dep(void);

const void* qlft_cuda_plugin(const void* host, char* err, unsigned long errlen) {
  (void)host;
  (void)err;
  (void)errlen;
  return qlft_fake_cuda_dep() ? 0 : 0;
}
