// TFRecord framing, CRC32C, index files (written where no data glob sees them, built once per
// node), file listing and the Example parser.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "base/user_error.h"
#include "data/formats/tfrecord/crc32c.h"
#include "data/formats/tfrecord/file.h"
#include "data/formats/tfrecord/image_example.h"
#include "data/formats/tfrecord/index.h"
#include "data/formats/tfrecord/record.h"
#include "data/formats/tfrecord/record_layout.h"
#include "tests/support/tfrecord_test_util.h"

namespace trainer {
namespace {

using testing::TempDir;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
}

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the standard check value
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  // Continuation equals one pass; odd lengths exercise the byte tail.
  const std::string text = "The quick brown fox jumps over the lazy dog";
  EXPECT_EQ(crc32c(text.data() + 5, text.size() - 5, crc32c(text.data(), 5)),
            crc32c(text.data(), text.size()));
  EXPECT_EQ(mask_crc(0), 0xa282ead8u);
}

TEST(Record, FrameAndParseRoundTrip) {
  for (const std::string payload : {std::string(), std::string("x"), std::string(5000, 'a')}) {
    const std::string framed = frame_record(payload);
    ASSERT_EQ(framed.size(), payload.size() + kRecordOverhead);
    std::string_view out;
    int64_t size = 0;
    ASSERT_EQ(
        parse_record(reinterpret_cast<const uint8_t*>(framed.data()), framed.size(), &out, &size),
        RecordStatus::kOk);
    EXPECT_EQ(out, payload);
    EXPECT_EQ(size, static_cast<int64_t>(framed.size()));
  }
}

TEST(Record, DetectsEveryKindOfDamage) {
  const std::string good = frame_record("hello tfrecord");
  auto status = [](std::string bytes) {
    std::string_view out;
    int64_t size = 0;
    return parse_record(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &out, &size);
  };
  std::string bad_length = good, bad_length_crc = good, bad_payload = good, bad_crc = good;
  bad_length[0] ^= 1;
  bad_length_crc[9] ^= 1;
  bad_payload[14] ^= 1;
  bad_crc.back() ^= 1;
  EXPECT_EQ(status(bad_length), RecordStatus::kBadLengthCrc);
  EXPECT_EQ(status(bad_length_crc), RecordStatus::kBadLengthCrc);
  EXPECT_EQ(status(bad_payload), RecordStatus::kBadDataCrc);
  EXPECT_EQ(status(bad_crc), RecordStatus::kBadDataCrc);
  for (size_t cut : {size_t(0), size_t(5), size_t(12), good.size() - 1})
    EXPECT_EQ(status(good.substr(0, cut)), RecordStatus::kTruncated) << cut;
}

