// Which rank holds a data-parallel step back, and on what. Every rank waits in the gradient
// all-reduce for the last one to get there, so a straggler shows as one rank's input wait,
// compute or time outside its steps (rank 0's checkpoint writes) above the others'; a slow link
// shows as the same compute everywhere, a long all-reduce and one host's round trip to every peer
// above the others' (Note [A link's round trip]).
#pragma once

#include <string>
#include <vector>

namespace trainer {

// One rank's last step, ms. NaN where not measured (the all-reduce inside a CUDA graph's replay;
// the link without liveness messages or another host).
struct RankTimes {
  double input_ms = 0;      // waiting for its batches
  double compute_ms = 0;    // forward and backward
  double allreduce_ms = 0;  // the gradient all-reduce past the end of backward
  double link_ms = 0;       // its fastest round trip to a rank on another host
  double outside_ms = 0;    // outside its steps: checkpoints, evaluations, logging
};

enum class HeldBy { kNothing, kInput, kCompute, kOutside, kLink };

struct SlowRank {
  int rank = 0;  // the rank with the longest input wait and compute, or the slowest link
  HeldBy held_by = HeldBy::kNothing;  // kNothing: no rank stands out; `rank` is the busiest
  double figure_ms = 0;               // its figure for what holds the step (busy time if none)
  double median_ms = 0;               // the same figure's median over the ranks
};

// `ranks`: every rank's times, by rank (at least one).
SlowRank find_slow_rank(const std::vector<RankTimes>& ranks);

// "input", "compute", "outside_steps", "link", or "" for kNothing.
const char* held_by_name(HeldBy held_by);

// The log line's end: "rank 2 (node-c) holds the step back: its compute, 410.0 ms against a
// median of 85.0 ms", or "no rank stands out (the busiest: rank 2 (node-c), 85.0 ms ...)".
std::string describe_slow_rank(const SlowRank& slow, const std::vector<RankTimes>& ranks,
                               const std::vector<std::string>& hosts);

}  // namespace trainer
