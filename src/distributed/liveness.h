// Lost hosts found without waiting for a collective's deadline. Every rank tells every other,
// once a second over UDP, that it is alive, from a thread of its own: a rank busy in a slow step,
// a checkpoint write or an evaluation still speaks, and a collective that is merely slow is left
// to its own deadline (collective_timeout_s). A rank that hears nothing from a peer for
// `timeout` ends the job, naming that rank and its host; one that hears from no peer at all says
// that its own host is cut off, and ends its launcher's process on the host as well (mpirun's
// daemon, torchrun's agent), which would otherwise wait for peers it cannot reach. A rank that
// ends the job for a fault of its own says why first (tell_peers_this_rank_ends), and the others
// end at once, naming it.
#pragma once

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "src/distributed/process_group.h"
#include "src/environment.h"

namespace trainer {

// What the other ranks' last liveness messages said of their calls into the data's file system
// that have not returned ("rank 1 (node-b) waits on storage: reading ... for 31 s", with how long
// ago when not just now; several joined by "; "), or "" when none. Safe from any thread, also
// once the Liveness is gone.
std::string peers_stuck_on_storage();

// This rank's fastest round trip to a rank on another host, smoothed, ms (Note [A link's round
// trip], liveness.cpp): high only where this host's own link is slow. NaN without liveness
// messages or before the first round trip. Safe from any thread.
double link_round_trip_ms();

// Before this rank ends the job for a fault it found (Note [A last word], liveness.cpp): tells
// every other rank `why` ("the file system does not answer: reading ..."), and they end at once
// with `exit_code`, naming this rank and `why`, instead of each waiting for its own deadline or
// failing on a library's error when this rank's connections close. `host_leaves`: the fault is
// this host's (its mount of the data), so that the peers of a torchrun job whose agents meet on
// this host end their agents too. Waits a moment for the datagrams to go. Returns false, having
// told no one, without liveness messages. Safe from any thread.
bool tell_peers_this_rank_ends(const std::string& why, int exit_code, bool host_leaves);

class Liveness {
 public:
  // Collective: every rank of `group` (launched, more than one) makes one. Binds a UDP socket on
  // the address this host reaches `env.launcher_address` from, and learns every rank's.
  Liveness(ProcessGroup& group, const Environment& env, std::chrono::seconds timeout);
  ~Liveness();  // tells the peers this rank is leaving (not lost), then stops
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

 private:
  struct Peer {
    uint32_t address = 0;  // IPv4, network order
    uint16_t port = 0;     // network order
    std::chrono::steady_clock::time_point heard;
    bool left = false;          // said it was leaving: its silence is not a loss
    bool spoke = false;         // has been heard at least once: only then can its silence be judged
    int64_t their_sent_us = 0;  // the send time its last beat carried, echoed back to it
    std::chrono::steady_clock::time_point their_beat_heard;  // when that beat came
    double round_trip_ms = std::nan("");                     // smoothed; NaN until the first echo
  };
  void run();
  void send_all(uint32_t kind);
  void receive();
  void add_round_trip(Peer& peer, int64_t round_trip_us);
  void say_last_word(const std::string& why, int exit_code, bool host_leaves);
  [[noreturn]] void peer_ended(int rank, const std::string& why, int exit_code, bool host_leaves);
  void judge(std::chrono::steady_clock::time_point now);
  void tell_unheard();
  [[noreturn]] void lost(const std::vector<int>& silent, bool one_other_host);
  void end_agent_if_rendezvous_lost(const std::vector<int>& silent);
  friend bool tell_peers_this_rank_ends(const std::string& why, int exit_code, bool host_leaves);
  [[noreturn]] void cut_off(int other_hosts);

  ProcessGroup& group_;
  std::chrono::seconds timeout_;
  Launcher launcher_;
  int socket_ = -1;
  uint32_t token_ = 0;       // this job's, so that a stray datagram of another job is not heard
  std::vector<Peer> peers_;  // by rank; this rank's own entry unused
  std::chrono::steady_clock::time_point since_;
  bool told_unheard_ = false;
  std::atomic<bool> ending_{false};  // this rank has said its last word
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace trainer