// A record header claiming `length` payload bytes (with its length CRC right), and no payload.
std::string record_header(uint64_t length) {
  std::string out(12, '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(length >> (8 * i));
  const uint32_t crc = mask_crc(crc32c(p, 8));
  for (int i = 0; i < 4; ++i) p[8 + i] = static_cast<uint8_t>(crc >> (8 * i));
  return out;
}

TEST(Record, LengthsOverTheLimitAreDamageNamedWithTheLimit) {
  for (uint64_t length : {uint64_t(kMaxRecordBytes) + 1, uint64_t(1) << 60}) {
    // Far more bytes in memory than the header needs, so only the limit can refuse it.
    const std::string bytes = record_header(length) + std::string(4096, 'x');
    const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
    std::string_view payload;
    int64_t size = 0;
    EXPECT_EQ(parse_record(data, bytes.size(), &payload, &size), RecordStatus::kTooLarge);
    const std::string reason = describe(RecordStatus::kTooLarge, data, bytes.size());
    EXPECT_NE(reason.find(std::to_string(length)), std::string::npos) << reason;
    EXPECT_NE(reason.find("limit of " + std::to_string(kMaxRecordBytes)), std::string::npos);
  }
  // At the limit the header is judged by the bytes present: truncated here, not too large.
  const std::string at_limit = record_header(kMaxRecordBytes) + std::string(100, 'x');
  std::string_view payload;
  int64_t size = 0;
  EXPECT_EQ(parse_record(reinterpret_cast<const uint8_t*>(at_limit.data()), at_limit.size(),
                         &payload, &size),
            RecordStatus::kTruncated);
}

TEST(Index, RecordOverTheLimitEndsTheScanAsDamage) {
  TempDir dir;
  const std::string good = frame_record("an intact record");
  // A sparse file: the claimed record lies within it, so only the limit stops a 64 MiB read.
  const std::string path = dir.file("data");
  write_file(path, good + record_header(uint64_t(kMaxRecordBytes) + 1));
  std::filesystem::resize_file(path, good.size() + kRecordOverhead + kMaxRecordBytes + 1);
  for (bool check_payload_crc : {false, true}) {
    const ScanResult scan = scan_tfrecord_file(path, check_payload_crc);
    ASSERT_EQ(scan.entries.size(), 1u);
    ASSERT_EQ(scan.bad.size(), 1u);
    EXPECT_EQ(scan.bad[0].offset, static_cast<int64_t>(good.size()));
    EXPECT_NE(scan.bad[0].reason.find("over the limit"), std::string::npos) << scan.bad[0].reason;
  }
}

TEST(Index, EntriesPastTheFileOrOverTheLimitAreNotTrusted) {
  TempDir dir;
  const auto files = testing::write_dataset(dir, {3});
  std::vector<BadRecord> bad;
  const auto entries = load_or_build_index(files[0], "", &bad);
  ASSERT_EQ(entries.size(), 3u);
  const std::string huge = "0 " + std::to_string(uint64_t(1) << 60) + "\n";
  const std::string past_end = "0 " + std::to_string(entries[0].size) + "\n" +
                               std::to_string(entries[0].size) + " 9223372036854775000\n";
  std::string too_many;  // more lines than a file of this size can have records
  for (int i = 0; i < 100000; ++i) too_many += "0 16\n";
  for (const std::string& index : {huge, past_end, too_many}) {
    write_file(files[0] + ".idx", index);
    EXPECT_EQ(load_or_build_index(files[0], "", &bad), entries);  // rebuilt from the data
  }
  EXPECT_TRUE(bad.empty());
}

TEST(Example, FieldLengthsPastThePayloadAreNotAnExample) {
  // A bytes field claiming 2^40 bytes inside a payload of a few: refused, nothing allocated.
  const std::string crafted = "\x0a" + testing::wire::varint(uint64_t(1) << 40) + "abc";
  ImageExample example;
  std::string error;
  EXPECT_FALSE(parse_image_example(crafted, &example, &error));
  EXPECT_EQ(error, "payload is not a tf.train.Example");
  ImageFeatureParser parser(feature_keys(RecordLayout::kTensorflow));
  std::string_view encoded;
  int64_t label = 0;
  EXPECT_FALSE(parser.parse(crafted, &encoded, &label, &error));
}

TEST(Index, WriterScanAndFileAgree) {
  TempDir dir;
  RecordWriter writer(dir.file("data"));
  for (int i = 0; i < 5; ++i) writer.write(std::string(100 * i + 1, char('a' + i)));
  writer.close();
  ScanResult scan = scan_tfrecord_file(dir.file("data"), /*check_payload_crc=*/true);
  EXPECT_TRUE(scan.bad.empty());
  EXPECT_EQ(scan.entries, writer.index());
  ASSERT_TRUE(write_index_file(dir.file("data.idx"), scan.entries));
  EXPECT_EQ(read_index_file(dir.file("data.idx")), writer.index());
  // DALI's format: "<offset> <size>" per line.
  EXPECT_EQ(read_file(dir.file("data.idx")).substr(0, 7), "0 17\n17");
}

TEST(Index, BuiltBesideDataOrInCacheAndRebuiltWhenStale) {
  TempDir dir;
  const auto files = testing::write_dataset(dir, {3});
  std::vector<BadRecord> bad;
  auto entries = load_or_build_index(files[0], dir.file("cache"), &bad);
  EXPECT_EQ(entries.size(), 3u);
  EXPECT_TRUE(std::filesystem::exists(files[0] + ".idx"));
  write_file(files[0] + ".idx", "0 17\n");  // stale: does not cover the file
  EXPECT_EQ(load_or_build_index(files[0], "", &bad).size(), 3u);
  write_file(files[0] + ".idx", "zero seventeen\n");
  EXPECT_THROW(load_or_build_index(files[0], "", &bad), UserError);
  EXPECT_TRUE(bad.empty());
  EXPECT_NE(cached_index_path(files[0], "/c"), cached_index_path(dir.file("other"), "/c"));
}

TEST(Index, TruncatedFileKeepsIntactRecordsAndReportsTheRest) {
  TempDir dir;
  const auto files = testing::write_dataset(dir, {4});
  const std::string bytes = read_file(files[0]);
  write_file(files[0], bytes.substr(0, bytes.size() - 10));
  std::vector<BadRecord> bad;
  const auto entries = load_or_build_index(files[0], dir.file("cache"), &bad);
  EXPECT_EQ(entries.size(), 3u);
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].offset, entries.back().offset + entries.back().size);
  EXPECT_EQ(bad[0].reason, "truncated record");
}

