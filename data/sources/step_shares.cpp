#include "data/sources/step_shares.h"

#include <algorithm>

#include "base/user_error.h"

namespace trainer {

int64_t epoch_end(int64_t samples, int64_t position, int64_t whole_steps_of) {
  TORCH_INTERNAL_ASSERT(whole_steps_of >= 0 && position >= 0);
  if (whole_steps_of == 0 || position >= samples) return samples;
  return position + (samples - position) / whole_steps_of * whole_steps_of;
}

int64_t step_samples(int64_t samples, int64_t position, int64_t global_batch) {
  const int64_t left = std::max<int64_t>(samples - position, 0);
  // A single sample left after this step would be a step of its own: it joins this one.
  if (left <= global_batch || (global_batch > 1 && left == global_batch + 1)) return left;
  return global_batch;
}

int64_t steps_left(int64_t samples, int64_t position, int64_t global_batch) {
  TORCH_INTERNAL_ASSERT(global_batch > 0 && position >= 0);
  const int64_t left = std::max<int64_t>(samples - position, 0);
  if (global_batch == 1 || left <= 1) return left;
  // ceil(left / global_batch), one fewer when the remainder is a single sample.
  return (left + global_batch - 2) / global_batch;
}

Share share_of(int64_t step_samples, int64_t batch_size, int rank, int world_size) {
  TORCH_INTERNAL_ASSERT(world_size > 0 && rank >= 0 && rank < world_size);
  const bool short_step = step_samples < batch_size * world_size;
  if (!short_step || step_samples >= 2 * world_size || step_samples < 2) {
    // Even: counts differ by one at most.
    const int64_t base = step_samples / world_size, extra = step_samples % world_size;
    return {rank * base + std::min<int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
  }
  // Too few for two each: pairs from rank 0 on, the last pair taking an odd sample.
  const int64_t pairs = step_samples / 2;
  if (rank >= pairs) return {step_samples, 0};
  return {2 * rank, rank == pairs - 1 ? step_samples - 2 * rank : 2};
}

namespace {

// Rearranges a sorted full step whose records' k copies sit side by side: within each run of k
// ranks' pieces (k x batch_size entries), entry i goes to piece i % k, so that rank c of the run
// takes copy c of each of the run's records.
void spread_copies(std::vector<int64_t>& step, int64_t batch_size, int64_t k) {
  std::vector<int64_t> spread(step.size());
  const int64_t run = k * batch_size;
  for (int64_t begin = 0; begin < static_cast<int64_t>(step.size()); begin += run)
    for (int64_t i = 0; i < run; ++i)
      spread[begin + (i % k) * batch_size + i / k] = step[begin + i];
  step.swap(spread);
}

}  // namespace

std::vector<int64_t> rank_samples(const std::vector<int64_t>& order, int64_t position,
                                  int64_t batch_size, int rank, int world_size,
                                  int64_t repetitions) {
  TORCH_INTERNAL_ASSERT(batch_size > 0);
  const int64_t total = static_cast<int64_t>(order.size()), global = batch_size * world_size;
  std::vector<int64_t> out, step;
  out.reserve(static_cast<size_t>(steps_left(total, position, global) * batch_size + 1));
  for (int64_t p = position; p < total;) {
    const int64_t n = step_samples(total, p, global);
    step.assign(order.begin() + p, order.begin() + p + n);
    std::sort(step.begin(), step.end());  // storage order: Note [Elastic epoch order]
    if (repetitions > 1 && n == global && world_size % repetitions == 0)
      spread_copies(step, batch_size, repetitions);
    const Share share = share_of(n, batch_size, rank, world_size);
    out.insert(out.end(), step.begin() + share.begin, step.begin() + share.begin + share.count);
    p += n;
  }
  return out;
}

}  // namespace trainer
