// The rank that holds a step back (src/report/slow_rank.h), from figures as a job's ranks report
// them: what the interval log names, so that an operator drains the right node.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "src/report/slow_rank.h"

namespace trainer {
namespace {

const std::vector<std::string> kHosts = {"node-a", "node-a", "node-b", "node-c"};
const double kNone = std::nan("");

// Four ranks whose steps agree to a few percent, as healthy ones on like GPUs do.
std::vector<RankTimes> healthy() {
  return {
      {0.4, 41.0, 2.0, 0.3}, {0.5, 42.1, 1.1, 0.3}, {0.3, 40.6, 2.4, 0.4}, {0.6, 41.7, 1.6, 0.3}};
}

TEST(SlowRank, NoRankStandsOutInAHealthyJob) {
  const auto ranks = healthy();
  const SlowRank slow = find_slow_rank(ranks);
  EXPECT_EQ(slow.held_by, HeldBy::kNothing);
  EXPECT_EQ(slow.rank, 1);  // still the busiest, for the line
  EXPECT_EQ(describe_slow_rank(slow, ranks, kHosts),
            "no rank stands out (the busiest: rank 1 (node-a), 42.1 ms compute + 0.5 ms input "
            "wait)");
}

TEST(SlowRank, AThrottledRankIsHeldByItsCompute) {
  auto ranks = healthy();
  // Its peers wait for it in the all-reduce; its own thread answers beats late too.
  ranks[2] = {0.3, 160.0, 0.5, 9.0};
  for (int r : {0, 1, 3}) ranks[r].allreduce_ms = 120;
  const SlowRank slow = find_slow_rank(ranks);
  EXPECT_EQ(slow.rank, 2);
  EXPECT_EQ(slow.held_by, HeldBy::kCompute);
  EXPECT_EQ(describe_slow_rank(slow, ranks, kHosts),
            "rank 2 (node-b) holds the step back: its compute, 160.0 ms against a median of "
            "41.7 ms (its GPU's clocks or its CPU)");
}

TEST(SlowRank, AStarvedRankIsHeldByItsInput) {
  auto ranks = healthy();
  ranks[3].input_ms = 75;
  const SlowRank slow = find_slow_rank(ranks);
  EXPECT_EQ(slow.rank, 3);
  EXPECT_EQ(slow.held_by, HeldBy::kInput);
  EXPECT_DOUBLE_EQ(slow.figure_ms, 75);
  EXPECT_DOUBLE_EQ(slow.median_ms, 0.4);
}

TEST(SlowRank, ASlowLinkIsTheHostFarFromEveryPeer) {
  auto ranks = healthy();
  for (RankTimes& r : ranks) r.allreduce_ms = 900;  // every rank waits on the wire
  ranks[3].link_ms = 2.5;                           // a capped link's, queued behind the all-reduce
  const SlowRank slow = find_slow_rank(ranks);
  EXPECT_EQ(slow.rank, 3);
  EXPECT_EQ(slow.held_by, HeldBy::kLink);
  EXPECT_EQ(describe_slow_rank(slow, ranks, kHosts),
            "rank 3 (node-c) holds the step back: its link, a round trip of 2.5 ms to its "
            "nearest peer against a median of 0.3 ms (its network or NIC)");
}

TEST(SlowRank, SmallDifferencesAreNotNamed) {
  auto ranks = healthy();
  ranks[0].compute_ms = 45;  // 10% over: clocks, not a fault
  ranks[2].link_ms = 1.6;    // 5x an idle link's round trip, but under 2 ms
  EXPECT_EQ(find_slow_rank(ranks).held_by, HeldBy::kNothing);
}

TEST(SlowRank, AStragglerSmallBesideASlowLinkIsNotWhatHoldsTheStep) {
  auto ranks = healthy();
  for (RankTimes& r : ranks) r.allreduce_ms = 3000;
  ranks[0].compute_ms = 65;  // 60% over, but 2% of the step
  ranks[2].link_ms = 24;
  const SlowRank slow = find_slow_rank(ranks);
  EXPECT_EQ(slow.held_by, HeldBy::kLink);
  EXPECT_EQ(slow.rank, 2);
}

TEST(SlowRank, ACheckpointOnRankZeroIsTimeOutsideItsSteps) {
  auto ranks = healthy();
  // Rank 0 writes a checkpoint of 50 s in an interval of 4 steps; the others wait for it in the
  // next step's all-reduce.
  ranks[0].outside_ms = 12500;
  for (int r : {1, 2, 3}) ranks[r] = {0.4, 41.0, 12501.0, 0.3, 0.2};
  const SlowRank slow = find_slow_rank(ranks);
  EXPECT_EQ(slow.rank, 0);
  EXPECT_EQ(slow.held_by, HeldBy::kOutside);
  EXPECT_STREQ(held_by_name(slow.held_by), "outside_steps");
  EXPECT_EQ(describe_slow_rank(slow, ranks, kHosts),
            "rank 0 (node-a) holds the step back: its time outside the steps, 12500.0 ms a step "
            "against a median of 0.2 ms (writing checkpoints, evaluating: its storage or CPU)");
}

TEST(SlowRank, AnEvaluationEveryRankRunsIsNotNamed) {
  auto ranks = healthy();
  const double evaluation_ms[] = {900, 940, 910, 925};  // each rank's share of the held-out set
  for (int r = 0; r < 4; ++r) ranks[r].outside_ms = evaluation_ms[r];
  EXPECT_EQ(find_slow_rank(ranks).held_by, HeldBy::kNothing);
}

TEST(SlowRank, FiguresNotMeasuredAreLeftOut) {
  auto ranks = healthy();
  for (RankTimes& r : ranks) r.allreduce_ms = r.link_ms = kNone;  // one node, a CUDA graph
  EXPECT_EQ(find_slow_rank(ranks).held_by, HeldBy::kNothing);
  ranks[1].compute_ms = 90;
  EXPECT_EQ(find_slow_rank(ranks).held_by, HeldBy::kCompute);
  EXPECT_EQ(find_slow_rank({{0.1, 40, kNone, kNone}}).held_by, HeldBy::kNothing);  // alone
}

}  // namespace
}  // namespace trainer
