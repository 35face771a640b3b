// NCCL in the emulated build: the ranks (one process each, on one host) meet through the
// emulator's own transport (nccl_transport.h: one file per rank and collective in a directory
// named from the unique id), so the emulator needs no MPI of its own; comm_nccl.cu still sends
// rank 0's unique id to the others over its bootstrap communicator, as with a real NCCL. A
// collective checks its buffers as a GPU would need them (live device ranges of the right extent,
// cudaErrorInvalidValue-style refusal otherwise), copies them to the host, exchanges them, reduces
// in rank order, and copies the result back; streams execute synchronously in the emulator, so
// the work is done when the call returns.
//
// What is checked that a real NCCL would also need: every rank passes the unique id rank 0 made
// and the same nranks (a rank holding another id meets no one: the first round times out naming
// the ranks missing), the root of a broadcast is a rank, the data type and reduction are ones NCCL
// has. Non-blocking communicators (config.blocking = 0) answer ncclInProgress from init and once
// from ncclCommGetAsyncError, so the caller's polling path runs. Reduction: rank 0's values plus
// each other rank's in rank order, then Avg as the MPI communicator scales (float: times
// 1/nranks; double: divided by nranks), so at two ranks the results are bit-identical to MPI's.
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

#include "emu_internal.h"
#include "nccl_transport.h"

struct qlft_emu_nccl_comm {
  std::unique_ptr<qlft_emu::NcclTransport> net;
  int rank = 0, nranks = 1;
  bool blocking = true;
  int pending_polls = 0;  // non-blocking init: GetAsyncError answers InProgress this many times
  ncclResult_t async = ncclSuccess;
};

namespace {

constexpr char kIdTag[] = "qlft-emu-nccl-id";
constexpr double kTimeoutS = 300;  // a round not complete by then fails (a rank is gone)

// The meeting place of the ranks holding this id (its stamp: rank 0's pid and a time).
std::string meeting_name(const ncclUniqueId& id) {
  static const char hex[] = "0123456789abcdef";
  std::string s = "qlft-emu-nccl-";
  for (int i = 32; i < 48; ++i) {
    const unsigned char b = static_cast<unsigned char>(id.internal[i]);
    s += hex[b >> 4];
    s += hex[b & 15];
  }
  return s;
}

// Every rank's n values of type T from one exchange, reduced into out in rank order (avg: scaled
// as the MPI communicator scales). `offset` selects each rank's slice (reduce-scatter).
template <class T>
void reduce_ranks(const std::vector<std::string>& all, size_t offset, size_t n, bool avg, T* out) {
  const int nranks = int(all.size());
  std::memcpy(out, all[0].data() + offset * sizeof(T), n * sizeof(T));
  for (int r = 1; r < nranks; ++r) {
    const T* v = reinterpret_cast<const T*>(all[size_t(r)].data()) + offset;
    for (size_t i = 0; i < n; ++i) out[i] += v[i];
  }
  if (!avg) return;
  if constexpr (sizeof(T) == 4) {
    const float s = 1.0f / static_cast<float>(nranks);
    for (size_t i = 0; i < n; ++i) out[i] *= s;
  } else {
    for (size_t i = 0; i < n; ++i) out[i] /= nranks;
  }
}
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

// Runs f, turning a failure of the transport into NCCL's remote error (the communicator is
// then unusable, as after a real NCCL failure).
template <class F>
ncclResult_t carried(ncclComm_t comm, const char* call, F f) {
  if (!comm || !comm->net)
    return fail(ncclInvalidArgument, std::string(call) + ": no communicator");
  if (comm->async != ncclSuccess && comm->async != ncclInProgress)
    return fail(comm->async, std::string(call) + ": the communicator failed earlier");
  try {
    f();
  } catch (const std::exception& e) {
    comm->async = ncclRemoteError;
    return fail(ncclRemoteError, std::string(call) + ": " + e.what());
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
    c->net = std::make_unique<qlft_emu::NcclTransport>(meeting_name(id), rank, nranks, kTimeoutS);
    // Every rank must hold rank 0's id and count the same ranks.
    const std::string mine = std::string(id.internal, sizeof id.internal) + std::to_string(nranks);
    const std::vector<std::string> all = c->net->exchange(mine.data(), mine.size());
    for (size_t r = 0; r < all.size(); ++r)
      if (all[r] != all[0])
        return fail(ncclInvalidUsage, "ncclCommInitRank: rank " + std::to_string(r) +
                                          " passed another unique id or nranks than rank 0");
  } catch (const std::exception& e) {
    return fail(ncclSystemError, std::string("ncclCommInitRank: transport: ") + e.what());
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
  return carried(comm, "ncclAllReduce", [&] {
    const auto all = comm->net->exchange(download<uint8_t>(send, bytes).data(), bytes);
    std::vector<uint8_t> h(bytes);
    if (type == ncclFloat32)
      reduce_ranks(all, 0, count, op == ncclAvg, reinterpret_cast<float*>(h.data()));
    else
      reduce_ranks(all, 0, count, op == ncclAvg, reinterpret_cast<double*>(h.data()));
    upload(recv, h);
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
  return carried(comm, "ncclReduceScatter", [&] {
    const auto all = comm->net->exchange(download<uint8_t>(send, n * 4).data(), n * 4);
    std::vector<float> out(count);
    reduce_ranks(all, count * size_t(comm->rank), count, op == ncclAvg, out.data());
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
    const auto all = comm->net->exchange(in.data(), bytes);
    for (int r = 0; r < comm->nranks; ++r)
      std::memcpy(out.data() + size_t(r) * bytes, all[size_t(r)].data(), bytes);
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
    std::vector<uint8_t> h;
    if (comm->rank == root) h = download<uint8_t>(send, bytes);
    const auto all = comm->net->exchange(h.data(), h.size());
    h.assign(all[size_t(root)].begin(), all[size_t(root)].end());
    upload(recv, h);
  });
}
