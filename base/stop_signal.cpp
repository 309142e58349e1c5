#include "base/stop_signal.h"

#include <csignal>

namespace trainer {
namespace {

volatile std::sig_atomic_t g_signal = 0;

extern "C" void on_stop_signal(int signal) { g_signal = signal; }

}  // namespace

void install_stop_signal_handlers() {
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
}

bool stop_requested() { return g_signal != 0; }

int stop_signal_number() { return g_signal; }

}  // namespace trainer
