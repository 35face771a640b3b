// The NCCL communicator's entry point, defined in cuda/src/comm_nccl.cu (builds with
// QLFT_CUDA=ON). Declared here so src/ never includes CUDA or NCCL headers.
#pragma once

#include <memory>

#include "dist/communicator.h"

namespace qlft::dist {

#if QLFT_HAVE_CUDA
// One NCCL communicator over every rank of bootstrap (normally MPI): rank 0 makes the NCCL
// unique id and broadcasts it through bootstrap; each rank uses CUDA device local_rank modulo
// the device count. Buffers passed to its collectives are device memory. Throws
// QLFT_ERR_BACKEND without a device, QLFT_ERR_DISTRIBUTED on NCCL failure or timeout.
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> bootstrap,
                                                     double timeout_s);
#endif

}  // namespace qlft::dist
