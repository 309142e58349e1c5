// The TFRecord batch source end to end on small generated files: batch shapes and labels,
// determinism whatever the thread counts, equal steps on all ranks (a short last step included),
// evaluation counting each image once, the bad-record policies, and each epoch's image size.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "base/user_error.h"
#include "data/sources/tfrecord_source.h"
#include "src/sources.h"
#include "tests/tfrecord_test_util.h"

namespace trainer {
namespace {

using testing::TempDir;

TFRecordSourceOptions options(const std::vector<std::string>& files, bool training) {
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

std::vector<Batch> epoch(TFRecordSource& source, int64_t e) {
  source.start_epoch(e);
  std::vector<Batch> out;
  while (source.batches_left() > 0) out.push_back(source.next_batch());
  return out;
}

void corrupt_byte(const std::string& path, int64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  c ^= 0x5a;
  f.seekp(offset);
  f.write(&c, 1);
}

TEST(TFRecordSource, BatchesAreDeterministicWhateverTheThreadCounts) {
  TempDir dir;
  const auto files = testing::write_dataset(dir, {20, 13, 7});
  auto o = options(files, true);
  TFRecordSource one(o);
  o.decode_threads = 3;
  o.reader_threads = 3;
  o.prefetch_batches = 1;
  TFRecordSource many(o);
  ASSERT_EQ(one.batches_left(), 10);
  const auto a = epoch(one, 0), b = epoch(many, 0), c = epoch(one, 1);
  ASSERT_EQ(a.size(), 10u);
  bool epochs_differ = false;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].images.sizes(), (std::vector<int64_t>{4, 32, 32, 3}));
    EXPECT_EQ(a[i].images.scalar_type(), at::kByte);
    EXPECT_TRUE(a[i].images.equal(b[i].images)) << "batch " << i;
    EXPECT_TRUE(a[i].labels.equal(b[i].labels));
    EXPECT_GE(a[i].labels.min().item<int64_t>(), 0);  // stored 1..10 became 0..9
    EXPECT_LE(a[i].labels.max().item<int64_t>(), 9);
    epochs_differ |= !a[i].labels.equal(c[i].labels);
  }
  EXPECT_TRUE(epochs_differ);
  // Resuming mid-epoch (7 batches = 28 images in) yields the same remaining batches.
  one.start_epoch(0, 28);
  EXPECT_TRUE(one.next_batch().images.equal(a[7].images));
}

TEST(TFRecordSource, RepeatedCopiesOfARecordAreAugmentedEachOnItsOwn) {
  // 4 copies on 4 ranks: every rank's step holds one copy of the same records (the label and id
  // of each row agree across ranks), each rank's crop and flip its own.
  TempDir dir;
  const auto files = testing::write_dataset(dir, {20, 13, 7});
  std::vector<Batch> first;
  for (int rank = 0; rank < 4; ++rank) {
    auto o = options(files, true);
    o.repetitions = 4;
    o.rank = rank;
    o.world_size = 4;
    TFRecordSource source(o);
    first.push_back(source.next_batch());
  }
  for (int rank = 1; rank < 4; ++rank) {
    EXPECT_TRUE(first[rank].ids.equal(first[0].ids)) << "rank " << rank;
    EXPECT_TRUE(first[rank].labels.equal(first[0].labels)) << "rank " << rank;
    for (int64_t row = 0; row < 4; ++row)
      EXPECT_FALSE(first[rank].images[row].equal(first[0].images[row]))
          << "rank " << rank << " row " << row;
  }
}

TEST(TFRecordSource, EqualStepsOnEveryRankAndEvaluationCountsEachImageOnce) {
  TempDir dir;
  const auto files = testing::write_dataset(dir, {17, 2, 11});
  for (int world : {1, 3, 4}) {
    int64_t eval_images = 0;
    for (int rank = 0; rank < world; ++rank) {
      auto o = options(files, true);
      o.rank = rank;
      o.world_size = world;
      TFRecordSource train(o);
      EXPECT_EQ(train.batches_left(), (30 + 4 * world - 1) / (4 * world));  // last step short
      o.training = false;
      TFRecordSource val(o);
      for (const Batch& b : epoch(val, 0)) {
        EXPECT_EQ(b.images.size(0), b.labels.size(0));
        eval_images += b.images.size(0);
      }
    }
    EXPECT_EQ(eval_images, 30) << "world " << world;
  }
}

