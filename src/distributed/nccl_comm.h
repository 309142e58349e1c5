// The device transport: an NCCL communicator over every rank's GPU, carrying device tensors on a
// CUDA stream. Made from a unique id that rank 0 creates and broadcasts over the launcher's host
// transport (src/distributed/host_comm.h), the one NCCL needs to meet. Beside MPI (mpi_comm.cpp)
// and Gloo (gloo_comm.cpp), one transport per file; src/distributed/process_group.h joins them.
#pragma once

#include <ATen/core/Tensor.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <functional>
#include <memory>
#include <string>

#include "src/distributed/host_comm.h"

namespace trainer {

// Runs `step`, a blocking step of the set-up that every rank takes, timed by the collective
// watchdog under the name `what`.
using WatchedStep = std::function<void(const char* what, const std::function<void()>& step)>;

class NcclComm {
 public:
  // Collective: every rank calls it with the current CUDA device set to its GPU.
  NcclComm(HostComm& bootstrap, const WatchedStep& watched);
  ~NcclComm();  // destroys the communicator (after a finished or aborted job)
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // In-place sum over ranks of a dense device tensor, on `stream`; returns at once.
  void allreduce_sum_(at::Tensor& tensor, cudaStream_t stream);
  // Overwrites `tensor` on every rank with rank `root`'s, on `stream`; returns at once.
  void broadcast_(at::Tensor& tensor, int root, cudaStream_t stream);
  // Throws if NCCL has met an asynchronous error (a peer died, the network failed).
  void check_async_error();
  // Aborts the communicator, so that collectives in flight return; the process exits after it.
  // Safe from any thread.
  void abort();
  // NCCL's version, e.g. "2.27.5".
  static std::string version();

 private:
  ncclComm_t comm_ = nullptr;
};

}  // namespace trainer
