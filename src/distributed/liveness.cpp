#include "src/distributed/liveness.h"

#include <ATen/ATen.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <set>

#include "base/storage_calls.h"
#include "base/user_error.h"
#include "src/distributed/host_lookup.h"

namespace trainer {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kBeatEvery = std::chrono::seconds(1);
constexpr uint32_t kMagic = 0x564c4e52;  // "RNLV"
constexpr uint32_t kAlive = 1, kLeaving = 2, kEnding = 3;
// In a kEnding beat's flags, beside the sender's exit code (the low byte): the fault is its host's.
constexpr uint32_t kHostLeaves = 1 << 8;

// Note [A last word]
// A rank that ends the job for a fault it found (its file system does not answer, a collective
// timed out, an error) says why in a kEnding beat before it goes. The others end at once, naming
// it and its reason: without it they would learn only from their own deadlines, or from a
// library's error when its connections close ("Connection closed by peer", naming an address),
// or, under mpirun, from the SIGTERM its daemons pass on 20 s after the abort. The beat goes
// three times (a datagram may be lost), and the rank waits a moment before it ends, so that the
// word arrives before its connections close.
constexpr int kLastWordCopies = 3;
constexpr auto kLastWordHeld = std::chrono::milliseconds(200);

// A rank's call into the data's file system that has not returned for this long is told to the
// others in its beats, so that a rank whose collective then fails names it, not "another rank".
constexpr auto kToldStall = std::chrono::seconds(5);

// Note [A link's round trip]
// Each beat to a peer echoes the send time of the last beat heard from it and how long ago that
// was, so the peer learns the round trip without the two clocks agreeing (as NTP does). A host
// whose link is slow (a capped or lossy link, a queue behind the all-reduce's traffic) is slow to
// every peer; a healthy one has a fast round trip to some peer. So a rank's link figure is its
// fastest round trip to a rank on another host, smoothed over beats.
struct Beat {
  uint32_t magic, token;
  int32_t rank;
  uint32_t kind;
  uint32_t stalled_s;  // how long this rank's oldest storage call has not returned; 0: none
  uint32_t flags;      // kEnding: its exit code, and kHostLeaves
  int64_t sent_us;     // this beat's send time, on the sender's steady clock
  int64_t echo_us;     // the sent_us of the last beat the sender heard from the receiver; 0: none
  int64_t held_us;     // how long before this send the sender heard that beat
  // kAlive: the stalled call (describe_call); kEnding: why. Cut to fit, 0-terminated.
  char text[208];
};
static_assert(sizeof(Beat) == 256, "every rank's beat has one size");

int64_t micros(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

// This rank's link figure (Note [A link's round trip]), ms; NaN before the first round trip.
std::atomic<double> fastest_round_trip_ms{std::nan("")};

// The Liveness whose thread runs, for a last word from another thread (Note [A last word]).
std::mutex live_mutex;
Liveness* live = nullptr;

// What the peers last said of their stalled storage calls, by rank, kept past the Liveness
// object: the error that ends a rank is logged after its part of the job has unwound.
std::mutex stalls_mutex;
std::map<int, std::pair<std::string, Clock::time_point>> stalls;

}  // namespace

Liveness::Liveness(ProcessGroup& group, const Environment& env, std::chrono::seconds timeout)
    : group_(group), timeout_(timeout), launcher_(env.launcher) {
  uint32_t address = address_toward(env.launcher_address);
  if (address == 0) address = address_toward(env.hostname);
  sockaddr_in mine{};
  mine.sin_family = AF_INET;
  mine.sin_addr.s_addr = address;
  socket_ = address ? ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0) : -1;
  socklen_t size = sizeof(mine);
  if (socket_ >= 0 && (::bind(socket_, reinterpret_cast<sockaddr*>(&mine), sizeof(mine)) != 0 ||
                       ::getsockname(socket_, reinterpret_cast<sockaddr*>(&mine), &size) != 0)) {
    ::close(socket_);
    socket_ = -1;
  }
  // Every rank's address and port, and rank 0's token: each rank fills its own row.
  at::Tensor table = at::zeros({group.size(), 3}, at::kLong);
  auto rows = table.accessor<int64_t, 2>();
  if (socket_ >= 0) {
    rows[group.rank()][0] = mine.sin_addr.s_addr;
    rows[group.rank()][1] = mine.sin_port;
  }
  if (group.rank() == 0) rows[0][2] = std::random_device{}() | 1;
  group.allreduce_sum_(table);
  token_ = static_cast<uint32_t>(rows[0][2]);
  peers_.resize(group.size());
  bool every_rank = true;
  for (int r = 0; r < group.size(); ++r) {
    peers_[r].address = static_cast<uint32_t>(rows[r][0]);
    peers_[r].port = static_cast<uint16_t>(rows[r][1]);
    peers_[r].heard = Clock::now();
    every_rank = every_rank && peers_[r].port != 0;
  }
  if (!every_rank) {  // a rank with no address would look lost to every other
    if (group.rank() == 0)
      spdlog::warn(
          "liveness messages are off: some rank found no address of its host (from {}); a lost "
          "host is found only by collective_timeout_s",
          env.launcher_address.empty() ? "its host name" : env.launcher_address);
    if (socket_ >= 0) ::close(socket_);
    socket_ = -1;
    return;
  }
  since_ = Clock::now();
  thread_ = std::thread([this] { run(); });
  std::lock_guard<std::mutex> lock(live_mutex);
  live = this;
}

