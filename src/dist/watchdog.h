// Collective timeouts. A thread watches every collective in flight (CUDA events of NCCL
// reductions, or a host MPI call) and, when one has not finished within the timeout, logs which
// rank, step and collective and ends the whole job, instead of leaving it hung for 30 minutes.
// It also polls NCCL's asynchronous errors (a peer gone, the network down).
#pragma once

#include <ATen/cuda/CUDAEvent.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "src/dist/process_group.h"

namespace trainer {

class Watchdog {
 public:
  Watchdog(ProcessGroup& group, std::chrono::seconds timeout);
  ~Watchdog();  // stops the thread
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void set_step(int64_t step) { step_ = step; }
  // A device collective: done when `done` has completed. The event must outlive the watch.
  void watch_event(const std::string& what, const at::cuda::CUDAEvent* done);
  // A host collective (blocking MPI) about to start / just finished, on the calling thread.
  void begin_host(const std::string& what);
  void end_host();

 private:
  struct Watched {
    std::string what;
    int64_t step;
    const at::cuda::CUDAEvent* done;  // null: the host collective
    std::chrono::steady_clock::time_point since;
  };
  void run();
  [[noreturn]] void fire(const Watched& w);

  ProcessGroup& group_;
  std::chrono::seconds timeout_;
  std::atomic<int64_t> step_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Watched> events_;
  std::optional<Watched> host_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace trainer
