#include "src/report/slow_rank.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>

namespace trainer {
namespace {

// A rank stands out when its figure is over the median by this share of it, by this much at
// least, and by this share of the step: ranks sharing a machine's cores or a GPU's clocks differ
// by a few percent, and a straggler of 60 ms does not hold back a step of 3 s on a slow link.
constexpr double kOverMedian = 0.25;
constexpr double kOverMedianMs = 5;
constexpr double kOfStep = 0.1;
// A link stands out at this many times the median round trip and this much over it: a healthy
// link's is well under a millisecond (seen: 0.1-0.9 ms between busy hosts of one machine), a
// link capped to a third of the all-reduce's needs 2-5 ms, queued behind its traffic.
constexpr double kLinkTimesMedian = 4;
constexpr double kLinkOverMedianMs = 1.5;

// The lower median of the figures that are numbers; NaN when none is.
double median(std::vector<double> values) {
  values.erase(std::remove_if(values.begin(), values.end(), [](double v) { return std::isnan(v); }),
               values.end());
  if (values.empty()) return std::nan("");
  std::nth_element(values.begin(), values.begin() + (values.size() - 1) / 2, values.end());
  return values[(values.size() - 1) / 2];
}

std::vector<double> figure(const std::vector<RankTimes>& ranks,
                           const std::function<double(const RankTimes&)>& of) {
  std::vector<double> out;
  for (const RankTimes& r : ranks) out.push_back(of(r));
  return out;
}

// The rank with the largest figure that is a number (0 when none is).
int largest(const std::vector<double>& values) {
  int best = 0;
  for (int r = 0; r < static_cast<int>(values.size()); ++r)
    if (!std::isnan(values[r]) && (std::isnan(values[best]) || values[r] > values[best])) best = r;
  return best;
}

// A figure that was not measured counts as nothing.
double known(double ms) { return std::isnan(ms) ? 0 : ms; }

// Which of a straggler's parts is furthest over its median over the ranks: what holds it.
SlowRank held_by(const std::vector<RankTimes>& ranks, int rank) {
  const std::vector<std::pair<HeldBy, double RankTimes::*>> parts = {
      {HeldBy::kInput, &RankTimes::input_ms},
      {HeldBy::kCompute, &RankTimes::compute_ms},
      {HeldBy::kOutside, &RankTimes::outside_ms}};
  SlowRank slow{rank, HeldBy::kNothing, 0, 0};
  double most = -INFINITY;
  for (const auto& [part, ms] : parts) {
    const double median_ms = median(figure(ranks, [ms = ms](const RankTimes& t) { return t.*ms; }));
    const double over = known(ranks[rank].*ms) - known(median_ms);
    if (over > most) {
      most = over;
      slow = {rank, part, ranks[rank].*ms, median_ms};
    }
  }
  return slow;
}

}  // namespace

SlowRank find_slow_rank(const std::vector<RankTimes>& ranks) {
  const auto busy = figure(
      ranks, [](const RankTimes& r) { return r.input_ms + r.compute_ms + known(r.outside_ms); });
  SlowRank slow;
  slow.rank = largest(busy);
  slow.figure_ms = busy[slow.rank];
  slow.median_ms = median(busy);
  if (ranks.size() < 2) return slow;
  const double step_ms = median(figure(ranks, [](const RankTimes& r) {
    return r.input_ms + r.compute_ms + known(r.allreduce_ms) + known(r.outside_ms);
  }));
  if (busy[slow.rank] - slow.median_ms >
      std::max({kOverMedian * slow.median_ms, kOverMedianMs, kOfStep * step_ms}))
    return held_by(ranks, slow.rank);
  const auto link = figure(ranks, [](const RankTimes& r) { return r.link_ms; });
  const int slowest_link = largest(link);
  const double link_median = median(link);
  if (!std::isnan(link[slowest_link]) &&
      link[slowest_link] >
          std::max(kLinkTimesMedian * link_median, link_median + kLinkOverMedianMs)) {
    slow.rank = slowest_link;
    slow.held_by = HeldBy::kLink;
    slow.figure_ms = link[slowest_link];
    slow.median_ms = link_median;
  }
  return slow;
}

const char* held_by_name(HeldBy held_by) {
  switch (held_by) {
    case HeldBy::kInput:
      return "input";
    case HeldBy::kCompute:
      return "compute";
    case HeldBy::kOutside:
      return "outside_steps";
    case HeldBy::kLink:
      return "link";
    case HeldBy::kNothing:
      break;
  }
  return "";
}

std::string describe_slow_rank(const SlowRank& slow, const std::vector<RankTimes>& ranks,
                               const std::vector<std::string>& hosts) {
  const std::string who = fmt::format("rank {} ({})", slow.rank, hosts[slow.rank]);
  const RankTimes& r = ranks[slow.rank];
  switch (slow.held_by) {
    case HeldBy::kInput:
      return fmt::format(
          "{} holds the step back: its input, a wait of {:.1f} ms a step against a median of "
          "{:.1f} ms (its decode threads, CPU or storage)",
          who, slow.figure_ms, slow.median_ms);
    case HeldBy::kCompute:
      return fmt::format(
          "{} holds the step back: its compute, {:.1f} ms against a median of {:.1f} ms (its "
          "GPU's clocks or its CPU)",
          who, slow.figure_ms, slow.median_ms);
    case HeldBy::kOutside:
      return fmt::format(
          "{} holds the step back: its time outside the steps, {:.1f} ms a step against a "
          "median of {:.1f} ms (writing checkpoints, evaluating: its storage or CPU)",
          who, slow.figure_ms, slow.median_ms);
    case HeldBy::kLink:
      return fmt::format(
          "{} holds the step back: its link, a round trip of {:.1f} ms to its nearest peer "
          "against a median of {:.1f} ms (its network or NIC)",
          who, slow.figure_ms, slow.median_ms);
    case HeldBy::kNothing:
      break;
  }
  return fmt::format(
      "no rank stands out (the busiest: {}, {:.1f} ms compute + {:.1f} ms input wait)", who,
      r.compute_ms, r.input_ms);
}

}  // namespace trainer
