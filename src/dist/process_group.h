// The processes of one training job and their collectives. Under mpirun: rank and world size
// from MPI, the local rank from a shared-memory split of MPI_COMM_WORLD, and (on GPUs) an NCCL
// communicator created from a unique id that rank 0 broadcasts over MPI. Started alone, a world of
// one with no MPI at all. Host-side values (counts, timings) always travel over MPI.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>
#include <string>
#include <vector>

#include "src/environment.h"

namespace trainer {

class Watchdog;

class ProcessGroup {
 public:
  // Initialises MPI when env.under_mpi; otherwise a world of one.
  explicit ProcessGroup(const Environment& env);
  ~ProcessGroup();  // destroys the NCCL communicator, then finalises MPI
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  bool uses_mpi() const { return uses_mpi_; }
  const std::string& host() const { return hosts_[rank_]; }
  const std::vector<std::string>& hosts() const { return hosts_; }  // by rank

  // Creates the NCCL communicator on `device` (collective: every rank calls it). Returns what NCCL
  // chose (version, network transport) for the log. No-op on the CPU or in a world of one.
  std::string init_nccl(c10::Device device);
  bool uses_nccl() const { return nccl_ != nullptr; }

  // In-place sum over ranks of a dense tensor (same strides on every rank): NCCL on `stream` for
  // device tensors (returns at once), MPI for host tensors (returns when done). Every rank calls it
  // in the same order.
  void allreduce_sum_(at::Tensor& tensor, cudaStream_t stream = nullptr);
  // Overwrites `tensor` on every rank with rank `root`'s, like allreduce_sum_.
  void broadcast_(at::Tensor& tensor, int root, cudaStream_t stream = nullptr);

  // Host values over MPI (identity in a world of one).
  int64_t sum(int64_t value);
  std::vector<double> allgather(double value);

  // The watchdog that times this group's collectives, if one exists: a Watchdog registers itself
  // here for its lifetime. Blocking MPI calls report to it; so do the reducer's NCCL reductions.
  void set_watchdog(Watchdog* watchdog) { watchdog_ = watchdog; }
  Watchdog* watchdog() const { return watchdog_; }

  // Polls NCCL for an asynchronous error (a peer died, the network failed); throws if any.
  void check_async_error();
  // Ends the whole job now: aborts the NCCL communicator and calls MPI_Abort, so no rank is left
  // waiting in a collective. Safe to call from any thread, more than once.
  [[noreturn]] void abort_job(int exit_code);

 private:
  bool uses_mpi_ = false;
  bool capture_nccl_log_ = false;  // the user left NCCL_DEBUG unset: report NCCL's network choice
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::vector<std::string> hosts_;
  ncclComm_t nccl_ = nullptr;
  Watchdog* watchdog_ = nullptr;
};

}  // namespace trainer
