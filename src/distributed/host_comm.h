// The launcher's transport for host-side collectives: counts, timings, the NCCL id, and the
// gradient buckets when there is no GPU. One implementation per launcher, each in its own file:
// MPI under mpirun (mpi_comm.cpp), Gloo over the c10d store under torchrun (gloo_comm.cpp).
// Every rank calls the collectives in the same order; they block until done.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <memory>

#include "src/environment.h"

namespace trainer {

class HostComm {
 public:
  virtual ~HostComm() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;  // among the processes on this node
  virtual int local_size() const = 0;

  // In-place sum over ranks of a dense CPU tensor (float, double, int64 or uint8; the same
  // strides on every rank).
  virtual void allreduce_sum_(at::Tensor& tensor) = 0;
  // Overwrites a dense CPU tensor on every rank with rank `root`'s.
  virtual void broadcast_(at::Tensor& tensor, int root) = 0;
  virtual void barrier() = 0;
  // Starts an in-place sum over ranks of one host value and returns at once; the returned
  // function waits for it and returns the sum, and is called exactly once. It runs on a channel
  // of its own (MPI: a duplicate communicator; Gloo: its queue, in the order of the calls), so
  // other collectives may be called while it is under way.
  virtual std::function<int64_t()> start_sum(int64_t value) = 0;
  // Ends every process of the job now (MPI_Abort; under torchrun this process exits and the
  // elastic agent stops the others). Safe from any thread.
  [[noreturn]] virtual void abort(int exit_code) = 0;
};

// Initialises MPI (MPI_THREAD_MULTIPLE); the communicator's local ranks from a shared-memory
// split. Finalises MPI when destroyed.
std::unique_ptr<HostComm> make_mpi_comm();

// Meets the other ranks at the c10d TCPStore at MASTER_ADDR:MASTER_PORT (served by rank 0 or by
// the elastic agent) and builds a Gloo process group over it. `timeout`: how long to wait for
// the store; Gloo's collectives give up after twice that.
std::unique_ptr<HostComm> make_gloo_comm(const Environment& env, std::chrono::seconds timeout);

}  // namespace trainer
