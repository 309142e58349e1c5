// Progressive resizing's schedule (Note [Image size per epoch]) against FFCV's get_resolution
// (libffcv/ffcv-imagenet, train_imagenet.py), written out here the way numpy computes it.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "data/sources/image_size_schedule.h"

namespace trainer {
namespace {

// FFCV: min_res up to start_ramp, max_res from end_ramp, and between
// int(np.round(np.interp([epoch], [start_ramp, end_ramp], [min_res, max_res])[0] / 32)) * 32.
// np.interp is slope * (x - x0) + y0 in doubles; np.round, like nearbyint in the default
// rounding mode, sends a tie to the even integer.
int64_t ffcv_resolution(int64_t epoch, int64_t min_res, int64_t max_res, int64_t start_ramp,
                        int64_t end_ramp, int64_t step) {
  if (epoch <= start_ramp) return min_res;
  if (epoch >= end_ramp) return max_res;
  const double slope = double(max_res - min_res) / double(end_ramp - start_ramp);
  const double interp = slope * double(epoch - start_ramp) + double(min_res);
  return static_cast<int64_t>(std::nearbyint(interp / double(step))) * step;
}

std::vector<int64_t> sizes(const ImageSizeSchedule& schedule, int64_t epochs) {
  std::vector<int64_t> out;
  for (int64_t e = 0; e < epochs; ++e) out.push_back(schedule.at(e));
  return out;
}

TEST(ImageSizeSchedule, FfcvResNet50SixteenEpochs) {
  // rn50_configs/rn50_16_epochs.yaml: min_res 160, max_res 192, start_ramp 11, end_ramp 13.
  const ImageSizeSchedule schedule{160, 192, 11, 13, 32};
  const std::vector<int64_t> got = sizes(schedule, 16);
  // Epoch 12 is halfway, 176 px = 5.5 x 32, which np.round takes to 6: 192, not 176.
  const std::vector<int64_t> expected = {160, 160, 160, 160, 160, 160, 160, 160,
                                         160, 160, 160, 160, 192, 192, 192, 192};
  EXPECT_EQ(got, expected);
  for (int64_t e = 0; e < 16; ++e)
    EXPECT_EQ(got[e], ffcv_resolution(e, 160, 192, 11, 13, 32)) << "epoch " << e;
}

TEST(ImageSizeSchedule, LongerRampSteps) {
  // 128 -> 256 px over epochs 2..10: 16 px more each epoch, every other one a tie (144, 176,
  // 208, 240 px), which goes to the even multiple of 32. The figures are numpy's, from FFCV's code.
  const ImageSizeSchedule schedule{128, 256, 2, 10, 32};
  const std::vector<int64_t> expected = {128, 128, 128, 128, 160, 192,
                                         192, 192, 224, 256, 256, 256};
  EXPECT_EQ(sizes(schedule, 12), expected);
}

TEST(ImageSizeSchedule, MatchesFfcvEverywhereAndStaysInRange) {
  for (int64_t step : {8, 16, 32})
    for (int64_t min = 32; min <= 224; min += step * 3)
      for (int64_t max = min; max <= min + 160; max += step * 2)
        for (int64_t start = 0; start <= 6; start += 3)
          for (int64_t end = start + 1; end <= start + 9; end += 2) {
            const ImageSizeSchedule schedule{min, max, start, end, step};
            int64_t previous = 0;
            for (int64_t e = 0; e <= end + 2; ++e) {
              const int64_t size = schedule.at(e);
              ASSERT_EQ(size, ffcv_resolution(e, min, max, start, end, step))
                  << min << " -> " << max << " px, epochs " << start << ".." << end << ", step "
                  << step << ", epoch " << e;
              ASSERT_EQ(size % step, 0);
              ASSERT_GE(size, min);
              ASSERT_LE(size, max);
              ASSERT_GE(size, previous);  // never shrinks
              previous = size;
            }
          }
}

TEST(ImageSizeSchedule, OneSizeWhenMinEqualsMax) {
  const ImageSizeSchedule schedule{224, 224, 0, 5, 32};
  EXPECT_EQ(sizes(schedule, 8), std::vector<int64_t>(8, 224));
  EXPECT_EQ(schedule.largest(), 224);
}

}  // namespace
}  // namespace trainer
