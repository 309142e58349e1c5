// SIGTERM/SIGINT handling: Kubernetes sends SIGTERM on `kubectl delete` and node drains. The
// handler only sets a flag; the training loop sees it between steps, writes a checkpoint and
// stops, so the next start resumes from there.
#pragma once

namespace trainer {

void install_stop_signal_handlers();
bool stop_requested();
int stop_signal_number();  // the signal received, 0 if none

}  // namespace trainer
