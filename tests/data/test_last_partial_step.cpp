// The epoch's last partial step, trained (a single sample left joins the step before) or dropped
// (drop_last), across a resume at an offset the new global batch does not divide, in both epoch
// orders: every record trained once, or at most once with fewer than one step of the tail left
// out (Note [The last partial step] in data/sources/step_shares.h).
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "data/sources/epoch_plan.h"
#include "data/sources/step_shares.h"

namespace trainer {
namespace {

const EpochOrder kBothOrders[] = {EpochOrder::kGlobal, EpochOrder::kByNode};

TEST(LastPartialStep, EpochEndIsTheLastWholeStepFromWhereTheEpochStarted) {
  EXPECT_EQ(epoch_end(100, 0, 0), 100);  // drop_last off
  EXPECT_EQ(epoch_end(100, 0, 8), 96);
  EXPECT_EQ(epoch_end(100, 40, 14), 96);  // resumed at 40 with steps of 14: 4 whole steps
  EXPECT_EQ(epoch_end(100, 96, 8), 96);   // nothing whole left: the epoch is over
  EXPECT_EQ(epoch_end(100, 100, 8), 100);
  EXPECT_EQ(steps_left(epoch_end(100, 0, 8), 0, 8), 12);
  EXPECT_EQ(step_samples(epoch_end(100, 0, 8), 88, 8), 8);  // not 12: nothing joins it
}

// The records `world` ranks of `batch` train from `position` to the end of the epoch's plan, by
// step: {step: records}, and the position after them.
std::map<int64_t, std::multiset<int64_t>> steps_from(const RecordTable& table, EpochOrder order,
                                                     int64_t position, int world, int64_t batch,
                                                     bool drop_last) {
  std::map<int64_t, std::multiset<int64_t>> steps;
  const int64_t global = batch * world;
  const int64_t end = epoch_end(table.total(), position, drop_last ? global : 0);
  for (int rank = 0; rank < world; ++rank) {
    PlanOptions o{true, 11, batch, 0, 4, rank, world, order, 1, drop_last ? global : 0};
    const auto plan = rank_plan(table, o, 1, position);
    size_t next = 0;
    for (int64_t p = position, step = 0; p < end; ++step) {
      const int64_t n = step_samples(end, p, global);
      const int64_t mine = share_of(n, batch, rank, world).count;
      steps[step].insert(plan.begin() + next, plan.begin() + next + mine);
      next += mine;
      p += n;
    }
    EXPECT_EQ(next, plan.size()) << "rank " << rank << ": records planned past the last step";
  }
  return steps;
}

TEST(LastPartialStep, AResumeAtAnOffsetTheNewBatchDoesNotDivideTrainsEachRecordOnce) {
  // CHAOS_SEED=20261174: 6 records, a step of 2 trained, then a batch of 3 from image 2: the 4
  // left are one step of 4 (a single image left joins the step before), never a step of 1.
  const RecordTable six({6});
  for (EpochOrder order : kBothOrders) {
    std::multiset<int64_t> seen;
    for (const auto& [step, records] : steps_from(six, order, 0, 1, 2, false))
      if (step == 0) seen.insert(records.begin(), records.end());
    const auto resumed = steps_from(six, order, 2, 1, 3, false);
    ASSERT_EQ(resumed.size(), 1u);
    EXPECT_EQ(resumed.at(0).size(), 4u);
    seen.insert(resumed.at(0).begin(), resumed.at(0).end());
    EXPECT_EQ(seen, std::multiset<int64_t>({0, 1, 2, 3, 4, 5}));
  }
}

TEST(LastPartialStep, DropLastAcrossAResizeTrainsEachRecordAtMostOnce) {
  // 326 records: 2 ranks x 4 for 5 steps (40), then 3 ranks x 5 to the end: 286 left, 19 whole
  // steps of 15 (285) and 1 record not trained, the epoch's last in its order.
  const RecordTable table({37, 0, 5, 120, 64, 1, 99});
  for (EpochOrder order : kBothOrders) {
    std::multiset<int64_t> seen;
    for (const auto& [step, records] : steps_from(table, order, 0, 2, 4, true))
      if (step < 5) seen.insert(records.begin(), records.end());
    const auto resumed = steps_from(table, order, 40, 3, 5, true);
    EXPECT_EQ(resumed.size(), 19u);
    for (const auto& [step, records] : resumed) {
      EXPECT_EQ(records.size(), 15u) << "step " << step;
      seen.insert(records.begin(), records.end());
    }
    EXPECT_EQ(seen.size(), 325u);
    EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 325u) << "a record twice";
    PlanOptions o{true, 11, 1, 0, 4, 0, 1, order};
    const int64_t last = global_order(table, o, 1).back();
    EXPECT_EQ(seen.count(last), 0u) << "the record left out is not the epoch's last";
  }
}

TEST(LastPartialStep, DropLastResumedAtTheSameBatchMakesTheSameSteps) {
  const RecordTable table({37, 0, 5, 120, 64, 1, 99});
  for (EpochOrder order : kBothOrders) {
    const auto whole = steps_from(table, order, 0, 3, 4, true);
    const auto resumed = steps_from(table, order, 5 * 12, 3, 4, true);
    ASSERT_EQ(whole.size(), 27u);  // 326 / 12, 2 left out
    ASSERT_EQ(resumed.size(), 22u);
    for (const auto& [step, records] : resumed) EXPECT_EQ(records, whole.at(step + 5));
  }
}

}  // namespace
}  // namespace trainer
