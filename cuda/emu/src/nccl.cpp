// NCCL in the emulated build, carried by MPI between the emulated ranks (one process per rank,
// under mpirun). Each communicator owns its own MPI communicator from the plugin
// (make_mpi_communicator_from_plugin: a duplicate of MPI_COMM_WORLD), separate from the bootstrap
// comm_nccl.cu broadcasts the unique id over. A collective checks its buffers as a GPU would need
// them (live device ranges of the right extent, cudaErrorInvalidValue-style refusal otherwise),
// copies them to the host, runs the MPI communicator's collective, and copies the result back;
// streams execute synchronously in the emulator, so the work is done when the call returns.
//
// What is checked that a real NCCL would also need: every rank passes the unique id rank 0 made
// (the bootstrap broadcast worked), nranks equals the MPI world and rank the MPI rank, the root
// of a broadcast is a rank, the data type and reduction are ones NCCL has. Non-blocking
// communicators (config.blocking = 0) answer ncclInProgress from init and once from
// ncclCommGetAsyncError, so the caller's polling path runs. Reduction order: NCCL's ring and
// MPI's reduction both add two ranks' values in one operation (identical results at world 2);
// with more ranks the order may differ in the last bit.
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/communicator.h"
#include "parallel/mpi_plugin_loader.h"
#include "emu_internal.h"

struct qlft_emu_nccl_comm {
  std::unique_ptr<qlft::dist::Communicator> mpi;
  int rank = 0, nranks = 1;
  bool blocking = true;
  int pending_polls = 0;  // non-blocking init: GetAsyncError answers InProgress this many times
  ncclResult_t async = ncclSuccess;
};

namespace {

constexpr char kIdTag[] = "qlft-emu-nccl-id";
thread_local std::string t_last_error;

ncclResult_t fail(ncclResult_t r, const std::string& msg) {
  t_last_error = msg;
  std::fprintf(stderr, "qlft CUDA emulator (NCCL): %s\n", msg.c_str());
  return r;
}

size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
  }
  return 0;
}

// A device buffer of `bytes` the collective reads or writes: refused unless it is one live
// device range (a host pointer would fault on a GPU; NCCL does not take managed memory for
// granted either, but it works there, so managed memory is accepted).
std::string check_buffer(const void* p, size_t bytes, const char* which) {
  if (bytes == 0) return "";
  if (qlft_emu::is_managed(p, bytes)) return "";
  const std::string why = qlft_emu::check_device_range(p, bytes);
  return why.empty() ? "" : std::string(which) + " buffer: " + why;
}

template <class T>
std::vector<T> download(const void* d, size_t n) {
  std::vector<T> h(n);
  if (n && cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess)
    throw std::runtime_error("device to host copy failed");
  return h;
}
template <class T>
void upload(void* d, const std::vector<T>& h) {
  if (!h.empty() &&
      cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess)
    throw std::runtime_error("host to device copy failed");
}

// Runs f, turning a failure of the MPI transport into NCCL's remote error (the communicator is
// then unusable, as after a real NCCL failure).
template <class F>
ncclResult_t carried(ncclComm_t comm, const char* call, F f) {
  if (!comm || !comm->mpi)
    return fail(ncclInvalidArgument, std::string(call) + ": no communicator");
  if (comm->async != ncclSuccess && comm->async != ncclInProgress)
    return fail(comm->async, std::string(call) + ": the communicator failed earlier");
  try {
    f();
  } catch (const std::exception& e) {
    comm->async = ncclRemoteError;
    return fail(ncclRemoteError, std::string(call) + " over MPI: " + e.what());
  }
  return ncclSuccess;
}

