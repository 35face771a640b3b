/* The boundary between libqlft and its MPI plugin (libqlft-mpi.so): one C table of functions,
 * so the plugin and the library share no C++ object, exception or allocator across the boundary
 * (a plugin built with another compiler or standard library still loads), and libqlft itself
 * never links libmpi. The plugin (src/parallel/mpi_plugin.cpp, built with comm_mpi.cpp) exports
 * qlft_mpi_plugin(); the library finds and opens it when dist.backend=mpi (or nccl, whose id
 * travels over MPI) is asked for (src/parallel/mpi_plugin_loader.cpp).
 *
 * Every function that can fail returns 0 or a qlft_status code (include/qlft.h) and then writes
 * a NUL-terminated message of at most errlen bytes to err. Collectives follow
 * core/communicator.h's contract (same order and sizes on every rank, bounded by the timeout). */
#ifndef QLFT_DIST_MPI_PLUGIN_ABI_H
#define QLFT_DIST_MPI_PLUGIN_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Raised whenever the table changes; the library refuses a plugin with another number. */
#define QLFT_MPI_PLUGIN_ABI_VERSION 2u

typedef struct QlftMpiPlugin {
  uint32_t abi_version;    /* QLFT_MPI_PLUGIN_ABI_VERSION */
  const char* description; /* e.g. the MPI library's version string */
  /* Initializes MPI if needed and makes a communicator over every rank. */
  int32_t (*create)(double timeout_s, void** comm, char* err, size_t errlen);
  void (*destroy)(void* comm);
  void (*info)(void* comm, int* rank, int* world, int* local_rank);
  void (*set_timeout)(void* comm, double timeout_s);
  int32_t (*broken)(void* comm); /* 1 after a failed collective */
  /* In place over n values; is_double: double (else float); avg: mean (else sum). */
  int32_t (*all_reduce)(void* comm, void* data, size_t n, int32_t is_double, int32_t avg, char* err,
                        size_t errlen);
  int32_t (*reduce_scatter)(void* comm, const float* in, float* out, size_t n_per_rank, int32_t avg,
                            char* err, size_t errlen);
  int32_t (*all_gather)(void* comm, const float* in, float* out, size_t n_per_rank, char* err,
                        size_t errlen);
  /* Starts a byte all-gather; *pending is waited for (pending_wait) and freed (pending_free). */
  int32_t (*start_all_gather_raw)(void* comm, const void* in, void* out, size_t bytes_per_rank,
                                  void** pending, char* err, size_t errlen);
  int32_t (*pending_wait)(void* pending, char* err, size_t errlen);
  void (*pending_free)(void* pending); /* waits first unless the communicator is broken */
  int32_t (*broadcast)(void* comm, void* data, size_t bytes, int root, char* err, size_t errlen);
  int32_t (*barrier)(void* comm, char* err, size_t errlen);
  /* ABI 2: floats in place to root (its data receives the sum or mean). */
  int32_t (*reduce)(void* comm, float* data, size_t n, int root, int32_t avg, char* err,
                    size_t errlen);
} QlftMpiPlugin;

/* The one symbol the plugin exports. */
typedef const QlftMpiPlugin* (*QlftMpiPluginEntry)(void);
#define QLFT_MPI_PLUGIN_ENTRY "qlft_mpi_plugin"

#ifdef __cplusplus
}
#endif

#endif /* QLFT_DIST_MPI_PLUGIN_ABI_H */