Liveness::~Liveness() {
  if (socket_ < 0) return;
  {
    std::lock_guard<std::mutex> lock(live_mutex);
    live = nullptr;
  }
  stop_ = true;
  thread_.join();
  // Twice: a datagram may be dropped, and a peer that misses both only waits for its own end.
  send_all(kLeaving);
  send_all(kLeaving);
  ::close(socket_);
}

double link_round_trip_ms() { return fastest_round_trip_ms.load(); }

std::string peers_stuck_on_storage() {
  std::lock_guard<std::mutex> lock(stalls_mutex);
  std::string said;
  for (const auto& [rank, stall] : stalls) {
    // A peer whose last word was a stall is taken at it: one that recovers says so (0).
    const auto ago =
        std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - stall.second).count();
    said += (said.empty() ? "" : "; ") + stall.first +
            (ago > 2 ? " (its last word, " + std::to_string(ago) + " s ago)" : "");
  }
  return said;
}

void Liveness::send_all(uint32_t kind) {
  Beat beat{};
  beat.magic = kMagic;
  beat.token = token_;
  beat.rank = group_.rank();
  beat.kind = kind;
  const auto now = Clock::now();
  beat.sent_us = micros(now);
  if (const auto stuck = oldest_storage_call(); stuck && now - stuck->since >= kToldStall) {
    beat.stalled_s = static_cast<uint32_t>(
        std::chrono::duration_cast<std::chrono::seconds>(now - stuck->since).count());
    std::snprintf(beat.text, sizeof(beat.text), "%s", describe_call(*stuck).c_str());
  }
  for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
    if (r == group_.rank() || peers_[r].left) continue;
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = peers_[r].address;
    to.sin_port = peers_[r].port;
    beat.echo_us = peers_[r].their_sent_us;
    beat.held_us = beat.echo_us ? micros(now) - micros(peers_[r].their_beat_heard) : 0;
    // Never blocks (a full buffer drops the datagram, as a lossy network would).
    ::sendto(socket_, &beat, sizeof(beat), MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&to),
             sizeof(to));
  }
}

void Liveness::receive() {
  Beat beat{};
  ssize_t got = 0;
  while ((got = ::recv(socket_, &beat, sizeof(beat), MSG_DONTWAIT)) >= 0) {
    if (got != sizeof(beat) || beat.magic != kMagic || beat.token != token_ || beat.rank < 0 ||
        beat.rank >= static_cast<int>(peers_.size()))
      continue;  // another job's, or not a beat
    Peer& peer = peers_[beat.rank];
    peer.heard = Clock::now();
    peer.spoke = true;
    peer.their_sent_us = beat.sent_us;
    peer.their_beat_heard = peer.heard;
    if (beat.echo_us > 0) add_round_trip(peer, micros(peer.heard) - beat.echo_us - beat.held_us);
    beat.text[sizeof(beat.text) - 1] = 0;
    if (beat.kind == kEnding && !ending_)
      peer_ended(beat.rank, beat.text, static_cast<int>(beat.flags & 0xff),
                 (beat.flags & kHostLeaves) != 0);
    if (beat.kind == kLeaving) peers_[beat.rank].left = true;
    std::lock_guard<std::mutex> lock(stalls_mutex);
    if (beat.stalled_s == 0) {
      stalls.erase(beat.rank);
      continue;
    }
    stalls[beat.rank] = {detail::concat("rank ", beat.rank, " (", group_.hosts()[beat.rank],
                                        ") waits on storage: ", beat.text, " has not returned for ",
                                        beat.stalled_s, " s"),
                         Clock::now()};
  }
}

