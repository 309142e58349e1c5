#include "data/sources/image_size_schedule.h"

#include <c10/util/Exception.h>

namespace trainer {

int64_t ImageSizeSchedule::at(int64_t epoch) const {
  TORCH_INTERNAL_ASSERT(step > 0 && min_size <= max_size && start_epoch < end_epoch);
  if (epoch <= start_epoch) return min_size;
  if (epoch >= end_epoch) return max_size;
  // The ramp's value, over step, as the fraction n / d (Note [Image size per epoch]).
  const int64_t span = end_epoch - start_epoch;
  const int64_t n = min_size * span + (max_size - min_size) * (epoch - start_epoch);
  const int64_t d = span * step;
  int64_t q = n / d;  // n, d > 0: the floor
  const int64_t twice_rest = 2 * (n - q * d);
  if (twice_rest > d || (twice_rest == d && q % 2 == 1)) ++q;  // nearest, a tie to the even
  return q * step;
}

}  // namespace trainer
