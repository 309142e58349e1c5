#include "src/dist/watchdog.h"

#include <spdlog/spdlog.h>

namespace trainer {

Watchdog::Watchdog(ProcessGroup& group, std::chrono::seconds timeout)
    : group_(group), timeout_(timeout), thread_([this] { run(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Watchdog::watch_event(const std::string& what, const at::cuda::CUDAEvent* done) {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back({what, step_, done, std::chrono::steady_clock::now()});
}

void Watchdog::begin_host(const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  host_ = Watched{what, step_, nullptr, std::chrono::steady_clock::now()};
}

void Watchdog::end_host() {
  std::lock_guard<std::mutex> lock(mutex_);
  host_.reset();
}

void Watchdog::run() {
  const auto poll = std::chrono::milliseconds(200);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, poll, [this] { return stop_; })) {
    const auto now = std::chrono::steady_clock::now();
    while (!events_.empty() && events_.front().done->query()) events_.pop_front();
    if (!events_.empty() && now - events_.front().since > timeout_) fire(events_.front());
    if (host_ && now - host_->since > timeout_) fire(*host_);
    try {
      group_.check_async_error();
    } catch (const std::exception& e) {
      spdlog::critical("rank {} ({}): {}; ending the job", group_.rank(), group_.host(), e.what());
      group_.abort_job(3);
    }
  }
}

void Watchdog::fire(const Watched& w) {
  spdlog::critical(
      "rank {} ({}): {} at step {} has not finished after {} s: another rank is gone, stuck or "
      "unreachable. Ending the whole job. HINT: look for the first error in the other ranks' "
      "logs; raise collective_timeout_s only if a step is legitimately that slow",
      group_.rank(), group_.host(), w.what, w.step, timeout_.count());
  group_.abort_job(3);
}

}  // namespace trainer
