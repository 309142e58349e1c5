// Sharding and shuffling of TFRecord epochs: equal steps on every rank, disjoint and complete
// slices for world sizes 1..8 and uneven files, determinism per seed, a new order each epoch.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "data/tfrecord/epoch_plan.h"

namespace trainer {
namespace {

// Uneven shards, including an empty one and one smaller than a batch.
const std::vector<int64_t> kCounts = {37, 0, 5, 120, 64, 1, 99};

TEST(EpochPlan, TrainingEqualStepsDisjointForWorldSizes1To8) {
  const RecordTable table(kCounts);
  for (int world = 1; world <= 8; ++world) {
    for (int64_t batch : {1, 4, 7}) {
      std::set<int64_t> seen;
      const int64_t expected = table.total() / (world * batch) * batch;
      for (int rank = 0; rank < world; ++rank) {
        PlanOptions o{true, 7, batch, 16, 8, rank, world};
        const auto plan = rank_plan(table, o, 3);
        ASSERT_EQ(static_cast<int64_t>(plan.size()), expected) << world << " " << batch;
        ASSERT_EQ(samples_per_rank(table, o) % batch, 0);
        for (int64_t r : plan) {
          ASSERT_TRUE(r >= 0 && r < table.total());
          ASSERT_TRUE(seen.insert(r).second) << "record " << r << " on two ranks";
        }
      }
      // Complete up to the dropped remainder, which is smaller than one global batch.
      EXPECT_EQ(static_cast<int64_t>(seen.size()), expected * world);
      EXPECT_LT(table.total() - static_cast<int64_t>(seen.size()), world * batch);
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

TEST(EpochPlan, FileOf) {
  const RecordTable table(kCounts);
  EXPECT_EQ(table.file_of(0), 0);
  EXPECT_EQ(table.file_of(36), 0);
  EXPECT_EQ(table.file_of(37), 2);  // file 1 is empty
  EXPECT_EQ(table.file_of(table.total() - 1), 6);
}

}  // namespace
}  // namespace trainer
