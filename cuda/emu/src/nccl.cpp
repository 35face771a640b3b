// NCCL in the emulated build: not carried between ranks yet (issue 17, item 4). Every call that
// would need peers fails with ncclInvalidUsage and a message, so dist.backend=nccl fails clearly.
#include <nccl.h>

#include <cstdio>
#include <cstring>

namespace {
ncclResult_t not_emulated(const char* call) {
  std::fprintf(stderr, "qlft CUDA emulator: %s: NCCL is not emulated in this build\n", call);
  return ncclInvalidUsage;
}
}  // namespace

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage (NCCL is not emulated in the QLFT_CUDA_EMULATE build)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
  }
  return "unknown result code";
}
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return ncclInvalidArgument;
  std::memset(id, 0, sizeof *id);
  return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int, ncclUniqueId, int) {
  if (comm) *comm = nullptr;
  return not_emulated("ncclCommInitRank");
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int, ncclUniqueId, int, ncclConfig_t*) {
  if (comm) *comm = nullptr;
  return not_emulated("ncclCommInitRankConfig");
}
ncclResult_t ncclCommDestroy(ncclComm_t) {
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t) {
  return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* async) {
  if (async) *async = ncclInvalidUsage;
  return ncclSuccess;
}
ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                           cudaStream_t) {
  return not_emulated("ncclAllReduce");
}
ncclResult_t ncclReduceScatter(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                               cudaStream_t) {
  return not_emulated("ncclReduceScatter");
}
ncclResult_t ncclAllGather(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) {
  return not_emulated("ncclAllGather");
}
ncclResult_t ncclBroadcast(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                           cudaStream_t) {
  return not_emulated("ncclBroadcast");
}
