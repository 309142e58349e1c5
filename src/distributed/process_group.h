// The processes of one training job and their collectives. Under mpirun or torchrun the ranks,
// the world size and the node-local ranks come from the launcher, and host-side collectives go
// over its transport (src/distributed/host_comm.h: MPI, or Gloo over the c10d store); on GPUs an
// NCCL communicator (src/distributed/nccl_comm.h), made from a unique id rank 0 broadcasts over
// that transport, carries the device tensors. Started alone, a world of one with neither.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "src/distributed/host_comm.h"
#include "src/environment.h"

namespace trainer {

class NcclComm;

// What times a group's collectives: the collective watchdog (src/distributed/watchdog.h) registers
// itself as one for its lifetime. Every collective reports to it, so that a rank that never joins
// ends the job instead of hanging it.
class CollectiveWatch {
 public:
  virtual ~CollectiveWatch() = default;
  // The training step now running, for the message when a collective times out.
  virtual void set_step(int64_t step) = 0;
  // A device collective just enqueued on `stream`: done when the stream gets past this point.
  virtual void watch_stream(const std::string& what, const c10::cuda::CUDAStream& stream) = 0;
  // A blocking host collective about to start / just finished, on the calling thread.
  virtual void begin_host(const std::string& what) = 0;
  virtual void end_host() = 0;
};

class ProcessGroup {
 public:
  // Joins the job `env.launcher` started. `timeout`: how long Gloo waits for the rendezvous and
  // for a collective (the watchdog, which names the collective, fires first).
  ProcessGroup(const Environment& env, std::chrono::seconds timeout);
  ~ProcessGroup();  // destroys the NCCL communicator, then the launcher's transport
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  // Started by a launcher: collectives go over its transport, even in a world of one.
  bool launched() const { return comm_ != nullptr; }
  Launcher launcher() const { return launcher_; }
  const std::string& host() const { return hosts_[rank_]; }
  const std::vector<std::string>& hosts() const { return hosts_; }  // by rank

  // Creates the NCCL communicator on `device` (collective: every rank calls it). Returns what NCCL
  // chose (version, network transport) for the log. No-op on the CPU or when not launched.
  std::string init_nccl(c10::Device device);
  bool uses_nccl() const { return nccl_ != nullptr; }

  // In-place sum over ranks of a dense tensor (same strides on every rank): NCCL on `stream` for
  // device tensors (returns at once), the launcher's transport for host tensors (returns when
  // done). Every rank calls it in the same order.
  void allreduce_sum_(at::Tensor& tensor, cudaStream_t stream = nullptr);
  // Overwrites `tensor` on every rank with rank `root`'s, like allreduce_sum_.
  void broadcast_(at::Tensor& tensor, int root, cudaStream_t stream = nullptr);

  // Host values (identity in a world of one); `what` names the sum if it times out.
  int64_t sum(int64_t value, const char* what = "the sum of a count");
  // The same sum, started now and read later: returns at once, and the returned function waits
  // for the sum (timed by the watchdog, named `what`) and returns it. Other collectives may run
  // while it is under way. Every rank starts them in the same order and reads each once.
  std::function<int64_t()> start_sum(int64_t value, std::string what);
  std::vector<double> allgather(double value);
  // Returns when every rank has called it; `what` names it if it times out.
  void barrier(const char* what);

  // The watchdog that times this group's collectives, if one exists: a Watchdog registers itself
  // here for its lifetime. Blocking host collectives report to it; so do the reducer's NCCL
  // reductions.
  void set_watchdog(CollectiveWatch* watchdog) { watchdog_ = watchdog; }
  CollectiveWatch* watchdog() const { return watchdog_; }

  // Polls NCCL for an asynchronous error (a peer died, the network failed); throws if any.
  void check_async_error();
  // Ends the whole job now: aborts the NCCL communicator and the launcher's job (MPI_Abort, or
  // this process's exit, which torchrun answers by stopping the others), so no rank is left
  // waiting in a collective. `peers_told`: every other rank has been told and ends by itself
  // (Note [A last word], src/distributed/liveness.cpp), so this process just exits: MPI_Abort
  // would hold it until mpirun's daemons kill it (odls_base_sigkill_timeout after the abort,
  // twice), and mpirun ends the job on its non-zero exit all the same. Safe to call from any
  // thread, more than once.
  [[noreturn]] void abort_job(int exit_code, bool peers_told = false);

 private:
  std::vector<std::string> gather_hostnames(const std::string& mine);

  Launcher launcher_;
  std::unique_ptr<HostComm> comm_;  // null: alone
  bool capture_nccl_log_ = false;   // the user left NCCL_DEBUG unset: report NCCL's network choice
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::vector<std::string> hosts_;
  std::unique_ptr<NcclComm> nccl_;  // null: no GPU, or alone
  CollectiveWatch* watchdog_ = nullptr;
};

}  // namespace trainer
