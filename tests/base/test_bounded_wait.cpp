// Waits that end: a wait whose condition never comes true gives up at its deadline, and soon
// after a stop signal (base/bounded_wait.h).
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <thread>

#include "base/bounded_wait.h"

namespace trainer {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TEST(BoundedWait, ReturnsOnceReady) {
  std::mutex mutex;
  std::condition_variable cv;
  bool ready = false;
  std::thread producer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::lock_guard<std::mutex> lock(mutex);
    ready = true;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(mutex);
  EXPECT_NO_THROW(bounded_wait(
      cv, lock, [&] { return ready; }, std::chrono::seconds(10), "x"));
  lock.unlock();
  producer.join();
}

TEST(BoundedWait, GivesUpAtItsDeadlineNamingWhatItWaitedFor) {
  std::mutex mutex;
  std::condition_variable cv;
  std::unique_lock<std::mutex> lock(mutex);
  const auto start = Clock::now();
  try {
    bounded_wait(
        cv, lock, [] { return false; }, std::chrono::seconds(1), "batch 3 of 7");
    FAIL() << "returned without its condition";
  } catch (const DeadlineExceeded& e) {
    EXPECT_EQ(std::string(e.what()), "batch 3 of 7 did not come within 1 s");
  }
  EXPECT_GE(seconds_since(start), 1.0);
  EXPECT_LT(seconds_since(start), 3.0);
}

// In a child process (a death test): the stop flag, once set, stays set for the process.
TEST(BoundedWaitDeathTest, GivesUpSoonAfterASignalEvenWithAFarDeadline) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        install_stop_signal_handlers();
        std::mutex mutex;
        std::condition_variable cv;
        std::unique_lock<std::mutex> lock(mutex);
        std::thread signaller([] {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          std::raise(SIGTERM);
        });
        const auto start = Clock::now();
        int code = 1;
        try {
          bounded_wait(
              cv, lock, [] { return false; }, std::chrono::hours(1), "the next batch");
        } catch (const StopRequested& e) {
          const double waited = seconds_since(start);
          const bool named = std::string(e.what()).find(
                                 "signal 15 arrived while waiting for "
                                 "the next batch") == 0;
          code = named && waited >= kStopGrace.count() && waited < kStopGrace.count() + 3 ? 0 : 2;
        }
        signaller.join();
        std::exit(code);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace trainer
