/* A stand-in for a CUDA library (tests/support/cuda_plugin_absent.sh): the fake CUDA plugin
 * links it, and it is left where the dynamic loader does not look. */
int qlft_fake_cuda_dep(void) {
  return 1;
}
