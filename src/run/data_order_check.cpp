#include "src/run/data_order_check.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/user_error.h"
#include "src/distributed/process_group.h"

namespace trainer {

double OrderFigures::step_ratio() const {
  if (step_expected > 0) return step_pairs / step_expected;
  return step_pairs > 0 ? std::numeric_limits<double>::infinity() : 1.0;
}

double OrderFigures::step_z() const {
  return (step_pairs - step_expected) / std::sqrt(std::max(step_expected, 1.0));
}

namespace {

// X^2 of `counts` (n images) against the classes of every rank, `all` (N images of K classes).
ClassMix class_mix(const std::vector<double>& counts, const std::vector<int64_t>& all, double total,
                   double classes) {
  ClassMix mix;
  double n = 0;
  for (double count : counts) n += count;
  if (n == 0) return mix;
  mix.random = (classes - 1) * (1 - n / total);
  for (size_t i = 0; i < counts.size(); ++i) {
    if (all[i] == 0) continue;
    const double expected = n * static_cast<double>(all[i]) / total;
    mix.x2 += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  return mix;
}

}  // namespace

OrderFigures order_figures(const std::vector<std::vector<int64_t>>& parts,
                           const std::vector<int64_t>& all, double pairs, double same_class_pairs) {
  double total = 0, classes = 0;
  for (int64_t count : all) {
    total += static_cast<double>(count);
    classes += count > 0 ? 1 : 0;
  }
  OrderFigures f;
  std::vector<double> window(all.size(), 0);
  for (const auto& part : parts) {
    TORCH_INTERNAL_ASSERT(part.size() == all.size());
    const std::vector<double> counts(part.begin(), part.end());
    const ClassMix mix = class_mix(counts, all, total, classes);
    f.runs.x2 += mix.x2;
    f.runs.random += mix.random;
    for (size_t i = 0; i < counts.size(); ++i) window[i] += counts[i];
  }
  double same_in_window = 0;
  for (double h : window) {
    f.images += h;
    same_in_window += h * (h - 1);
  }
  f.rank = class_mix(window, all, total, classes);
  f.rank.asked = total > f.images && f.images >= 2 * classes;
  f.runs.asked = f.images >= kWindowParts * classes;
  f.step_pairs = same_class_pairs;
  if (f.images >= 2) f.step_expected = pairs * same_in_window / (f.images * (f.images - 1));
  return f;
}

int64_t data_order_window(int64_t num_classes, int64_t world_size, int64_t images_per_step,
                          int64_t steps_per_epoch) {
  TORCH_INTERNAL_ASSERT(images_per_step > 0);
  const int64_t for_classes =
      (4 * num_classes * world_size + images_per_step - 1) / images_per_step;
  const int64_t window = std::min(std::max<int64_t>(16, for_classes), steps_per_epoch / 2);
  const bool enough =
      window >= kFewestWindowSteps && window * images_per_step >= kFewestWindowImages * world_size;
  return enough ? window : 0;
}

DataOrderCheck::DataOrderCheck(int64_t num_classes, int64_t window_steps, bool by_node)
    : num_classes_(num_classes),
      window_steps_(window_steps),
      by_node_(by_node),
      counts_(kWindowParts, std::vector<int64_t>(static_cast<size_t>(num_classes), 0)) {}

void DataOrderCheck::add(const Batch& batch) {
  if (off_) return;
  if (!batch.ids.defined() || !batch.labels.device().is_cpu()) {
    off_ = true;
    return;
  }
  const at::Tensor labels = batch.labels.to(at::kLong).contiguous();
  const at::Tensor ids = batch.ids.contiguous();
  const int64_t* label = labels.data_ptr<int64_t>();
  const int64_t* id = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < labels.numel(); ++i)
    if (label[i] >= 0 && label[i] < num_classes_) step_.emplace_back(id[i], label[i]);
}

bool DataOrderCheck::end_step() {
  // Distinct records only: repeated augmentation's copies of a record may share a rank.
  std::sort(step_.begin(), step_.end());
  step_.erase(std::unique(step_.begin(), step_.end(),
                          [](const auto& a, const auto& b) { return a.first == b.first; }),
              step_.end());
  std::vector<int64_t> in_step(static_cast<size_t>(num_classes_), 0);
  for (const auto& [id, label] : step_) ++in_step[static_cast<size_t>(label)];
  auto& part = counts_[static_cast<size_t>(steps_ * kWindowParts / window_steps_)];
  for (size_t c = 0; c < in_step.size(); ++c) {
    part[c] += in_step[c];
    same_class_pairs_ += static_cast<double>(in_step[c] * (in_step[c] - 1) / 2);
  }
  const double n = static_cast<double>(step_.size());
  pairs_ += n * (n - 1) / 2;
  step_.clear();
  return ++steps_ == window_steps_;
}

namespace {

constexpr int kFigures = 9;

// Row r of a (world, kFigures) table: rank r's figures, summed over the ranks so that every rank
// reads every rank's.
std::vector<OrderFigures> figures_of_every_rank(const OrderFigures& mine, ProcessGroup* group) {
  const int world = group ? group->size() : 1, rank = group ? group->rank() : 0;
  at::Tensor table = at::zeros({world, kFigures}, at::kDouble);
  double* row = table.data_ptr<double>() + rank * kFigures;
  const double mine_row[kFigures] = {mine.images,
                                     mine.rank.asked ? 1.0 : 0.0,
                                     mine.rank.x2,
                                     mine.rank.random,
                                     mine.runs.asked ? 1.0 : 0.0,
                                     mine.runs.x2,
                                     mine.runs.random,
                                     mine.step_pairs,
                                     mine.step_expected};
  std::copy(mine_row, mine_row + kFigures, row);
  if (group) group->allreduce_sum_(table);
  std::vector<OrderFigures> out(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    const double* f = table.data_ptr<double>() + r * kFigures;
    out[r] = {f[0], {f[1] > 0, f[2], f[3]}, {f[4] > 0, f[5], f[6]}, f[7], f[8]};
  }
  return out;
}

// The rank with the largest `value`.
template <typename Value>
int worst(const std::vector<OrderFigures>& figures, Value value) {
  int at = 0;
  for (int r = 1; r < static_cast<int>(figures.size()); ++r)
    if (value(figures[r]) > value(figures[at])) at = r;
  return at;
}

// The three questions over every rank's figures: each one's text (the worst rank's figure), and
// whether it failed.
struct Verdict {
  std::string texts[3];  // the ranks' classes, their runs of steps' classes, the steps
  bool skewed[3] = {};
  std::string joined(bool only_skewed) const {
    std::string out;
    for (int i = 0; i < 3; ++i)
      if (!only_skewed || skewed[i]) out += (out.empty() ? "" : "; ") + texts[i];
    return out;
  }
};

std::string mix_text(const std::string& what, int rank, const ClassMix& mix, double images,
                     const char* unasked) {
  if (!mix.asked) return fmt::format("{}: not asked ({})", what, unasked);
  return fmt::format("rank {}'s {} {:.2f} above a random order's (X^2 per image, {:.1f} sd)", rank,
                     what, mix.excess(images), mix.z());
}

Verdict verdict_of(const std::vector<OrderFigures>& figures) {
  const auto excess = [](const ClassMix& mix, double images) {
    return mix.asked ? mix.excess(images) : -std::numeric_limits<double>::infinity();
  };
  const int rank_at = worst(figures, [&](const auto& f) { return excess(f.rank, f.images); });
  const int runs_at = worst(figures, [&](const auto& f) { return excess(f.runs, f.images); });
  const int step_at = worst(figures, [](const auto& f) { return f.step_ratio(); });
  const OrderFigures &rank = figures[rank_at], &runs = figures[runs_at], &step = figures[step_at];
  Verdict v;
  v.texts[0] = mix_text("classes", rank_at, rank.rank, rank.images,
                        figures.size() == 1 ? "one rank" : "under 2 images per class");
  v.texts[1] = mix_text(fmt::format("classes in {} runs of steps", kWindowParts), runs_at,
                        runs.runs, runs.images, "under 1 image per class in a run");
  v.texts[2] = fmt::format(
      "rank {}'s steps hold {:.0f} pairs of images of one class, {:.1f}x a random batch's {:.1f} "
      "({:.1f} sd)",
      step_at, step.step_pairs, step.step_ratio(), step.step_expected, step.step_z());
  v.skewed[0] = rank.rank_skewed();
  v.skewed[1] = runs.runs_skewed();
  v.skewed[2] = step.step_skewed();
  return v;
}

std::string fix(bool share, bool by_node) {
  std::string out =
      "Fix: rewrite the records shuffled across files (make-tfrecords writes them so; "
      "docs/data.md)";
  if (share && by_node)
    out += ", or try epoch_order = \"global\" (this check says whether that suffices)";
  return out + ". check_data_order = false trains in this order anyway.";
}

}  // namespace

void DataOrderCheck::judge(ProcessGroup* group) const {
  if (off_) return;
  at::Tensor all = at::zeros({num_classes_}, at::kLong);
  for (const auto& part : counts_) all += at::tensor(part, at::kLong);
  if (group) group->allreduce_sum_(all);
  const std::vector<int64_t> all_counts(all.data_ptr<int64_t>(),
                                        all.data_ptr<int64_t>() + all.numel());
  const Verdict v = verdict_of(
      figures_of_every_rank(order_figures(counts_, all_counts, pairs_, same_class_pairs_), group));
  const std::string found = v.joined(true);
  if (found.empty()) {
    if (!group || group->rank() == 0)
      spdlog::info("data order over the first {} steps: {} (limits: 0.5 and 8 sd; 2x and 8 sd)",
                   window_steps_, v.joined(false));
    return;
  }
  throw UserError(fmt::format(
      "the order of the training records skews what is trained, over the first {} steps: {} "
      "(limits: 0.5 and 8 sd above a random order; 2x and 8 sd). The records are stored in class "
      "order (as a converter that writes class after class leaves them), so {}. {}",
      window_steps_, found,
      v.skewed[0]   ? "each GPU trains a few of the classes"
      : v.skewed[1] ? "each run of steps trains a few of the classes"
                    : "each step trains a few classes",
      fix(v.skewed[0], by_node_)));
}

}  // namespace trainer