// Note [A last word]
bool tell_peers_this_rank_ends(const std::string& why, int exit_code, bool host_leaves) {
  std::lock_guard<std::mutex> lock(live_mutex);
  if (live) live->say_last_word(why, exit_code, host_leaves);
  return live != nullptr;
}

void Liveness::say_last_word(const std::string& why, int exit_code, bool host_leaves) {
  ending_ = true;  // this rank's own end, not a peer's, is the one to report
  Beat beat{};
  beat.magic = kMagic;
  beat.token = token_;
  beat.rank = group_.rank();
  beat.kind = kEnding;
  beat.flags = (static_cast<uint32_t>(exit_code) & 0xff) | (host_leaves ? kHostLeaves : 0);
  beat.sent_us = micros(Clock::now());
  std::snprintf(beat.text, sizeof(beat.text), "%s", why.c_str());
  for (int copy = 0; copy < kLastWordCopies; ++copy) {
    // Every other rank's address: set before the thread started, never changed.
    for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
      if (r == group_.rank()) continue;
      sockaddr_in to{};
      to.sin_family = AF_INET;
      to.sin_addr.s_addr = peers_[r].address;
      to.sin_port = peers_[r].port;
      ::sendto(socket_, &beat, sizeof(beat), MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&to),
               sizeof(to));
    }
    std::this_thread::sleep_for(kLastWordHeld / kLastWordCopies);
  }
}

void Liveness::peer_ended(int rank, const std::string& why, int exit_code, bool host_leaves) {
  spdlog::critical(
      "rank {} ({}): rank {} ({}) ended the job: {}. Ending this rank too; a restart resumes from "
      "the newest checkpoint",
      group_.rank(), group_.host(), rank, group_.hosts()[rank], why);
  if (host_leaves) end_agent_if_rendezvous_lost({rank});
  spdlog::default_logger()->flush();
  // The others heard it too; a peer that missed it is ended by the launcher on these exits.
  group_.abort_job(exit_code > 0 ? exit_code : 3, /*peers_told=*/true);
}

void Liveness::add_round_trip(Peer& peer, int64_t round_trip_us) {
  if (round_trip_us < 0) return;  // a reordered datagram
  const double ms = static_cast<double>(round_trip_us) / 1000;
  peer.round_trip_ms = std::isnan(peer.round_trip_ms) ? ms : 0.7 * peer.round_trip_ms + 0.3 * ms;
  double fastest = std::nan("");
  for (int r = 0; r < static_cast<int>(peers_.size()); ++r)
    if (const double ms = peers_[r].round_trip_ms;
        group_.hosts()[r] != group_.host() && (std::isnan(fastest) || ms < fastest))
      fastest = ms;
  fastest_round_trip_ms = fastest;
}

void Liveness::run() {
  auto next_beat = Clock::now();
  auto last_turn = Clock::now();
  while (!stop_) {
    pollfd ready{socket_, POLLIN, 0};
    ::poll(&ready, 1, 200);
    receive();
    const auto now = Clock::now();
    // This process did not run for a while (stopped, swapped out, a starved machine): its own
    // silence, not the peers', so it does not judge them on it.
    if (now - last_turn > timeout_ / 2)
      for (Peer& peer : peers_) peer.heard = now;
    last_turn = now;
    if (now >= next_beat) {
      send_all(kAlive);
      next_beat = now + kBeatEvery;
    }
    judge(now);
  }
}

// Note [Lost, or cut off]
// Ranks on this host share its network, so they hear each other whatever happens to its link.
// When every rank on the other hosts has gone silent and there are two or more of those hosts,
// the likely fault is here: this host is cut off, and says so instead of blaming them. With one
// other host the two cannot be told apart, and the message says so.
void Liveness::judge(Clock::time_point now) {
  if (!told_unheard_ && now - since_ > timeout_) tell_unheard();
  std::vector<int> silent;
  std::set<std::string> other_hosts, silent_hosts;
  bool other_host_heard = false;
  for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
    if (r == group_.rank() || peers_[r].left || !peers_[r].spoke) continue;
    const std::string& host = group_.hosts()[r];
    const bool here = host == group_.host();
    const bool quiet = now - peers_[r].heard > timeout_;
    if (!here) other_hosts.insert(host);
    if (quiet) {
      silent.push_back(r);
      if (!here) silent_hosts.insert(host);
    } else if (!here) {
      other_host_heard = true;
    }
  }
  if (silent.empty()) return;
  if (!other_host_heard && other_hosts.size() >= 2 && silent_hosts.size() == other_hosts.size())
    cut_off(static_cast<int>(other_hosts.size()));
  lost(silent, other_hosts.size() == 1 && !silent_hosts.empty());
}

