#include "src/report/interval_log.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "src/distributed/liveness.h"
#include "src/report/slow_rank.h"

namespace trainer {
namespace {

// "1.0-350.2 ms" over the figures that are numbers, or "-" when none is.
std::string range_ms(const std::vector<double>& values) {
  double lo = INFINITY, hi = -INFINITY;
  for (double v : values) {
    if (std::isnan(v)) continue;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  return lo > hi ? "-" : fmt::format("{:.1f}-{:.1f} ms", lo, hi);
}

}  // namespace

IntervalLog::IntervalLog(const IntervalLogOptions& options, at::Device device)
    : options_(options), loss_sum_(at::zeros({}, at::TensorOptions().device(device))) {
  reset();
}

void IntervalLog::add(const at::Tensor& loss, int64_t rows, int64_t step_images) {
  loss_sum_.add_(loss, rows);
  rows_ += rows;
  images_ += step_images;
  ++steps_;
}

void IntervalLog::add_data_wait(double ms) { data_wait_ms_ += ms; }

void IntervalLog::reset() {
  loss_sum_.zero_();
  steps_ = rows_ = images_ = 0;
  data_wait_ms_ = 0;
  start_ = std::chrono::steady_clock::now();
}

double IntervalLog::flush(Trainer& trainer, const BatchSource& train, const Position& at,
                          MetricsLog& metrics) {
  const RankSpread spread = rank_spread(trainer, at.step, metrics);
  double loss_sum = loss_sum_.item<double>();
  int64_t rows = rows_, bad = train.bad_records();
  if (ProcessGroup* group = trainer.group(); group && group->size() > 1) {  // over all ranks
    const auto sums = group->allgather(loss_sum);
    loss_sum = std::accumulate(sums.begin(), sums.end(), 0.0);
    rows = group->sum(rows);
    bad = group->sum(bad);
  }
  const double loss = loss_sum / static_cast<double>(std::max<int64_t>(rows, 1));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double images_per_s = static_cast<double>(images_) / std::max(seconds, 1e-9);
  const double seconds_left =
      static_cast<double>(at.total_steps - at.step) * seconds / std::max<int64_t>(steps_, 1);
  const LossScaler& scaler = trainer.loss_scaler();
  const double scale = scaler.enabled() ? scaler.scale_value() : 1;
  const int64_t skipped = scaler.enabled() ? scaler.skipped_steps_value() : 0;
  spdlog::info(
      "epoch {}/{} ({:.0f}%) step {}/{} | {:.1f} img/s | loss {:.4f} | lr {:.5f} | scale {:g} | "
      "{} left",
      at.epoch + 1, options_.epochs, 100 * at.epoch_fraction, at.step, at.total_steps, images_per_s,
      loss, at.lr, scale, format_duration(seconds_left));
  metrics.write("train", {{"epoch", at.epoch + 1},
                          {"step", at.step},
                          {"epoch_progress", at.epoch_fraction},
                          {"images_per_s", images_per_s},
                          {"loss", loss},
                          {"lr", at.lr},
                          {"image_size", at.image_size},
                          {"loss_scale", scale},
                          {"input_wait_ms", spread.input_wait_ms},
                          {"compute_spread_ms", spread.compute_spread_ms},
                          {"skipped_steps", skipped},
                          {"bad_records", bad},
                          {"seconds_left", seconds_left}});
  metrics.flush();
  reset();
  return loss;
}

// Where each rank's steps of the interval went (input wait, compute, all-reduce, its link's round
// trip), means per step gathered on every rank; over several ranks the one holding the step back is
// named with what holds it (src/report/slow_rank.h), and each rank's figures go to metrics.jsonl as
// a "rank" event, to TensorBoard as rank_<R>/..., so that an operator sees which node to drain.
IntervalLog::RankSpread IntervalLog::rank_spread(Trainer& trainer, int64_t step,
                                                 MetricsLog& metrics) const {
  const double steps = static_cast<double>(std::max<int64_t>(steps_, 1));
  const double wait = data_wait_ms_ / steps;
  const StepTimes mine = trainer.take_step_times();  // the interval's, on every rank
  ProcessGroup* group = trainer.group();
  if (!group || group->size() == 1) return {wait, 0};
  // The interval's wall time a step less the step's parts: what this rank did between its steps
  // (rank 0's checkpoint writes, which its peers wait for in their next all-reduce).
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count() /
      steps;
  const double parts =
      wait + mine.compute_ms + (std::isnan(mine.allreduce_ms) ? 0 : mine.allreduce_ms);
  const std::vector<double> compute = group->allgather(mine.compute_ms);
  const std::vector<double> waits = group->allgather(wait);
  const std::vector<double> allreduce = group->allgather(mine.allreduce_ms);
  const std::vector<double> link = group->allgather(link_round_trip_ms());
  const std::vector<double> outside = group->allgather(std::max(0.0, wall_ms - parts));
  std::vector<RankTimes> ranks(group->size());
  for (int r = 0; r < group->size(); ++r)
    ranks[r] = {waits[r], compute[r], allreduce[r], link[r], outside[r]};
  const SlowRank slow = find_slow_rank(ranks);
  const auto [lo, hi] = std::minmax_element(compute.begin(), compute.end());
  const double longest_wait = *std::max_element(waits.begin(), waits.end());
  spdlog::info(
      "step {} ranks: compute {:.1f}-{:.1f} ms, input wait up to {:.1f} ms, all-reduce {}, "
      "link {}; {}",
      step, *lo, *hi, longest_wait, range_ms(allreduce), range_ms(link),
      describe_slow_rank(slow, ranks, group->hosts()));
  metrics.write("ranks", {{"step", step},
                          {"compute_ms_min", *lo},
                          {"compute_ms_max", *hi},
                          {"slowest_rank", int64_t{slow.rank}},
                          {"slowest_host", group->hosts()[slow.rank]},
                          {"held_by", std::string(held_by_name(slow.held_by))}});
  for (int r = 0; r < group->size(); ++r) {
    MetricsLog::Fields fields{{"step", step},
                              {"rank", int64_t{r}},
                              {"host", group->hosts()[r]},
                              {"input_wait_ms", waits[r]},
                              {"compute_ms", compute[r]},
                              {"outside_steps_ms", outside[r]}};
    if (!std::isnan(allreduce[r])) fields.emplace_back("allreduce_ms", allreduce[r]);
    if (!std::isnan(link[r])) fields.emplace_back("link_ms", link[r]);
    metrics.write("rank", fields);
  }
  return {longest_wait, *hi - *lo};
}

std::string format_duration(double seconds) {
  const int64_t s = std::llround(std::max(0.0, seconds));
  char text[32];
  if (s >= 3600)
    std::snprintf(text, sizeof(text), "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s % 3600 / 60));
  else if (s >= 60)
    std::snprintf(text, sizeof(text), "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  else
    std::snprintf(text, sizeof(text), "%llds", static_cast<long long>(s));
  return text;
}

}  // namespace trainer