TEST(TFRecordSource, ShortLastStepsStillTrainEveryRecordOnce) {
  // 4 ranks x 4. 18 records: a full step, then 2 records for rank 0 and empty batches for the
  // others (never one record alone). 17: the single record left joins the first step.
  struct Case {
    std::vector<int> files;
    std::vector<std::vector<int64_t>> rows;  // per rank, per batch
  };
  for (const Case& c :
       {Case{{10, 8}, {{4, 2}, {4, 0}, {4, 0}, {4, 0}}}, Case{{10, 7}, {{5}, {4}, {4}, {4}}}}) {
    TempDir dir;
    const auto files = testing::write_dataset(dir, c.files);
    std::multiset<int64_t> trained;
    for (int rank = 0; rank < 4; ++rank) {
      auto o = options(files, true);
      o.rank = rank;
      o.world_size = 4;
      TFRecordSource train(o);
      std::vector<int64_t> rows;
      for (const Batch& b : epoch(train, 0)) {
        rows.push_back(b.images.size(0));
        EXPECT_EQ(b.labels.size(0), b.images.size(0));
        ASSERT_EQ(b.ids.size(0), b.images.size(0));
        for (int64_t i = 0; i < b.ids.size(0); ++i) trained.insert(b.ids[i].item<int64_t>());
      }
      EXPECT_EQ(rows, c.rows[rank]) << "rank " << rank;
    }
    const int64_t total = c.files[0] + c.files[1];
    ASSERT_EQ(static_cast<int64_t>(trained.size()), total);
    for (int64_t id = 0; id < total; ++id) EXPECT_EQ(trained.count(id), 1u) << "record " << id;
  }
}

TEST(TFRecordSource, EveryLastBatchComesWhateverItsLengthAndThePrefetch) {
  // The epoch's last batch may hold one record more than batch_size (a single record left joins
  // the step before). With prefetch_batches 1 its last row lay outside a decode window counted in
  // records, and next_batch() waited for it forever: 5 records in batches of 2, or 7 records on
  // 4 ranks in batches of 1 (rank 0's last batch holds 3). Every rank of every such epoch must get
  // all its batches.
  std::map<int, std::unique_ptr<TempDir>> dirs;  // one dataset per record count
  std::map<int, std::vector<std::string>> datasets;
  for (int world = 1; world <= 4; ++world) {
    for (int64_t batch = 1; batch <= 3; ++batch) {
      const int global = static_cast<int>(batch) * world;
      for (int records : {global + 1, global + 2, global + 3, 2 * global + 1, 2 * global + 2}) {
        if (!dirs.count(records)) {
          dirs[records] = std::make_unique<TempDir>();
          datasets[records] = testing::write_dataset(*dirs[records], {records});
        }
        for (int64_t prefetch = 1; prefetch <= 2; ++prefetch) {
          std::multiset<int64_t> trained;
          for (int rank = 0; rank < world; ++rank) {
            auto o = options(datasets[records], true);
            o.batch_size = batch;
            o.rank = rank;
            o.world_size = world;
            o.prefetch_batches = prefetch;
            o.wait_timeout = std::chrono::seconds(20);  // a hang fails the test, not ctest
            TFRecordSource train(o);
            for (const Batch& b : epoch(train, 0))
              for (int64_t i = 0; i < b.ids.size(0); ++i) trained.insert(b.ids[i].item<int64_t>());
          }
          ASSERT_EQ(static_cast<int64_t>(trained.size()), records)
              << "world " << world << ", batch " << batch << ", prefetch " << prefetch;
          EXPECT_EQ(std::set<int64_t>(trained.begin(), trained.end()).size(), trained.size());
        }
      }
    }
  }
}

TEST(TFRecordSource, LabelOffsetZeroKeepsStoredLabels) {
  TempDir dir;
  const auto files = testing::write_dataset(dir, {12});
  auto o = options(files, false);
  o.label_offset = 0;
  o.num_classes = 11;
  TFRecordSource source(o);
  const auto batches = epoch(source, 0);
  EXPECT_EQ(batches[0].labels[0].item<int64_t>(), 1);  // record 0: stored label 1, in order
}

// The same images in TFDS's layout (labels 0..9) and TensorFlow's (1..10): the layout and the
// label base detected, the batches alike, labels included; a layout named wrongly makes every
// record bad, the key named.
TEST(TFRecordSource, TfdsRecordsGiveTheBatchesOfTensorflowsLayout) {
  TempDir tf_dir, tfds_dir;
  const auto tf_files = testing::write_dataset(tf_dir, {12, 9});
  const auto tfds_files = testing::write_dataset(tfds_dir, {12, 9}, 10, 48, /*tfds=*/true);
  for (bool training : {true, false}) {
    TFRecordSource tf(options(tf_files, training)), tfds(options(tfds_files, training));
    const auto a = epoch(tf, 0), b = epoch(tfds, 0);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(a[i].images.equal(b[i].images)) << "batch " << i;
      EXPECT_TRUE(a[i].labels.equal(b[i].labels)) << "batch " << i;
    }
    EXPECT_EQ(tfds.bad_records(), 0);
  }
  auto o = options(tfds_files, false);
  o.label_offset = 0;  // explicit, and the layout's own
  o.record_layout = RecordLayout::kTfds;
  TFRecordSource named(o);
  EXPECT_EQ(epoch(named, 0)[0].labels[0].item<int64_t>(), 0);  // record 0: stored label 0
  o.record_layout = RecordLayout::kTensorflow;
  o.fail_on_bad_record = true;
  TFRecordSource wrong(o);
  try {
    epoch(wrong, 0);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("missing feature image/encoded (record_layout = "
                                         "tensorflow)"),
              std::string::npos)
        << e.what();
  }
}

