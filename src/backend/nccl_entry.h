// The NCCL communicator's entry point, defined in cuda/src/comm_nccl.cu (qlft_cuda: the CUDA
// plugin, and tests linking qlft_cuda). libqlft reaches it through the CUDA plugin. Declared here
// so src/ never includes CUDA or NCCL headers.
#pragma once

#include <memory>

#include "core/communicator.h"

namespace qlft::dist {

// One NCCL communicator over every rank of bootstrap (normally MPI): rank 0 makes the NCCL
// unique id and broadcasts it through bootstrap; each rank uses CUDA device local_rank modulo
// the device count. Buffers passed to its collectives are device memory. Throws
// QLFT_ERR_BACKEND without a device, QLFT_ERR_DISTRIBUTED on NCCL failure or timeout.
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> bootstrap,
                                                     double timeout_s);

}  // namespace qlft::dist
