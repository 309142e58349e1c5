// Helpers of the TFRecord source's tests: a small source's options and one epoch's batches.
#pragma once

#include <string>
#include <vector>

#include "data/sources/tfrecord_source.h"
#include "tests/support/tfrecord_test_util.h"

namespace trainer::testing {

// A source of batches of 4 images of 32 px (36 px before the evaluation crop) over `files`, seed
// 5, 10 classes, shuffled in blocks of 4 records, 2 batches decoded ahead.
inline TFRecordSourceOptions source_options(const std::vector<std::string>& files, bool training) {
  TFRecordSourceOptions o;
  o.files = files;
  o.training = training;
  o.batch_size = 4;
  o.seed = 5;
  o.num_classes = 10;
  o.transform.image_size = 32;
  o.transform.val_resize = 36;
  o.shuffle_buffer = 8;
  o.block_records = 4;
  o.prefetch_batches = 2;
  return o;
}

// Every batch of epoch `e`.
inline std::vector<Batch> epoch_batches(TFRecordSource& source, int64_t e) {
  source.start_epoch(e);
  std::vector<Batch> out;
  while (source.batches_left() > 0) out.push_back(source.next_batch());
  return out;
}

}  // namespace trainer::testing
