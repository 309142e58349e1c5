// The TFRecord batch source across epochs: each epoch's training crop under progressive resizing
// from the epoch's start (a resume mid-epoch included), evaluation at val_image_size, and host
// memory that stays flat epoch after epoch.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <malloc.h>

#include <set>
#include <string>
#include <vector>

#include "data/sources/tfrecord_source.h"
#include "src/sources.h"
#include "tests/support/tfrecord_source_util.h"

namespace trainer {
namespace {

using testing::TempDir;

TEST(TFRecordSource, TrainingTakesEachEpochsScheduledSizeFromItsStart) {
  TempDir dir;
  const auto files = testing::write_dataset(dir, {20, 13, 7});
  auto o = testing::source_options(files, true);
  TFRecordSource fixed(o);  // 32 px every epoch
  o.image_sizes = ImageSizeSchedule{32, 96, 0, 3, 32};
  TFRecordSource progressive(o);
  const std::vector<int64_t> expected = {32, 64, 64, 96};  // 53.3 and 74.7 px round to 64
  for (int64_t e = 0; e < 4; ++e)
    for (const Batch& b : testing::epoch_batches(progressive, e)) {
      const int64_t rows = b.labels.size(0), s = expected[e];
      EXPECT_EQ(b.images.sizes(), (std::vector<int64_t>{rows, s, s, 3})) << "epoch " << e;
      // A view of a buffer sized for the largest crop, whatever the epoch's (Note [Recycled
      // buffers]): no allocation when the size changes.
      EXPECT_EQ(b.images.storage().nbytes(), static_cast<size_t>(rows * 96 * 96 * 3));
    }
  // The same pictures as without a schedule at the same size.
  const auto a = testing::epoch_batches(fixed, 0), b = testing::epoch_batches(progressive, 0);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].images.equal(b[i].images)) << i;
  // Resumed 16 images into epoch 3: its size, and the batches the whole epoch had from there.
  const auto whole = testing::epoch_batches(progressive, 3);
  progressive.start_epoch(3, 16);
  ASSERT_EQ(progressive.batches_left(), static_cast<int64_t>(whole.size()) - 4);
  for (size_t i = 4; i < whole.size(); ++i)
    EXPECT_TRUE(progressive.next_batch().images.equal(whole[i].images)) << "batch " << i;
}

// The seam (src/sources.cpp): FixRes's evaluation crop and resize, and the schedule, reach every
// kind of source.
TEST(Sources, EvaluationTakesValImageSizeAndTrainingEachEpochsSize) {
  TempDir dir;
  const auto files = testing::write_dataset(dir, {12, 12});
  Config c;
  c.train_data = c.val_data = (dir.path() / "train-*").string();
  c.batch_size = 4;
  c.num_classes = 10;
  c.image_size = 32;
  c.val_image_size = 48;
  c.val_resize = 56;
  c.epochs = 4;
  c.warmup_epochs = 0;
  c.progressive_resize_min_size = 32;
  c.progressive_resize_max_size = 64;
  c.progressive_resize_end_epoch = 2;
  c.decode_threads = c.reader_threads = 1;
  c.generated_classes = 2;
  c.generated_train_images = 16;
  c.generated_val_images = 8;
  c.synthetic_batches_per_epoch = 2;
  const std::vector<int64_t> expected = {32, 64, 64, 64};  // epoch 1: 48 px, a tie, goes to 64
  for (const DataSource source :
       {DataSource::kTfrecord, DataSource::kGenerated, DataSource::kSynthetic}) {
    c.data_source = source;
    validate_config(c);
    Sources sources = make_sources(c, c10::Device(c10::kCPU));
    for (int64_t e = 0; e < 4; ++e) {
      ASSERT_EQ(train_image_size(c, e), expected[e]);
      sources.train->start_epoch(e);
      const Batch b = sources.train->next_batch();
      EXPECT_EQ(b.images.sizes(), (std::vector<int64_t>{4, expected[e], expected[e], 3}))
          << name_of(source) << ", epoch " << e;
    }
    if (source == DataSource::kSynthetic) continue;  // no held-out data
    sources.val->start_epoch(0);
    const Batch v = sources.val->next_batch();
    EXPECT_EQ(v.images.sizes(), (std::vector<int64_t>{4, 48, 48, 3})) << name_of(source);
    if (source != DataSource::kTfrecord) continue;
    auto o = testing::source_options(files, false);  // centre 48 of the shorter side resized to 56
    o.transform.image_size = 48;
    o.transform.val_resize = 56;
    TFRecordSource direct(o);
    EXPECT_TRUE(testing::epoch_batches(direct, 0).front().images.equal(v.images));
  }
}

// Heap bytes in use (every glibc arena, mmapped blocks included): what the process holds,
// not what the allocator keeps cached for later.
size_t heap_in_use() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

TEST(TFRecordSource, HostMemoryStaysFlatAcrossEpochs) {
  TempDir dir;
  const auto files = testing::write_dataset(dir, {70, 50, 40}, 10, 320);
  auto o = testing::source_options(files, true);
  o.batch_size = 8;
  o.transform.image_size = 64;
  o.decode_threads = 2;
  o.reader_threads = 2;
  o.shuffle_buffer = 32;
  TFRecordSource source(o);
  int64_t payload_bytes = 0;
  for (const auto& f : files) payload_bytes += static_cast<int64_t>(std::filesystem::file_size(f));
  ASSERT_GT(payload_bytes, 4 << 20);
  std::vector<size_t> in_use;
  for (int64_t e = 0; e < 10; ++e) {
    source.start_epoch(e);
    while (source.batches_left() > 0) source.next_batch();
    in_use.push_back(heap_in_use());
  }
  // The first epochs fill the recycled buffers; from then on nothing grows, although every
  // epoch reads all the records again. One epoch's figure jitters by up to a quarter of the
  // payloads (the decode threads' own buffers, freed as they exit, 1 run in 30), so the least of
  // the last four is compared: a leak of a tenth of one epoch's payloads per epoch puts even
  // epoch 6 above the bound.
  const size_t warm = *std::max_element(in_use.begin() + 1, in_use.begin() + 4);
  const size_t late = *std::min_element(in_use.begin() + 6, in_use.end());
  std::string figures;
  for (size_t bytes : in_use) figures += " " + std::to_string(bytes);
  EXPECT_LE(late, warm + payload_bytes / 4)
      << "bytes in use per epoch:" << figures << "; records: " << payload_bytes << " bytes";
}

}  // namespace
}  // namespace trainer
