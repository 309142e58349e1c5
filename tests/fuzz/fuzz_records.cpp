// The TFRecord framing three ways: parse_record walking the bytes in memory (the reader), the
// index scanner reading them as a file in both modes, and the index file's own parser, on the
// input read as an index and on the walk's entries written and read back.
#include <string>
#include <vector>

#include "base/user_error.h"
#include "data/formats/tfrecord/index.h"
#include "data/formats/tfrecord/record.h"
#include "tests/fuzz/fuzz_input.h"

namespace trainer::fuzz {
namespace {

std::string entries_text(const std::vector<IndexEntry>& entries) {
  std::string text;
  for (const auto& e : entries)
    text += std::to_string(e.offset) + "+" + std::to_string(e.size) + " ";
  return text;
}

// The records parse_record finds from the start, up to the first it rejects.
std::vector<IndexEntry> walk_records(const uint8_t* data, int64_t size) {
  std::vector<IndexEntry> entries;
  for (int64_t offset = 0; offset < size;) {
    std::string_view payload;
    int64_t record_size = 0;
    const RecordStatus status = parse_record(data + offset, size - offset, &payload, &record_size);
    if (status != RecordStatus::kOk) {
      describe(status, data + offset, size - offset);  // the damage message reads the header too
      break;
    }
    FUZZ_EXPECT(record_size == int64_t(payload.size()) + kRecordOverhead, entries_text(entries));
    entries.push_back({offset, record_size});
    offset += record_size;
  }
  return entries;
}

}  // namespace
}  // namespace trainer::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainer;
  using namespace trainer::fuzz;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const std::vector<IndexEntry> walked = walk_records(data, static_cast<int64_t>(size));

  const std::string path = write_input_file(bytes, ".tfrecord");
  const ScanResult full = scan_tfrecord_file(path, /*check_payload_crc=*/true);
  FUZZ_EXPECT(full.entries == walked,
              "scan " + entries_text(full.entries) + "walk " + entries_text(walked));
  FUZZ_EXPECT(
      full.bad.empty() ==
          (walked.empty() ? size == 0 : walked.back().offset + walked.back().size == int64_t(size)),
      "damage reported where the walk found none, or the reverse");
  // Framing alone accepts what the payload check accepts, and maybe more after it.
  const ScanResult framing = scan_tfrecord_file(path, /*check_payload_crc=*/false);
  FUZZ_EXPECT(framing.entries.size() >= walked.size() &&
                  std::equal(walked.begin(), walked.end(), framing.entries.begin()),
              "framing " + entries_text(framing.entries) + "walk " + entries_text(walked));

  try {  // the input as an index file: read or refused with a UserError, never more
    read_index_file(path, /*most_entries=*/1000);
  } catch (const UserError&) {
  }
  const std::string index_path = scratch_path(".tfrecord.idx");
  if (write_index_file(index_path, walked))
    FUZZ_EXPECT(read_index_file(index_path) == walked, "index round trip");
  return 0;
}
