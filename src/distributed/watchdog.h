// Collective timeouts. A thread watches every collective in flight (NCCL reductions on a CUDA
// stream, and every blocking MPI call of the process group while it exists) and, when one has not
// finished within the timeout, logs which rank, step and collective and ends the whole job, instead
// of leaving it hung for 30 minutes. After a stop signal it ends a collective that still waits
// kStopInCollective, so that SIGTERM ends a rank whose peer is stuck. It also polls NCCL's
// asynchronous errors (a peer gone, the network down).
#pragma once

#include <ATen/cuda/CUDAEvent.h>
#include <c10/core/Device.h>
#include <c10/cuda/CUDAStream.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "src/distributed/process_group.h"

namespace trainer {

// After a stop signal a collective that still waits this long ends the job: a healthy step and
// stop vote finish well within it, and mpirun's daemons send SIGKILL 20 s after SIGTERM
// (odls_base_sigkill_timeout, as the MPIJob sets it), which would end the rank without a word.
constexpr std::chrono::seconds kStopInCollective{10};

class Watchdog final : public CollectiveWatch {
 public:
  // `device`: where the watched streams run (the thread binds to it, so that querying their
  // events creates no CUDA context on another GPU).
  Watchdog(ProcessGroup& group, std::chrono::seconds timeout, c10::Device device);
  ~Watchdog();  // stops the thread
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void set_step(int64_t step) override { step_ = step; }
  void watch_stream(const std::string& what, const c10::cuda::CUDAStream& stream) override;
  void begin_host(const std::string& what) override;
  void end_host() override;

 private:
  struct Watched {
    std::string what;
    int64_t step;
    std::unique_ptr<at::cuda::CUDAEvent> done;  // null: the host collective
    std::chrono::steady_clock::time_point since;
  };
  void run();
  void poll();
  [[noreturn]] void fire(const Watched& w);
  [[noreturn]] void fire_stopped(const Watched& w, std::chrono::steady_clock::time_point now);

  ProcessGroup& group_;
  std::chrono::seconds timeout_;
  c10::Device device_;
  std::atomic<int64_t> step_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Watched> events_;  // in enqueue order, so each finishes no later than the next
  std::vector<std::unique_ptr<at::cuda::CUDAEvent>> spare_events_;
  std::optional<Watched> host_;
  bool stop_ = false;
  std::optional<std::chrono::steady_clock::time_point> stop_since_;  // the stop signal seen
  std::thread thread_;
};

}  // namespace trainer
