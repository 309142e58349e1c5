// The training crop of each epoch: FFCV's progressive resizing (libffcv/ffcv-imagenet,
// train_imagenet.py, get_resolution), a pure function of the epoch so that a resumed run, at
// any world size, trains every epoch at the size an uninterrupted run would.
#pragma once

#include <cstdint>

namespace trainer {

// Note [Image size per epoch]
// The crop is min_size up to and including start_epoch, max_size from end_epoch on, and in
// between the linear ramp from min_size to max_size rounded to the nearest multiple of `step`,
// a tie (x.5 steps) going to the even multiple as numpy's np.round does: FFCV's
// `int(np.round(np.interp(epoch, [start, end], [min, max]) / 32)) * 32`, computed here exactly in
// integers. Epochs count from 0, as FFCV's start_ramp and end_ramp. It depends on the epoch alone,
// never on the step, the world size or the position in the epoch, so the whole epoch, resumed or
// not, is one size. Sources hold their buffers at largest() and hand out views of the epoch's
// size (Note [Recycled buffers] in data/sources/tfrecord_epoch.cpp).
struct ImageSizeSchedule {
  int64_t min_size = 160;   // pixels, the crop up to start_epoch
  int64_t max_size = 192;   // pixels, the crop from end_epoch on
  int64_t start_epoch = 0;  // 0-based: the last epoch at min_size
  int64_t end_epoch = 1;    // 0-based: the first epoch at max_size; > start_epoch
  int64_t step = 32;        // sizes on the ramp are multiples of this

  int64_t at(int64_t epoch) const;  // the crop of `epoch`, pixels
  int64_t largest() const { return max_size; }
};

}  // namespace trainer
