// The data's file system, watched. A call into it that has not returned within `timeout`
// (base/storage_calls.h) ends the job with a line naming this rank, its host and the call: the
// file and what was done to it. So does a stop signal while the job's own thread is in such a
// call, or any call is at start-up (the listing, the class names, the indexes, the first record),
// since nothing then can hear it; once training runs the input threads' calls are the training
// loop's to give up on, as it waits for them with deadlines that hear it (base/bounded_wait.h).
#pragma once

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

#include "src/distributed/process_group.h"

namespace trainer {

class StorageWatch {
 public:
  // Made on the job's own thread: the one whose calls a stop signal cannot reach.
  StorageWatch(ProcessGroup& group, std::chrono::seconds timeout);
  ~StorageWatch();
  StorageWatch(const StorageWatch&) = delete;
  StorageWatch& operator=(const StorageWatch&) = delete;
  // From here on the training loop waits for its data with deadlines that hear a stop signal.
  void start_up_done() { starting_ = false; }

 private:
  void run();
  void check(std::chrono::steady_clock::time_point now);

  ProcessGroup& group_;
  std::chrono::seconds timeout_;
  std::thread::id job_thread_;
  std::optional<std::chrono::steady_clock::time_point> stop_since_;
  std::atomic<bool> starting_{true};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace trainer
