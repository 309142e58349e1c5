// Sharding and shuffling of TFRecord epochs: equal steps on every rank and every record trained
// once per epoch for world sizes 1..8 and uneven files, also across resumes at other world sizes;
// determinism per seed, a new order each epoch, reads that stay contiguous; the by-node order
// keeps each node's records from epoch to epoch and draws every step from all its groups.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <set>

#include "data/sources/epoch_plan.h"
#include "data/sources/step_shares.h"

namespace trainer {
namespace {

// Uneven shards, including an empty one and one smaller than a batch.
const std::vector<int64_t> kCounts = {37, 0, 5, 120, 64, 1, 99};

// Each rank's records of the steps [first_step, first_step + steps) of a plan that starts at the
// step boundary `position`: every step but the epoch's last gives a rank `batch` records.
std::vector<int64_t> first_steps(const std::vector<int64_t>& plan, int64_t batch, int64_t steps) {
  const size_t n = std::min(plan.size(), static_cast<size_t>(steps * batch));
  return std::vector<int64_t>(plan.begin(), plan.begin() + n);
}

const EpochOrder kOrders[] = {EpochOrder::kGlobal, EpochOrder::kByNode};

TEST(EpochPlan, TrainingStepsTrainEveryRecordOnceForWorldSizes1To8) {
  const RecordTable table(kCounts);
  for (int world = 1; world <= 8; ++world) {
    for (int64_t batch : {1, 4, 7}) {
      for (EpochOrder order : kOrders) {
        std::multiset<int64_t> seen;
        for (int rank = 0; rank < world; ++rank) {
          PlanOptions o{true, 7, batch, 16, 8, rank, world, order};
          const auto plan = rank_plan(table, o, 3);
          // Full steps, then the rank's share of the short last one (possibly empty).
          const int64_t steps = steps_left(table.total(), 0, batch * world);
          const int64_t last =
              step_samples(table.total(), (steps - 1) * batch * world, batch * world);
          ASSERT_EQ(static_cast<int64_t>(plan.size()),
                    (steps - 1) * batch + share_of(last, batch, rank, world).count)
              << world << " " << batch;
          seen.insert(plan.begin(), plan.end());
        }
        ASSERT_EQ(static_cast<int64_t>(seen.size()), table.total()) << world << " " << batch;
        for (int64_t r = 0; r < table.total(); ++r) ASSERT_EQ(seen.count(r), 1u) << "record " << r;
      }
    }
  }
}

// A run resized between legs: `world` ranks of `batch` for `steps` steps each (the last leg to the
// epoch's end), each resuming where the one before stopped. Every entry the ranks took.
struct Leg {
  int world;
  int64_t batch, steps;
};
std::multiset<int64_t> entries_across_resizes(const RecordTable& table, EpochOrder order,
                                              int64_t repetitions, std::vector<Leg> legs) {
  std::multiset<int64_t> seen;
  int64_t position = 0;
  for (const Leg& leg : legs) {
    for (int rank = 0; rank < leg.world; ++rank) {
      PlanOptions o{true, 7, leg.batch, 16, 8, rank, leg.world, order, repetitions};
      const auto taken = first_steps(rank_plan(table, o, 2, position), leg.batch, leg.steps);
      seen.insert(taken.begin(), taken.end());
    }
    position = std::min(table.total(), position + leg.steps * leg.batch * leg.world);
  }
  return seen;
}

TEST(EpochPlan, ResizedRunsTrainEveryRecordOnce) {
  // 2 ranks x 4 for 5 steps, then 3 ranks x 4 for 4 steps, then 1 rank x 5 to the end of the
  // epoch: each record once, as an uninterrupted run, whatever the world size at each point.
  const RecordTable table(kCounts);
  for (EpochOrder order : kOrders) {
    const auto seen = entries_across_resizes(table, order, 1, {{2, 4, 5}, {3, 4, 4}, {1, 5, 1000}});
    ASSERT_EQ(static_cast<int64_t>(seen.size()), table.total());
    for (int64_t r = 0; r < table.total(); ++r) EXPECT_EQ(seen.count(r), 1u) << "record " << r;
  }
}

TEST(EpochPlan, SameWorldSizeResumeRepeatsTheSteps) {
  const RecordTable table(kCounts);
  PlanOptions o{true, 7, 4, 16, 8, 1, 3};
  const auto whole = rank_plan(table, o, 1);
  const auto resumed = rank_plan(table, o, 1, /*position=*/2 * 12);  // after 2 steps
  EXPECT_EQ(resumed, std::vector<int64_t>(whole.begin() + 2 * 4, whole.end()));
}

TEST(EpochPlan, EachRanksShareIsOneRunOfTheFileWhenStepsHoldWholeBlocks) {
  // Blocks of 50, no shuffle buffer, 4 ranks x 50: each step is 4 whole blocks, and sorting the
  // step hands each rank one of them: one contiguous read, however many ranks share the step.
  const RecordTable table({1000});
  for (int rank = 0; rank < 4; ++rank) {
    PlanOptions o{true, 3, 50, 0, 50, rank, 4};
    const auto plan = rank_plan(table, o, 0);
    for (size_t step = 0; step < plan.size(); step += 50) {
      const auto [lo, hi] = std::minmax_element(plan.begin() + step, plan.begin() + step + 50);
      EXPECT_EQ(*hi - *lo, 49) << "rank " << rank << " step " << step / 50;
    }
  }
}

TEST(StepShares, StepsCoverTheEpochAndNoRankTrainsOneSampleAlone) {
  for (int world = 1; world <= 8; ++world) {
    for (int64_t batch : {1, 2, 3, 8}) {
      const int64_t global = batch * world;
      for (int64_t samples = global; samples <= 5 * global + 2; ++samples) {
        int64_t steps = 0;
        for (int64_t p = 0; p < samples; ++steps) {
          const int64_t n = step_samples(samples, p, global);
          ASSERT_GT(n, global > 1 ? 1 : 0) << "a step of one sample";
          ASSERT_LE(n, global + 1);
          int64_t next = 0;
          for (int rank = 0; rank < world; ++rank) {
            const Share share = share_of(n, batch, rank, world);
            ASSERT_EQ(share.begin, next) << "pieces in rank order, no gap";
            next += share.count;
            if (n == global) ASSERT_EQ(share.count, batch) << "a full step";
            if (n > 1 && batch > 1)
              ASSERT_NE(share.count, 1) << n << " samples on " << world << " ranks";
          }
          ASSERT_EQ(next, n);
          p += n;
        }
        ASSERT_EQ(steps, steps_left(samples, 0, global)) << samples << " / " << global;
      }
    }
  }
}

TEST(EpochPlan, EvaluationSeesEveryRecordExactlyOnce) {
  const RecordTable table(kCounts);
  for (int world = 1; world <= 8; ++world) {
    std::vector<int64_t> all;
    int64_t smallest = table.total(), largest = 0;
    for (int rank = 0; rank < world; ++rank) {
      PlanOptions o{false, 7, 16, 0, 8, rank, world};
      const auto plan = rank_plan(table, o, 0);
      smallest = std::min<int64_t>(smallest, plan.size());
      largest = std::max<int64_t>(largest, plan.size());
      all.insert(all.end(), plan.begin(), plan.end());
    }
    std::vector<int64_t> expected(table.total());
    for (int64_t i = 0; i < table.total(); ++i) expected[i] = i;
    EXPECT_EQ(all, expected) << "world " << world;  // in order, no padding, nothing twice
    EXPECT_LE(largest - smallest, 1);
  }
}

TEST(EpochPlan, DeterministicPerSeedDifferentPerEpochAndSeed) {
  const RecordTable table(kCounts);
  PlanOptions o{true, 42, 4, 32, 8, 0, 1};
  const auto a = global_order(table, o, 0);
  EXPECT_EQ(a, global_order(table, o, 0));
  EXPECT_NE(a, global_order(table, o, 1));
  PlanOptions other = o;
  other.seed = 43;
  EXPECT_NE(a, global_order(table, other, 0));
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < table.total(); ++i) ASSERT_EQ(sorted[i], i);  // a permutation
  // Both file order and record order change: the first records differ between epochs.
  const auto b = global_order(table, o, 1);
  EXPECT_NE(std::vector<int64_t>(a.begin(), a.begin() + 10),
            std::vector<int64_t>(b.begin(), b.begin() + 10));
}

TEST(EpochPlan, ShuffleBufferMixesAcrossBlocks) {
  const RecordTable table({1000});
  PlanOptions no_buffer{true, 1, 10, 0, 100, 0, 1};
  PlanOptions buffer = no_buffer;
  buffer.shuffle_buffer = 300;
  // Without a buffer, the first 100 records come from one block of 100; with it, from several.
  auto blocks_in_first_100 = [&](const PlanOptions& o) {
    const auto order = global_order(table, o, 0);
    std::set<int64_t> blocks;
    for (int i = 0; i < 100; ++i) blocks.insert(order[i] / 100);
    return blocks.size();
  };
  EXPECT_EQ(blocks_in_first_100(no_buffer), 1u);
  EXPECT_GT(blocks_in_first_100(buffer), 1u);
}

// The records the `ranks_per_node` consecutive ranks of node `node` train in `epoch`.
std::set<int64_t> node_records(const RecordTable& table, PlanOptions o, int64_t epoch, int node,
                               int ranks_per_node) {
  std::set<int64_t> records;
  for (int r = 0; r < ranks_per_node; ++r) {
    o.rank = node * ranks_per_node + r;
    const auto plan = rank_plan(table, o, epoch);
    records.insert(plan.begin(), plan.end());
  }
  return records;
}

// Of the records `node` trains in epoch 1, the fraction it trained in epoch 0 too: what its page
// cache serves, the rest coming from the shared file system.
double fraction_read_before(const RecordTable& table, const PlanOptions& o, int node,
                            int ranks_per_node) {
  const auto before = node_records(table, o, 0, node, ranks_per_node);
  const auto now = node_records(table, o, 1, node, ranks_per_node);
  const auto again =
      std::count_if(now.begin(), now.end(), [&](int64_t r) { return before.count(r); });
  return static_cast<double>(again) / static_cast<double>(now.size());
}

TEST(EpochPlan, ByNodeOrderKeepsEachNodesRecordsFromEpochToEpoch) {
  // ImageNet's shape, smaller: 96 files of 250 records, read in blocks of 64; 4 ranks a node of
  // 8 or 32 images each (steps of 64 to 2,560). The by-node order gives a node at least 96% of
  // what it read the epoch before (all but records near its ranks' boundaries), also where the
  // node count does not divide kNodeGroups (7) and where a step holds fewer records than there
  // are groups; the global order gives a node in the middle of the ranks mostly new records.
  const RecordTable table(std::vector<int64_t>(96, 250));
  const int ranks_per_node = 4;
  for (int nodes : {2, 5, 7, 20}) {
    for (int64_t batch : {8, 32}) {
      PlanOptions o{true, 11, batch, 1024, 64, 0, nodes * ranks_per_node, EpochOrder::kByNode};
      for (int node : {0, nodes / 2, nodes - 1})
        EXPECT_GE(fraction_read_before(table, o, node, ranks_per_node), 0.96)
            << nodes << " nodes of batch " << batch << ", node " << node;
      if (nodes >= 5) {
        o.order = EpochOrder::kGlobal;
        EXPECT_LE(fraction_read_before(table, o, nodes / 2, ranks_per_node), 0.75)
            << nodes << " nodes of batch " << batch;
      }
    }
  }
}

TEST(EpochPlan, ByNodeOrderDrawsEveryStepFromAllGroups) {
  // Any kNodeGroups consecutive positions of the order hold one record of every group (but at the
  // epoch's end, where the smaller groups have run out): a step mixes the whole data set.
  const RecordTable table({300, 0, 4000, 17, 2000, 2500});
  PlanOptions o{true, 5, 16, 0, 64, 0, 1, EpochOrder::kByNode};
  const auto order = global_order(table, o, 3);
  const int64_t total = table.total();
  auto group_of = [&](int64_t record) {  // groups [g T / G, (g + 1) T / G)
    int64_t g = record * kNodeGroups / total;
    while ((g + 1) * total / kNodeGroups <= record) ++g;
    while (g * total / kNodeGroups > record) --g;
    return g;
  };
  const int64_t full_rounds = total / kNodeGroups;
  for (int64_t start = 0; start + kNodeGroups <= full_rounds * kNodeGroups; start += 97) {
    std::set<int64_t> groups;
    for (int64_t p = start; p < start + kNodeGroups; ++p) groups.insert(group_of(order[p]));
    ASSERT_EQ(static_cast<int64_t>(groups.size()), kNodeGroups) << "from position " << start;
  }
  // Each group reads its pieces (a file's block of 64 records) one after another, so the rank
  // that reads the group reads whole blocks.
  for (int64_t g : {int64_t{0}, kNodeGroups / 2, kNodeGroups - 1}) {
    std::vector<std::pair<int, int64_t>> blocks;  // (file, block) of each of the group's records
    for (int64_t record : order)
      if (group_of(record) == g) {
        const int f = table.file_of(record);
        blocks.emplace_back(f, (record - table.first_record[f]) / 64);
      }
    const auto changes = std::inner_product(blocks.begin() + 1, blocks.end(), blocks.begin(), 0,
                                            std::plus<>(), std::not_equal_to<>());
    EXPECT_EQ(changes + 1, static_cast<int>(std::set(blocks.begin(), blocks.end()).size()))
        << "group " << g;
  }
}

TEST(EpochPlan, RepeatedAugmentationShowsAQuarterOfTheRecordsFourTimesOnFourRanks) {
  // torchvision's RASampler (--ra-reps 4) on 8 ranks: the epoch keeps its 512 positions; they
  // show the first quarter of the order without repetitions, each record 4 times, its copies on
  // 4 consecutive ranks (RASampler: indices[rank::num_replicas] of the repeated list).
  const RecordTable table({300, 0, 212});
  const int world = 8;
  const int64_t batch = 8, reps = 4;
  std::map<int64_t, std::vector<int>> ranks_of;  // record -> the ranks of its copies
  std::set<int64_t> keys;
  for (int rank = 0; rank < world; ++rank) {
    PlanOptions o{true, 9, batch, 64, 16, rank, world, EpochOrder::kGlobal, reps};
    const auto plan = rank_plan(table, o, 2);
    ASSERT_EQ(plan.size(), 512u / world);
    for (int64_t key : plan) {
      keys.insert(key);
      ranks_of[record_of(key, reps)].push_back(rank);
    }
  }
  EXPECT_EQ(keys.size(), 512u);
  PlanOptions once{true, 9, batch, 64, 16, 0, world};
  const auto order = global_order(table, once, 2);
  const std::set<int64_t> first_quarter(order.begin(), order.begin() + 128);
  ASSERT_EQ(ranks_of.size(), 128u);
  for (auto& [record, ranks] : ranks_of) {
    EXPECT_TRUE(first_quarter.count(record)) << record;
    ASSERT_EQ(ranks.size(), 4u) << record;
    std::sort(ranks.begin(), ranks.end());
    EXPECT_EQ(ranks[0] % 4, 0) << record;
    for (int c = 1; c < 4; ++c) EXPECT_EQ(ranks[c], ranks[0] + c) << record;
  }
}

TEST(EpochPlan, RepeatedAugmentationResumesExactlyAtOtherWorldSizes) {
  // As ResizedRunsTrainEveryRecordOnce, with 4 copies: every position of the order, once.
  const RecordTable table(kCounts);
  for (EpochOrder order : kOrders) {
    const auto seen = entries_across_resizes(table, order, 4, {{4, 4, 5}, {3, 4, 4}, {1, 5, 1000}});
    PlanOptions o{true, 7, 4, 16, 8, 0, 1, order, 4};
    const auto keys = global_order(table, o, 2);
    EXPECT_EQ(seen, std::multiset<int64_t>(keys.begin(), keys.end()));
    EXPECT_EQ(std::set<int64_t>(keys.begin(), keys.end()).size(), keys.size());
  }
}

TEST(EpochPlan, FileOf) {
  const RecordTable table(kCounts);
  EXPECT_EQ(table.file_of(0), 0);
  EXPECT_EQ(table.file_of(36), 0);
  EXPECT_EQ(table.file_of(37), 2);  // file 1 is empty
  EXPECT_EQ(table.file_of(table.total() - 1), 6);
}

}  // namespace
}  // namespace trainer
