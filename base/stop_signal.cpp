#include "base/stop_signal.h"

#include <atomic>
#include <csignal>

namespace trainer {
namespace {

// The handler runs on whichever thread the kernel picks (a reader, a decoder), not necessarily the
// one that reads the flag: volatile sig_atomic_t only holds within one thread, a lock-free atomic
// across threads and in a signal handler (ThreadSanitizer reported the race).
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler must not take a lock");

extern "C" void on_stop_signal(int signal) { g_signal.store(signal, std::memory_order_relaxed); }

}  // namespace

void install_stop_signal_handlers() {
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
}

bool stop_requested() { return g_signal.load(std::memory_order_relaxed) != 0; }

int stop_signal_number() { return g_signal.load(std::memory_order_relaxed); }

}  // namespace trainer
