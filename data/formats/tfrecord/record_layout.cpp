#include "data/formats/tfrecord/record_layout.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "base/user_error.h"
#include "data/formats/tfrecord/file.h"
#include "data/formats/tfrecord/record.h"

namespace trainer {
namespace {

// Damaged records stepped over, at most, before the layout cannot be told: a few, so that
// detection stays cheap (one record read when the data is sound).
constexpr int kMostRecordsTried = 16;

// The payload of the first intact record of `file`, stepping over records whose payload is damaged
// but whose length is sound; nullopt when the file ends, its framing breaks or `tries` (records
// read, counted down) runs out first, with `damage` then saying where and why.
std::optional<std::string> first_intact_payload(const ReadFile& file, int* tries,
                                                std::string* damage) {
  std::vector<uint8_t> record;
  for (int64_t offset = 0; offset < file.size() && (*tries)-- > 0;) {
    uint8_t head[8] = {};
    file.read_at(offset, head, 8);
    uint64_t length = 0;  // little-endian
    for (int i = 7; i >= 0; --i) length = (length << 8) | head[i];
    // Bounded by the file and kMaxRecordBytes, so that a damaged length sizes no huge read;
    // parse_record judges it (kTooLarge from the header alone).
    const auto left = static_cast<uint64_t>(file.size() - offset);
    const uint64_t most = std::min(length, static_cast<uint64_t>(kMaxRecordBytes));
    record.resize(static_cast<size_t>(std::min(left, std::min(most, left) + kRecordOverhead)));
    const int64_t got = file.read_at(offset, record.data(), static_cast<int64_t>(record.size()));
    std::string_view payload;
    int64_t size = 0;
    const RecordStatus status = parse_record(record.data(), got, &payload, &size);
    if (status == RecordStatus::kOk) return std::string(payload);
    *damage = detail::concat(file.path(), " at byte ", offset, ": ",
                             describe(status, record.data(), got));
    if (status != RecordStatus::kBadDataCrc) return std::nullopt;  // no sound length to step on
    offset += static_cast<int64_t>(length) + kRecordOverhead;
  }
  return std::nullopt;
}

}  // namespace

RecordLayout resolve_record_layout(RecordLayout requested, const std::vector<std::string>& files,
                                   const std::string& key) {
  if (requested != RecordLayout::kAuto) return requested;
  int tries = kMostRecordsTried;
  std::string damage;
  for (size_t f = 0; f < files.size() && tries > 0; ++f) {
    const std::optional<std::string> payload =
        first_intact_payload(ReadFile(files[f]), &tries, &damage);
    if (!payload) continue;  // an empty or damaged file: the next one's first record decides
    std::string features;
    const RecordLayout layout = detect_record_layout(*payload, &features);
    USER_CHECK(layout != RecordLayout::kAuto,
               "cannot tell the layout of the TFRecords: the first intact record of ", files[f],
               " holds the features ", features,
               "; expected TensorFlow's layout (image/encoded + image/class/label, as "
               "build_imagenet_data.py and make-tfrecords write) or TFDS's (image + label, as "
               "TensorFlow Datasets' imagenet2012). Fix: set ",
               key, " = tensorflow or tfds to read them as one of these, or convert the records");
    return layout;
  }
  USER_CHECK(damage.empty(), "cannot tell the layout of the TFRecords: no intact record among ",
             "the first ones read (", damage, "). Fix: set ", key,
             " to the records' layout (tensorflow or tfds), or repair the data (verify-tfrecords)");
  // No record at all: nothing to read in either layout, and the source reports the empty data.
  return RecordLayout::kTensorflow;
}

}  // namespace trainer
