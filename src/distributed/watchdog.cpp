#include "src/distributed/watchdog.h"

#include <c10/cuda/CUDAFunctions.h>
#include <spdlog/spdlog.h>

#include "base/stop_signal.h"
#include "src/distributed/liveness.h"

namespace trainer {

// Note [One event per watched collective]
// Each watched reduction gets an event of its own, recorded right after it on its stream and
// recycled once it has completed. Re-recording one event per bucket every step would not do:
// an event reports only its latest recording, and with the host a step ahead of the GPU (no
// host sync per step) the latest recording is nearly always still pending, so a healthy job
// would look stuck and be ended after the timeout.

Watchdog::Watchdog(ProcessGroup& group, std::chrono::seconds timeout, c10::Device device)
    : group_(group), timeout_(timeout), device_(device), thread_([this] { run(); }) {
  group_.set_watchdog(this);
}

Watchdog::~Watchdog() {
  group_.set_watchdog(nullptr);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Watchdog::watch_stream(const std::string& what, const c10::cuda::CUDAStream& stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::unique_ptr<at::cuda::CUDAEvent> done;
  if (spare_events_.empty()) {
    done = std::make_unique<at::cuda::CUDAEvent>(cudaEventDisableTiming);
  } else {
    done = std::move(spare_events_.back());
    spare_events_.pop_back();
  }
  done->record(stream);
  events_.push_back({what, step_, std::move(done), std::chrono::steady_clock::now()});
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
  const auto poll_every = std::chrono::milliseconds(200);
  std::unique_lock<std::mutex> lock(mutex_);
  try {
    if (device_.is_cuda()) c10::cuda::set_device(device_.index());
    while (!wake_.wait_for(lock, poll_every, [this] { return stop_; })) poll();
  } catch (const std::exception& e) {  // a CUDA or NCCL error: the job cannot go on
    spdlog::critical("rank {} ({}): {}; ending the job", group_.rank(), group_.host(), e.what());
    group_.abort_job(3);
  }
}

// Called with mutex_ held. Note [One event per watched collective]
void Watchdog::poll() {
  const auto now = std::chrono::steady_clock::now();
  while (!events_.empty() && events_.front().done->query()) {
    spare_events_.push_back(std::move(events_.front().done));
    events_.pop_front();
  }
  const Watched* oldest = !events_.empty() ? &events_.front() : nullptr;
  if (host_ && (!oldest || host_->since < oldest->since)) oldest = &*host_;
  if (oldest && now - oldest->since > timeout_) fire(*oldest);
  if (oldest && stop_requested()) {
    if (!stop_since_) stop_since_ = now;
    if (now - *stop_since_ > kStopInCollective && now - oldest->since > kStopInCollective)
      fire_stopped(*oldest, now);
  }
  group_.check_async_error();
}

void Watchdog::fire(const Watched& w) {
  const std::string why = peers_stuck_on_storage();
  spdlog::critical(
      "rank {} ({}): {} at step {} has not finished after {} s: {}. Ending the whole job. HINT: "
      "{}; raise collective_timeout_s only if a step is legitimately that slow",
      group_.rank(), group_.host(), w.what, w.step, timeout_.count(),
      why.empty() ? "another rank is gone, stuck or unreachable" : why,
      why.empty() ? "look for the first error in the other ranks' logs"
                  : "check that host's mount of the data");
  spdlog::default_logger()->flush();
  const bool told = tell_peers_this_rank_ends(
      fmt::format("{} at step {} has not finished after {} s", w.what, w.step, timeout_.count()), 3,
      false);
  group_.abort_job(3, told);
}

void Watchdog::fire_stopped(const Watched& w, std::chrono::steady_clock::time_point now) {
  const std::string why = peers_stuck_on_storage();
  spdlog::warn(
      "rank {} ({}): signal {} arrived while waiting in {} at step {}, which has not finished "
      "for {} s: {}. Stopping the whole job without a checkpoint at this step",
      group_.rank(), group_.host(), stop_signal_number(), w.what, w.step,
      std::chrono::duration_cast<std::chrono::seconds>(now - w.since).count(),
      why.empty() ? "another rank does not answer" : why);
  spdlog::default_logger()->flush();
  group_.abort_job(128 + stop_signal_number());
}

}  // namespace trainer