TEST(Index, FilesBeingWrittenNeverMatchTheDataGlob) {
  // One thread rewrites an index (as another rank may while this one lists the data); every
  // listing of `train-*` and of the folder must name the data files alone.
  TempDir dir;
  const auto files = testing::write_dataset(dir, {2, 1});
  const std::vector<IndexEntry> entries(100000, IndexEntry{0, 100});  // long to write
  std::atomic<bool> done{false};
  std::thread writer([&] {
    while (!done) write_index_file(files[0] + ".idx", entries);
  });
  const std::vector<std::string> sorted_files(files.begin(), files.end());
  for (int i = 0; i < 500; ++i) {
    ASSERT_EQ(list_tfrecord_files(dir.file("train-*"), "train_data"), sorted_files) << i;
    ASSERT_EQ(list_tfrecord_files(dir.path().string(), "train_data"), sorted_files) << i;
  }
  done = true;
  writer.join();
}

TEST(Index, RanksSplitTheScanningOfMissingIndexes) {
  // Two "ranks" of a node: each builds the indexes of its half of the files, then the other
  // half is there for it to read.
  TempDir dir;
  const auto files = testing::write_dataset(dir, {2, 3, 1, 2, 2});
  build_missing_indexes(files, "", /*share=*/1, /*shares=*/2, /*threads=*/2);
  for (size_t f = 0; f < files.size(); ++f)
    EXPECT_EQ(std::filesystem::exists(files[f] + ".idx"), f % 2 == 1) << files[f];
  build_missing_indexes(files, "", 0, 2, 1);
  std::vector<BadRecord> bad;
  for (size_t f = 0; f < files.size(); ++f)
    EXPECT_EQ(read_index_file(files[f] + ".idx"), load_or_build_index(files[f], "", &bad));
}

TEST(Files, GlobDirectoryAndClearErrors) {
  TempDir dir;
  testing::write_dataset(dir, {1, 1});
  write_file(dir.file("train-10000.idx"), "");
  EXPECT_EQ(list_tfrecord_files(dir.path().string(), "train_data").size(), 2u);
  EXPECT_EQ(list_tfrecord_files(dir.file("train-*"), "train_data").size(), 2u);
  std::filesystem::create_directories(dir.file("empty"));
  try {
    list_tfrecord_files(dir.file("empty"), "val_data");
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("val_data"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("empty directory"), std::string::npos) << e.what();
  }
  EXPECT_THROW(list_tfrecord_files(dir.file("validation-*"), "val_data"), UserError);
  EXPECT_THROW(list_tfrecord_files(dir.file("missing/"), "train_data"), UserError);
  EXPECT_THROW(list_tfrecord_files("", "train_data"), UserError);
}

// The layout of a dataset comes from the first record of its first non-empty file; a first
// record of neither layout is an error naming the file, what it holds, both layouts and the key.
TEST(RecordLayout, ResolvedFromTheFirstRecordOrNamedInTheError) {
  TempDir dir;
  write_file(dir.file("a-empty"), "");
  const auto tfds = testing::write_dataset(dir, {2}, 10, 48, /*tfds=*/true);
  EXPECT_EQ(resolve_record_layout(RecordLayout::kAuto, {dir.file("a-empty"), tfds[0]}, "k"),
            RecordLayout::kTfds);
  const auto tensorflow = testing::write_dataset(dir, {2});
  EXPECT_EQ(resolve_record_layout(RecordLayout::kAuto, tensorflow, "k"), RecordLayout::kTensorflow);
  // Asked for: taken as it is, nothing read.
  EXPECT_EQ(resolve_record_layout(RecordLayout::kTfds, {dir.file("missing")}, "k"),
            RecordLayout::kTfds);
  {
    RecordWriter writer(dir.file("other"));
    writer.write(testing::wire::example({{"jpeg", testing::wire::bytes_feature("x")},
                                         {"class_id", testing::wire::int64_feature(1)}}));
  }
  try {
    resolve_record_layout(RecordLayout::kAuto, {dir.file("other")}, "record_layout");
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    const std::string message = e.what();
    for (const std::string& part :
         {dir.file("other"), std::string("class_id (int64), jpeg (bytes)"),
          std::string("image/encoded + image/class/label"), std::string("image + label"),
          std::string("set record_layout = tensorflow or tfds")})
      EXPECT_NE(message.find(part), std::string::npos) << part << " not in: " << message;
  }
  // A first record with a damaged payload is stepped over (it is the reader's to skip or fail
  // on): the next record decides. A file whose framing breaks first leaves it to the next file.
  std::string bytes = read_file(tfds[0]);
  bytes[20] ^= 0x5a;
  write_file(dir.file("b-damaged"), bytes);
  write_file(dir.file("c-cut"), read_file(tensorflow[0]).substr(0, 30));
  EXPECT_EQ(resolve_record_layout(RecordLayout::kAuto, {dir.file("b-damaged")}, "k"),
            RecordLayout::kTfds);
  EXPECT_EQ(resolve_record_layout(RecordLayout::kAuto, {dir.file("c-cut"), tfds[0]}, "k"),
            RecordLayout::kTfds);
  try {
    resolve_record_layout(RecordLayout::kAuto, {dir.file("c-cut")}, "record_layout");
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(dir.file("c-cut") + " at byte 0: truncated record"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace trainer
