// The data order check (Note [Data order that skews training] in src/run/data_order_check.h) on the
// epochs' real plans: records stored in class order are caught under either epoch order (a rank's
// classes under by_node; its runs of steps or its steps under global), shuffled ones pass, also at
// ImageNet's 1,000 classes with a small per-GPU batch; the window's size; a lone rank's
// DataOrderCheck judges as its figures say.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "base/user_error.h"
#include "data/sources/epoch_plan.h"
#include "data/sources/step_shares.h"
#include "src/run/data_order_check.h"

namespace trainer {
namespace {

// Each record's label: `classes` classes of equal size, in class order or shuffled across the
// files (as make-tfrecords writes them).
std::vector<int64_t> labels_of(int64_t records, int64_t classes, bool class_order) {
  std::vector<int64_t> labels(static_cast<size_t>(records));
  for (int64_t i = 0; i < records; ++i) labels[i] = i * classes / records;
  if (!class_order) std::shuffle(labels.begin(), labels.end(), std::mt19937_64(5));
  return labels;
}

// Every rank's figures over the check's window of an epoch's first steps, as the ranks compute
// them: the labels of the records rank_plan gives each rank, step by step. The shuffle buffer is
// the shipped 1,024 records at ImageNet's size, none at the small sizes (where 1,024 would hold
// the whole set, which no real one is).
std::vector<OrderFigures> figures_over_window(const std::vector<int64_t>& labels, int64_t files,
                                              int64_t classes, EpochOrder order, int world,
                                              int64_t batch) {
  const int64_t records = static_cast<int64_t>(labels.size());
  const RecordTable table(std::vector<int64_t>(static_cast<size_t>(files), records / files));
  const int64_t window =
      data_order_window(classes, world, batch * world, steps_left(table.total(), 0, batch * world));
  using Parts = std::vector<std::vector<int64_t>>;
  std::vector<Parts> counts(world, Parts(kWindowParts, std::vector<int64_t>(classes, 0)));
  std::vector<double> pairs(world, 0), same(world, 0);
  std::vector<int64_t> all(classes, 0);
  for (int rank = 0; rank < world; ++rank) {
    const int64_t buffer = records > 100'000 ? 1024 : 0;
    PlanOptions o{true, 3, batch, buffer, 64, rank, world, order};
    const auto plan = rank_plan(table, o, 0);
    for (int64_t step = 0; step < window; ++step) {
      std::vector<int64_t> in_step(classes, 0);
      for (int64_t i = step * batch; i < (step + 1) * batch; ++i) ++in_step[labels[plan[i]]];
      auto& part = counts[rank][step * kWindowParts / window];
      for (int64_t c = 0; c < classes; ++c) {
        part[c] += in_step[c];
        all[c] += in_step[c];
        same[rank] += static_cast<double>(in_step[c] * (in_step[c] - 1) / 2);
      }
      pairs[rank] += static_cast<double>(batch * (batch - 1) / 2);
    }
  }
  std::vector<OrderFigures> out;
  for (int rank = 0; rank < world; ++rank)
    out.push_back(order_figures(counts[rank], all, pairs[rank], same[rank]));
  return out;
}

template <typename Question>
bool any_rank(const std::vector<OrderFigures>& figures, Question skewed) {
  return std::any_of(figures.begin(), figures.end(), skewed);
}
bool rank_skewed(const OrderFigures& f) { return f.rank_skewed(); }
bool runs_or_step_skewed(const OrderFigures& f) { return f.runs_skewed() || f.step_skewed(); }
bool any_skewed(const OrderFigures& f) { return rank_skewed(f) || runs_or_step_skewed(f); }

TEST(DataOrderCheck, ClassOrderedRecordsSkewEachRanksShareUnderByNode) {
  // The case: 1,024 records of 16 classes in class order in 8 files, 4 ranks.
  const auto figures =
      figures_over_window(labels_of(1024, 16, true), 8, 16, EpochOrder::kByNode, 4, 8);
  EXPECT_TRUE(any_rank(figures, rank_skewed));
  for (const auto& f : figures) EXPECT_GT(f.rank.excess(f.images), 2.0);  // 1/4 of them: ~3
}

TEST(DataOrderCheck, ClassOrderedRecordsSkewTheRunsOfStepsAndTheStepsUnderGlobalOrder) {
  const auto figures =
      figures_over_window(labels_of(1024, 16, true), 8, 16, EpochOrder::kGlobal, 4, 8);
  EXPECT_TRUE(any_rank(figures, runs_or_step_skewed));
  EXPECT_FALSE(any_rank(figures, rank_skewed));  // every rank trains the same classes
}

TEST(DataOrderCheck, ShuffledRecordsPassInBothOrders) {
  for (EpochOrder order : {EpochOrder::kGlobal, EpochOrder::kByNode}) {
    const auto figures = figures_over_window(labels_of(1024, 16, false), 8, 16, order, 4, 8);
    EXPECT_FALSE(any_rank(figures, any_skewed));
  }
}

TEST(DataOrderCheck, ShuffledImageNetSizedRecordsPassAtSmallPerGpuBatches) {
  // 1,000 classes of 1,281 records in 1,024 files, 8 ranks of 32: no false alarm, and the figures
  // near their random values.
  const auto labels = labels_of(1024 * 1251, 1000, false);
  for (EpochOrder order : {EpochOrder::kGlobal, EpochOrder::kByNode}) {
    const auto figures = figures_over_window(labels, 1024, 1000, order, 8, 32);
    for (const auto& f : figures) {
      EXPECT_LT(std::abs(f.rank.excess(f.images)), 0.1);
      EXPECT_LT(std::abs(f.runs.excess(f.images)), 0.1);
      EXPECT_LT(f.step_ratio(), 1.5);
    }
    EXPECT_FALSE(any_rank(figures, any_skewed));
  }
}

TEST(DataOrderCheck, ClassOrderedImageNetSizedRecordsAreCaughtInBothOrders) {
  const auto labels = labels_of(1024 * 1251, 1000, true);
  EXPECT_TRUE(
      any_rank(figures_over_window(labels, 1024, 1000, EpochOrder::kByNode, 8, 32), rank_skewed));
  EXPECT_TRUE(any_rank(figures_over_window(labels, 1024, 1000, EpochOrder::kGlobal, 8, 32),
                       runs_or_step_skewed));
}

TEST(DataOrderCheck, TheWindowHoldsFourImagesPerClassAtMostHalfAnEpochAndNotTooFew) {
  EXPECT_EQ(data_order_window(1000, 8, 8 * 256, 625), 16);     // 4,096 images a rank
  EXPECT_EQ(data_order_window(1000, 8, 8 * 32, 5004), 125);    // 4,000 a rank
  EXPECT_EQ(data_order_window(1000, 160, 160 * 256, 31), 15);  // half an epoch
  EXPECT_EQ(data_order_window(4, 1, 8, 4), 0);    // 2 steps: too few to tell order from chance
  EXPECT_EQ(data_order_window(4, 1, 1, 128), 0);  // 16 images
  EXPECT_EQ(data_order_window(4, 2, 8, 64), 16);  // 64 images a rank
}

TEST(DataOrderCheck, ALoneRankStopsOnStepsOfOneClassWithTheFix) {
  // 16 steps of 8 records, each step all of one class, 16 classes.
  DataOrderCheck check(16, 16, false);
  for (int64_t step = 0; step < 16; ++step) {
    Batch batch;
    batch.labels = at::full({8}, step, at::kLong);
    batch.ids = at::arange(step * 8, step * 8 + 8, at::kLong);
    check.add(batch);
    EXPECT_EQ(check.end_step(), step == 15);
  }
  try {
    check.judge(nullptr);
    FAIL() << "class-ordered steps passed";
  } catch (const UserError& error) {
    const std::string text = error.what();
    EXPECT_NE(text.find("skews what is trained"), std::string::npos) << text;
    EXPECT_NE(text.find("make-tfrecords"), std::string::npos) << text;
    EXPECT_NE(text.find("check_data_order = false"), std::string::npos) << text;
  }
}

TEST(DataOrderCheck, CopiesOfARecordInOneStepAreNotPairsOfOneClass) {
  // Repeated augmentation on one rank: each step holds 4 copies of 2 records of random classes.
  DataOrderCheck check(16, 16, false);
  std::mt19937_64 rng(1);
  for (int64_t step = 0; step < 16; ++step) {
    Batch batch;
    const int64_t a = static_cast<int64_t>(rng() % 16), b = static_cast<int64_t>(rng() % 16);
    batch.labels = at::tensor({a, a, a, a, b, b, b, b}, at::kLong);
    batch.ids = at::tensor({2 * step, 2 * step, 2 * step, 2 * step, 2 * step + 1, 2 * step + 1,
                            2 * step + 1, 2 * step + 1},
                           at::kLong);
    check.add(batch);
    check.end_step();
  }
  EXPECT_NO_THROW(check.judge(nullptr));
}

TEST(DataOrderCheck, SyntheticBatchesWithoutIdsAreNotJudged) {
  DataOrderCheck check(4, 1, false);
  Batch batch;
  batch.labels = at::zeros({8}, at::kLong);
  check.add(batch);
  EXPECT_TRUE(check.end_step());
  EXPECT_NO_THROW(check.judge(nullptr));
}

}  // namespace
}  // namespace trainer