bool valid_op(ncclRedOp_t op) {
  return op == ncclSum || op == ncclAvg;  // the ones comm_nccl.cu maps ReduceOp to
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
      return "invalid usage";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
  }
  return "unknown result code";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return ncclInvalidArgument;
  // A tag, the maker's pid and a time: unique per call, and recognisable when a rank receives
  // something else (an id that was not broadcast).
  std::memset(id, 0, sizeof *id);
  std::memcpy(id->internal, kIdTag, sizeof kIdTag);
  const long long stamp[2] = {
      static_cast<long long>(getpid()),
      static_cast<long long>(std::chrono::steady_clock::now().time_since_epoch().count())};
  std::memcpy(id->internal + 32, stamp, sizeof stamp);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  if (!comm) return ncclInvalidArgument;
  *comm = nullptr;
  if (std::memcmp(id.internal, kIdTag, sizeof kIdTag) != 0)
    return fail(ncclInvalidArgument,
                "ncclCommInitRank: the unique id was not made by "
                "ncclGetUniqueId (was it broadcast from rank 0?)");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument,
                "ncclCommInitRank: rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  auto c = std::make_unique<qlft_emu_nccl_comm>();
  try {
    c->mpi = qlft::dist::make_mpi_communicator_from_plugin(300);
    if (c->mpi->world() != nranks || c->mpi->rank() != rank)
      return fail(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " of " +
                                           std::to_string(nranks) + " but MPI says rank " +
                                           std::to_string(c->mpi->rank()) + " of " +
                                           std::to_string(c->mpi->world()));
    // Every rank must hold rank 0's id.
    const std::vector<std::string> ids =
        c->mpi->all_gather_bytes(std::string(id.internal, sizeof id.internal));
    for (size_t r = 0; r < ids.size(); ++r)
      if (ids[r] != ids[0])
        return fail(ncclInvalidUsage, "ncclCommInitRank: rank " + std::to_string(r) +
                                          " passed another unique id than rank 0");
  } catch (const std::exception& e) {
    return fail(ncclSystemError, std::string("ncclCommInitRank: MPI transport: ") + e.what());
  }
  c->rank = rank;
  c->nranks = nranks;
  c->blocking = !config || config->blocking != 0;
  c->pending_polls = c->blocking ? 0 : 1;
  c->async = c->blocking ? ncclSuccess : ncclInProgress;
  *comm = c.release();
  return (*comm)->blocking ? ncclSuccess : ncclInProgress;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async) {
  if (!comm || !async) return ncclInvalidArgument;
  if (comm->async == ncclInProgress && comm->pending_polls-- <= 0) comm->async = ncclSuccess;
  *async = comm->async;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (!qlft_emu::stream_is_valid(stream))
    return fail(ncclInvalidArgument, "ncclAllReduce: bad stream");
  if (!valid_op(op)) return fail(ncclInvalidArgument, "ncclAllReduce: reduction not emulated");
  if (type != ncclFloat32 && type != ncclFloat64)
    return fail(ncclInvalidArgument, "ncclAllReduce: only float and double are emulated");
  const size_t bytes = count * type_bytes(type);
  for (const std::string& w :
       {check_buffer(send, bytes, "send"), check_buffer(recv, bytes, "recv")})
    if (!w.empty()) return fail(ncclInvalidArgument, "ncclAllReduce: " + w);
  const auto rop = op == ncclAvg ? qlft::dist::ReduceOp::Avg : qlft::dist::ReduceOp::Sum;
  return carried(comm, "ncclAllReduce", [&] {
    if (type == ncclFloat32) {
      auto h = download<float>(send, count);
      comm->mpi->all_reduce(h.data(), count, rop);
      upload(recv, h);
    } else {
      auto h = download<double>(send, count);
      comm->mpi->all_reduce(h.data(), count, rop);
      upload(recv, h);
    }
  });
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (!qlft_emu::stream_is_valid(stream))
    return fail(ncclInvalidArgument, "ncclReduceScatter: bad stream");
  if (!valid_op(op)) return fail(ncclInvalidArgument, "ncclReduceScatter: reduction not emulated");
  if (type != ncclFloat32)
    return fail(ncclInvalidArgument, "ncclReduceScatter: only float is emulated");
  if (!comm) return fail(ncclInvalidArgument, "ncclReduceScatter: no communicator");
  const size_t n = count * size_t(comm->nranks);
  for (const std::string& w :
       {check_buffer(send, n * 4, "send"), check_buffer(recv, count * 4, "recv")})
    if (!w.empty()) return fail(ncclInvalidArgument, "ncclReduceScatter: " + w);
  const auto rop = op == ncclAvg ? qlft::dist::ReduceOp::Avg : qlft::dist::ReduceOp::Sum;
  return carried(comm, "ncclReduceScatter", [&] {
    auto in = download<float>(send, n);
    std::vector<float> out(count);
    comm->mpi->reduce_scatter(in.data(), out.data(), count, rop);
    upload(recv, out);
  });
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  if (!qlft_emu::stream_is_valid(stream))
    return fail(ncclInvalidArgument, "ncclAllGather: bad stream");
  if (!comm) return fail(ncclInvalidArgument, "ncclAllGather: no communicator");
  const size_t eb = type_bytes(type);
  if (eb == 0) return fail(ncclInvalidArgument, "ncclAllGather: unknown data type");
  const size_t bytes = count * eb, total = bytes * size_t(comm->nranks);
  for (const std::string& w :
       {check_buffer(send, bytes, "send"), check_buffer(recv, total, "recv")})
    if (!w.empty()) return fail(ncclInvalidArgument, "ncclAllGather: " + w);
  return carried(comm, "ncclAllGather", [&] {
    auto in = download<uint8_t>(send, bytes);
    std::vector<uint8_t> out(total);
    comm->mpi->all_gather_raw(in.data(), out.data(), bytes);
    upload(recv, out);
  });
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  if (!qlft_emu::stream_is_valid(stream))
    return fail(ncclInvalidArgument, "ncclBroadcast: bad stream");
  if (!comm) return fail(ncclInvalidArgument, "ncclBroadcast: no communicator");
  if (root < 0 || root >= comm->nranks)
    return fail(ncclInvalidArgument, "ncclBroadcast: root " + std::to_string(root) +
                                         " is not a rank of " + std::to_string(comm->nranks));
  const size_t eb = type_bytes(type);
  if (eb == 0) return fail(ncclInvalidArgument, "ncclBroadcast: unknown data type");
  const size_t bytes = count * eb;
  // Only the root's send buffer is read.
  for (const std::string& w :
       {comm->rank == root ? check_buffer(send, bytes, "send") : std::string(),
        check_buffer(recv, bytes, "recv")})
    if (!w.empty()) return fail(ncclInvalidArgument, "ncclBroadcast: " + w);
  return carried(comm, "ncclBroadcast", [&] {
    auto h = download<uint8_t>(comm->rank == root ? send : recv, bytes);
    comm->mpi->broadcast(h.data(), bytes, root);
    upload(recv, h);
  });
}
