#include "src/run/storage_watch.h"

#include <signal.h>
#include <spdlog/spdlog.h>

#include "base/bounded_wait.h"
#include "base/stop_signal.h"
#include "base/storage_calls.h"
#include "src/distributed/host_lookup.h"
#include "src/distributed/liveness.h"

namespace trainer {

StorageWatch::StorageWatch(ProcessGroup& group, std::chrono::seconds timeout)
    : group_(group),
      timeout_(timeout),
      job_thread_(std::this_thread::get_id()),
      thread_([this] { run(); }) {}

StorageWatch::~StorageWatch() {
  stop_ = true;
  thread_.join();
}

void StorageWatch::run() {
  while (!stop_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    check(std::chrono::steady_clock::now());
  }
}

void StorageWatch::check(std::chrono::steady_clock::time_point now) {
  if (const auto stuck = oldest_storage_call(); stuck && now - stuck->since > timeout_) {
    const std::string why = "the file system does not answer: " + describe_stuck(*stuck, now);
    // Under torchrun this host leaves the job: its agent would start the rank again on the same
    // mount, round after round, and the other hosts' agents start the group without it.
    const pid_t agent = torchrun_agent();
    spdlog::critical(
        "rank {} ({}): {} (storage_timeout_s = {}). {}; a restart resumes from the newest "
        "checkpoint. HINT: check that host's mount of the data (an FSx or NFS server, or its "
        "network, gone: `df` or `ls` there hangs too)",
        group_.rank(), group_.host(), why, timeout_.count(),
        agent ? fmt::format("Ending this host's part of the job and torchrun's agent (pid {}), "
                            "which would start it again on the same mount",
                            agent)
              : std::string("Ending the whole job"));
    spdlog::default_logger()->flush();
    const bool told = tell_peers_this_rank_ends(why, 3, true);
    if (agent) ::kill(agent, SIGKILL);  // Note [A launcher that waits on lost hosts]
    group_.abort_job(3, told);
  }
  if (!stop_requested()) return;
  if (!stop_since_) stop_since_ = now;
  const auto stuck = oldest_storage_call(starting_ ? std::nullopt : std::optional(job_thread_));
  if (!stuck || now - *stop_since_ < kStopGrace || now - stuck->since < kStopGrace) return;
  spdlog::warn(
      "rank {} ({}): signal {} arrived while {}: stopping without it, and without a "
      "checkpoint (none can be written before it returns)",
      group_.rank(), group_.host(), stop_signal_number(), describe_stuck(*stuck, now));
  spdlog::default_logger()->flush();
  group_.abort_job(128 + stop_signal_number());
}

}  // namespace trainer
