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
#include "tests/support/tfrecord_source_util.h"

namespace trainer {
namespace {

using testing::TempDir;

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
  auto o = testing::source_options(files, true);
  TFRecordSource one(o);
  o.decode_threads = 3;
  o.reader_threads = 3;
  o.prefetch_batches = 1;
  TFRecordSource many(o);
  ASSERT_EQ(one.batches_left(), 10);
  const auto a = testing::epoch_batches(one, 0), b = testing::epoch_batches(many, 0),
             c = testing::epoch_batches(one, 1);
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
    auto o = testing::source_options(files, true);
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
      auto o = testing::source_options(files, true);
      o.rank = rank;
      o.world_size = world;
      TFRecordSource train(o);
      EXPECT_EQ(train.batches_left(), (30 + 4 * world - 1) / (4 * world));  // last step short
      o.training = false;
      TFRecordSource val(o);
      for (const Batch& b : testing::epoch_batches(val, 0)) {
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
      auto o = testing::source_options(files, true);
      o.rank = rank;
      o.world_size = 4;
      TFRecordSource train(o);
      std::vector<int64_t> rows;
      for (const Batch& b : testing::epoch_batches(train, 0)) {
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
            auto o = testing::source_options(datasets[records], true);
            o.batch_size = batch;
            o.rank = rank;
            o.world_size = world;
            o.prefetch_batches = prefetch;
            o.wait_timeout = std::chrono::seconds(20);  // a hang fails the test, not ctest
            TFRecordSource train(o);
            for (const Batch& b : testing::epoch_batches(train, 0))
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
  auto o = testing::source_options(files, false);
  o.label_offset = 0;
  o.num_classes = 11;
  TFRecordSource source(o);
  const auto batches = testing::epoch_batches(source, 0);
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
    TFRecordSource tf(testing::source_options(tf_files, training)),
        tfds(testing::source_options(tfds_files, training));
    const auto a = testing::epoch_batches(tf, 0), b = testing::epoch_batches(tfds, 0);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(a[i].images.equal(b[i].images)) << "batch " << i;
      EXPECT_TRUE(a[i].labels.equal(b[i].labels)) << "batch " << i;
    }
    EXPECT_EQ(tfds.bad_records(), 0);
  }
  auto o = testing::source_options(tfds_files, false);
  o.label_offset = 0;  // explicit, and the layout's own
  o.record_layout = RecordLayout::kTfds;
  TFRecordSource named(o);
  EXPECT_EQ(testing::epoch_batches(named, 0)[0].labels[0].item<int64_t>(),
            0);  // record 0: stored label 0
  o.record_layout = RecordLayout::kTensorflow;
  o.fail_on_bad_record = true;
  TFRecordSource wrong(o);
  try {
    testing::epoch_batches(wrong, 0);
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
    TFRecordSource build_indexes(testing::source_options(files, false));  // writes the .idx files
  }
  corrupt_byte(files[1], 200);  // inside record 0's payload: a payload CRC mismatch
  auto o = testing::source_options(files, false);
  o.max_bad_fraction = 0.1;
  TFRecordSource skip(o);
  int64_t images = 0;
  for (const Batch& b : testing::epoch_batches(skip, 0)) images += b.images.size(0);
  EXPECT_EQ(images, 23);  // evaluation drops the record and counts nothing twice
  EXPECT_EQ(skip.bad_records(), 1);
  testing::epoch_batches(skip, 1);
  EXPECT_EQ(skip.bad_records(), 2);  // met again in the next epoch: the count runs on
  o.training = true;
  TFRecordSource train(o);
  for (const Batch& b : testing::epoch_batches(train, 0))
    EXPECT_EQ(b.images.size(0), 4);  // kept full

  o.fail_on_bad_record = true;
  o.training = false;
  TFRecordSource fail(o);
  try {
    testing::epoch_batches(fail, 0);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(files[1] + " at byte 0"), std::string::npos) << message;
    EXPECT_NE(message.find("CRC"), std::string::npos) << message;
  }
  o.fail_on_bad_record = false;
  o.max_bad_fraction = 0.0;
  TFRecordSource too_many(o);
  EXPECT_THROW(testing::epoch_batches(too_many, 0), UserError);
}

TEST(TFRecordSource, LabelOutOfRangeAndUndecodableImagesAreBadRecords) {
  TempDir dir;
  const auto files = testing::write_dataset(dir, {10});
  auto o = testing::source_options(files, false);
  o.num_classes = 5;  // stored labels go up to 10
  o.fail_on_bad_record = true;
  TFRecordSource source(o);
  try {
    testing::epoch_batches(source, 0);
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
  auto b = testing::source_options({bad_dir.file("train-0")}, false);
  b.max_bad_fraction = 1.0;
  TFRecordSource skip_all(b);
  EXPECT_THROW(testing::epoch_batches(skip_all, 0),
               UserError);  // every record of a batch is bad: data damaged
}

TEST(TFRecordSource, TooLittleDataIsAClearError) {
  TempDir dir;
  const auto files = testing::write_dataset(dir, {3});
  auto o = testing::source_options(files, true);
  EXPECT_THROW(TFRecordSource{o}, UserError);  // 3 records < one batch of 4
}

}  // namespace
}  // namespace trainer