// A peer never heard from is not judged: its datagrams may be blocked on the way (a security
// group or network policy that lets the job's TCP through but not UDP), and ending every job
// at the timeout would be worse than finding a lost host only at collective_timeout_s.
void Liveness::tell_unheard() {
  told_unheard_ = true;
  std::vector<int> unheard;
  for (int r = 0; r < static_cast<int>(peers_.size()); ++r)
    if (r != group_.rank() && !peers_[r].spoke && !peers_[r].left) unheard.push_back(r);
  if (unheard.empty()) return;
  spdlog::warn(
      "rank {} ({}): no liveness message from {} of the other ranks in {} s (first: rank {} on "
      "{}): UDP between the hosts may be blocked. A host lost is found only by "
      "collective_timeout_s for those. HINT: let the nodes exchange UDP (their security group, "
      "any network policy)",
      group_.rank(), group_.host(), unheard.size(), timeout_.count(), unheard[0],
      group_.hosts()[unheard[0]]);
}

void Liveness::lost(const std::vector<int>& silent, bool one_other_host) {
  std::string who;
  const size_t named = std::min<size_t>(silent.size(), 8);
  for (size_t i = 0; i < named; ++i)
    who += (i ? ", " : "") + std::string("rank ") + std::to_string(silent[i]) + " (" +
           group_.hosts()[silent[i]] + ")";
  if (named < silent.size()) who += " and " + std::to_string(silent.size() - named) + " more";
  spdlog::critical(
      "rank {} ({}): no word from {} for {} s: {}. Ending the whole job; a restart resumes from "
      "the newest checkpoint. HINT: check that node and its network before it runs the job again",
      group_.rank(), group_.host(), who, timeout_.count(),
      one_other_host ? "that host or this one lost its network, or the process is gone"
                     : "its host or network is gone, or the process is");
  end_agent_if_rendezvous_lost(silent);
  spdlog::default_logger()->flush();
  group_.abort_job(3);
}

// Under torchrun the agents meet at a store on one host. When that host is the one lost they
// cannot form a new group and would wait on it, so each survivor ends its agent too, and the
// PyTorchJob starts the pods again.
void Liveness::end_agent_if_rendezvous_lost(const std::vector<int>& silent) {
  const pid_t agent = torchrun_agent();
  if (!agent) return;
  const std::set<uint32_t> rendezvous = addresses_of(rendezvous_host());
  for (int r : silent) {
    if (!rendezvous.count(peers_[r].address)) continue;
    spdlog::critical(
        "rank {} ({}): {} held the agents' rendezvous: ending torchrun's agent (pid {}), which "
        "cannot start the group again without it",
        group_.rank(), group_.host(), group_.hosts()[r], agent);
    spdlog::default_logger()->flush();
    ::kill(agent, SIGKILL);  // Note [A launcher that waits on lost hosts]
    return;
  }
}

void Liveness::cut_off(int other_hosts) {
  const pid_t parent = ::getppid();
  const std::string parent_name = process_name(parent);
  const bool launcher_here = (launcher_ == Launcher::kMpirun && parent_name == "orted") ||
                             (launcher_ == Launcher::kTorchrun && torchrun_agent() != 0);
  spdlog::critical(
      "rank {} ({}): no word from any rank on the other {} hosts for {} s: this host is cut off "
      "from the job (its network link, its node, or a network policy). Ending this host's part "
      "of the job{}",
      group_.rank(), group_.host(), other_hosts, timeout_.count(),
      launcher_here ? ", and " + parent_name + " (pid " + std::to_string(parent) +
                          "), which would wait for hosts it cannot reach"
                    : "");
  spdlog::default_logger()->flush();
  if (launcher_here) ::kill(parent, SIGKILL);  // Note [A launcher that waits on lost hosts]
  std::_Exit(3);
}

}  // namespace trainer
