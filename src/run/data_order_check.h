// Whether the order of the training records skews what each rank and each step trains: read from
// the labels of the run's first steps, judged once by all ranks together, and a UserError naming
// the fix when it does. See Note [Data order that skews training].
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "data/sources/batch_source.h"

namespace trainer {

class ProcessGroup;

// Note [Data order that skews training]
// A rank trains a random share of the data, and a step a random batch of it, only while the order
// of the records does not follow their classes. Records written class after class (a converter
// that walks the class folders in turn) break both, silently: under epoch_order = by_node rank r
// trains the ids [r/W, (r+1)/W) every epoch (Note [Records by node]), so a GPU sees a few classes;
// under either order the steps' records come from a few runs of neighbouring records, so a run of
// steps, and each batch, holds a few classes, and batch norm and the gradient see one class at a
// time. The check counts the labels of distinct records over the run's first window of steps (the
// same steps on every rank), cut into kWindowParts runs of steps, and asks two questions, each
// against what a random order gives (Note [How the data order is judged]).

// Note [How the data order is judged]
// - Where a class is trained: Pearson's X^2 of the rank's class counts (n images) against those of
//   every rank together (N images of K classes; one all-reduce of kWindowParts x num_classes
//   counts), and the same of each of the rank's parts. A random order gives about
//   (K - 1)(1 - n / N) for the rank, the sum of (K - 1)(1 - part / N) for its parts; a rank, or
//   parts, that see an even fraction f of the classes give about n (1/f - 1) more: by_node's
//   ranks on class-ordered records, and either order's runs of steps. Each fails when X^2 exceeds
//   its random value by more than n / 2 (f below 2/3) and by 8 standard deviations (sqrt(2 x the
//   random value)).
// - A step's batch: the pairs of distinct records of one class within each step's share, against
//   what a random draw from the rank's own window gives (per step: pairs x sum over classes of
//   h (h - 1) / (n (n - 1))). It fails at twice that and 8 standard deviations (Poisson) above.
// Shuffled records pass both with a wide margin (tests/run/test_data_order_check.cpp: at ImageNet's
// 1,000 classes and 8 ranks of 32, within 0.1 of the random value and under 1.5x), and the log
// says the figures. Every rank's figures are summed into one table, so all ranks stop alike.
constexpr int kWindowParts = 4;

// Pearson's X^2 of some counts against the classes of every rank, and its value in a random order.
struct ClassMix {
  bool asked = false;  // enough images for the question (order_figures)
  double x2 = 0, random = 0;
  double excess(double images) const { return images > 0 ? (x2 - random) / images : 0; }
  double z() const { return (x2 - random) / std::sqrt(std::max(2 * random, 1.0)); }
  bool skewed(double images) const { return asked && excess(images) > 0.5 && z() >= 8; }
};

// One rank's figures over the window (order_figures).
struct OrderFigures {
  double images = 0;         // n: the rank's distinct records
  ClassMix rank;             // the rank's classes
  ClassMix runs;             // each part's, summed
  double step_pairs = 0;     // same-class pairs of distinct records within the steps' shares
  double step_expected = 0;  // what a random draw from the window gives
  double step_ratio() const;
  double step_z() const;
  bool rank_skewed() const { return rank.skewed(images); }
  bool runs_skewed() const { return runs.skewed(images); }
  bool step_skewed() const { return step_ratio() >= 2 && step_z() >= 8; }
};

// `parts`: the rank's class counts in each part of the window; `all`: every rank's and part's
// summed; `pairs`: pairs of distinct records within the steps' shares; `same_class_pairs`: those
// of one class. The rank's classes are asked about with other ranks and at least 2 images per
// class seen, the parts' with at least 1 per class in each part: fewer leave X^2 to chance.
OrderFigures order_figures(const std::vector<std::vector<int64_t>>& parts,
                           const std::vector<int64_t>& all, double pairs, double same_class_pairs);

// Steps whose labels the check reads: 16, or enough for about 4 images per class on every rank,
// at most half an epoch; 0 (no check) where that is under kFewestWindowSteps steps or
// kFewestWindowImages images a rank, too few to tell an order from chance.
constexpr int64_t kFewestWindowSteps = 8;
constexpr int64_t kFewestWindowImages = 64;
int64_t data_order_window(int64_t num_classes, int64_t world_size, int64_t images_per_step,
                          int64_t steps_per_epoch);

class DataOrderCheck {
 public:
  // `by_node`: epoch_order, for the fix the error names.
  DataOrderCheck(int64_t num_classes, int64_t window_steps, bool by_node);

  // One micro-batch of the step under way. Batches without record ids (synthetic data) turn the
  // check off: they have no order to skew.
  void add(const Batch& batch);
  // Ends the step; true when the window is full and judge() is due (on every rank alike).
  bool end_step();
  // Collective over `group` (null: alone). Throws UserError when the order skews training, else
  // logs the figures (rank 0).
  void judge(ProcessGroup* group) const;

 private:
  int64_t num_classes_;
  int64_t window_steps_;
  bool by_node_;
  bool off_ = false;
  int64_t steps_ = 0;
  std::vector<std::vector<int64_t>> counts_;       // distinct records per part and class
  std::vector<std::pair<int64_t, int64_t>> step_;  // (id, label) of the step under way
  double pairs_ = 0, same_class_pairs_ = 0;
};

}  // namespace trainer
