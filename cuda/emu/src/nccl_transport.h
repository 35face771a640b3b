// The emulated NCCL's own transport between the ranks of one communicator: processes on one host
// meeting in a directory named from the unique id (/dev/shm where it exists, else $TMPDIR or
// /tmp). Every collective is one numbered round in which each rank publishes its bytes as a file
// (written under a temporary name and renamed, so no reader sees it partly written) and reads
// every rank's once all are there. Ranks call collectives in the same order (NCCL's contract), so
// round numbers agree; a rank removes its own file of round k - 2 when it publishes round k (every
// rank has reached round k - 1, so has read it), and the last rank to leave removes the rest.
// Nothing here knows MPI: the emulator needs no library to run several ranks.
#pragma once

#include <string>
#include <vector>

namespace qlft_emu {

class NcclTransport {
 public:
  // Joins (creating if needed) the meeting place `name` as rank `rank` of `nranks`; a round not
  // complete within timeout_s throws std::runtime_error naming the ranks that are missing.
  NcclTransport(const std::string& name, int rank, int nranks, double timeout_s);
  ~NcclTransport();
  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  // One round: publishes `bytes` bytes at `data` and returns every rank's, in rank order.
  std::vector<std::string> exchange(const void* data, size_t bytes);

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }

 private:
  std::string file(long round, int rank) const;
  std::string dir_;
  int rank_, nranks_;
  double timeout_s_;
  long round_ = 0;
};

}  // namespace qlft_emu