TEST(TFRecordSource, SkipPolicyDropsBadRecordsAndFailPolicyStops) {
  TempDir dir;
  const auto files = testing::write_dataset(dir, {12, 12});
  {
    TFRecordSource build_indexes(options(files, false));  // writes the .idx files
  }
  corrupt_byte(files[1], 200);  // inside record 0's payload: a payload CRC mismatch
  auto o = options(files, false);
  o.max_bad_fraction = 0.1;
  TFRecordSource skip(o);
  int64_t images = 0;
  for (const Batch& b : epoch(skip, 0)) images += b.images.size(0);
  EXPECT_EQ(images, 23);  // evaluation drops the record and counts nothing twice
  EXPECT_EQ(skip.bad_records(), 1);
  epoch(skip, 1);
  EXPECT_EQ(skip.bad_records(), 2);  // met again in the next epoch: the count runs on
  o.training = true;
  TFRecordSource train(o);
  for (const Batch& b : epoch(train, 0)) EXPECT_EQ(b.images.size(0), 4);  // kept full

  o.fail_on_bad_record = true;
  o.training = false;
  TFRecordSource fail(o);
  try {
    epoch(fail, 0);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(files[1] + " at byte 0"), std::string::npos) << message;
    EXPECT_NE(message.find("CRC"), std::string::npos) << message;
  }
  o.fail_on_bad_record = false;
  o.max_bad_fraction = 0.0;
  TFRecordSource too_many(o);
  EXPECT_THROW(epoch(too_many, 0), UserError);
}

TEST(TFRecordSource, LabelOutOfRangeAndUndecodableImagesAreBadRecords) {
  TempDir dir;
  const auto files = testing::write_dataset(dir, {10});
  auto o = options(files, false);
  o.num_classes = 5;  // stored labels go up to 10
  o.fail_on_bad_record = true;
  TFRecordSource source(o);
  try {
    epoch(source, 0);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("outside [0, num_classes = 5)"), std::string::npos)
        << e.what();
  }
  TempDir bad_dir;
  RecordWriter writer(bad_dir.file("train-0"));
  ImageExample e;
  e.encoded = "\xff\xd8\xff\xe0 not really a jpeg";
  e.label = 1;
  for (int i = 0; i < 4; ++i) writer.write(serialize_image_example(e));
  writer.write("not an example at all");
  writer.close();
  auto b = options({bad_dir.file("train-0")}, false);
  b.max_bad_fraction = 1.0;
  TFRecordSource skip_all(b);
  EXPECT_THROW(epoch(skip_all, 0), UserError);  // every record of a batch is bad: data damaged
}

TEST(TFRecordSource, TooLittleDataIsAClearError) {
  TempDir dir;
  const auto files = testing::write_dataset(dir, {3});
  auto o = options(files, true);
  EXPECT_THROW(TFRecordSource{o}, UserError);  // 3 records < one batch of 4
}

TEST(TFRecordSource, TrainingTakesEachEpochsScheduledSizeFromItsStart) {
  TempDir dir;
  const auto files = testing::write_dataset(dir, {20, 13, 7});
  auto o = options(files, true);
  TFRecordSource fixed(o);  // 32 px every epoch
  o.image_sizes = ImageSizeSchedule{32, 96, 0, 3, 32};
  TFRecordSource progressive(o);
  const std::vector<int64_t> expected = {32, 64, 64, 96};  // 53.3 and 74.7 px round to 64
  for (int64_t e = 0; e < 4; ++e)
    for (const Batch& b : epoch(progressive, e)) {
      const int64_t rows = b.labels.size(0), s = expected[e];
      EXPECT_EQ(b.images.sizes(), (std::vector<int64_t>{rows, s, s, 3})) << "epoch " << e;
      // A view of a buffer sized for the largest crop, whatever the epoch's (Note [Recycled
      // buffers]): no allocation when the size changes.
      EXPECT_EQ(b.images.storage().nbytes(), static_cast<size_t>(rows * 96 * 96 * 3));
    }
  // The same pictures as without a schedule at the same size.
  const auto a = epoch(fixed, 0), b = epoch(progressive, 0);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].images.equal(b[i].images)) << i;
  // Resumed 16 images into epoch 3: its size, and the batches the whole epoch had from there.
  const auto whole = epoch(progressive, 3);
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
    auto o = options(files, false);  // centre 48 of the shorter side resized to 56
    o.transform.image_size = 48;
    o.transform.val_resize = 56;
    TFRecordSource direct(o);
    EXPECT_TRUE(epoch(direct, 0).front().images.equal(v.images));
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
  auto o = options(files, true);
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
