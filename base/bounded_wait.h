// Waits that end. A thread that waits for another (the training loop for its next batch, a
// decoder for a record) gives up when its deadline passes or, soon after a stop signal, when what
// it waits for still has not come: a rank never hangs, and SIGTERM always ends it.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>

#include "base/stop_signal.h"
#include "base/user_error.h"

namespace trainer {

// A wait gave up because SIGTERM/SIGINT arrived and what it waited for did not come within
// kStopGrace: the rank stops without it.
class StopRequested : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A wait passed its deadline: the message names what was waited for and for how long.
class DeadlineExceeded : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// After a stop signal a wait goes on this long: long enough for a batch that is on its way (so the
// ranks still agree on a step and checkpoint), short next to any pod's grace period.
constexpr std::chrono::seconds kStopGrace{5};

// Waits on `cv` (with `lock` held) until `ready()`. Throws DeadlineExceeded once `timeout` has
// passed, StopRequested once kStopGrace has passed since a stop signal; `what` names the wait.
template <typename Ready>
void bounded_wait(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, Ready ready,
                  std::chrono::seconds timeout, const std::string& what) {
  using Clock = std::chrono::steady_clock;
  // Signals wake no condition variable: the flag is polled this often.
  constexpr auto kPoll = std::chrono::milliseconds(100);
  const auto start = Clock::now();
  auto deadline = start + timeout;
  bool stopping = false;
  while (!cv.wait_for(lock, kPoll, ready)) {
    const auto now = Clock::now();
    if (!stopping && stop_requested()) {
      stopping = true;
      deadline = std::min(deadline, now + kStopGrace);
    }
    if (now < deadline) continue;
    const auto waited = std::chrono::duration_cast<std::chrono::seconds>(now - start).count();
    if (stopping)
      throw StopRequested(detail::concat("signal ", stop_signal_number(),
                                         " arrived while waiting for ", what, " (", waited, " s)"));
    throw DeadlineExceeded(detail::concat(what, " did not come within ", timeout.count(), " s"));
  }
}

}  // namespace trainer
