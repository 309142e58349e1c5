// TFRecord framing: uint64 length (LE), masked CRC32C of the length, payload, masked CRC32C of
// the payload. Parsing from memory (the reader hands it large buffers) and writing, with the
// DALI-style index entry (offset, size including the 16 framing bytes) of each record written.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace trainer {

constexpr int64_t kRecordOverhead = 16;  // 8 length + 4 length CRC + 4 payload CRC bytes
// The longest payload read: a record holds one image, and ImageNet's largest is ~15 MB; a larger
// length is damage or a crafted file, reported before anything of that size is allocated.
constexpr int64_t kMaxRecordBytes = int64_t(64) << 20;

enum class RecordStatus { kOk, kTruncated, kBadLengthCrc, kBadDataCrc, kSizeMismatch, kTooLarge };
const char* to_string(RecordStatus status);
// The damage reason of `status` for the record at `data` (`available` bytes in memory): its
// to_string, with the length and the limit for kTooLarge.
std::string describe(RecordStatus status, const uint8_t* data, int64_t available);

// Parses the record starting at `data`, of which `available` bytes are in memory. On kOk,
// `payload` views the payload and `record_size` is its framed size. A length over
// kMaxRecordBytes is kTooLarge, judged from the 12 header bytes alone.
RecordStatus parse_record(const uint8_t* data, int64_t available, std::string_view* payload,
                          int64_t* record_size);

// The framed bytes of one record.
std::string frame_record(std::string_view payload);

struct IndexEntry {
  int64_t offset = 0;  // byte offset of the record's length field in its file
  int64_t size = 0;    // framed size: payload + kRecordOverhead
  bool operator==(const IndexEntry& o) const { return offset == o.offset && size == o.size; }
};

// Writes records to a file and remembers their index entries. Throws UserError on I/O errors.
class RecordWriter {
 public:
  explicit RecordWriter(const std::string& path);
  ~RecordWriter();
  RecordWriter(const RecordWriter&) = delete;
  RecordWriter& operator=(const RecordWriter&) = delete;
  void write(std::string_view payload);
  void close();  // flushes; also done by the destructor (which cannot report errors)
  const std::vector<IndexEntry>& index() const { return index_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  int64_t offset_ = 0;
  std::vector<IndexEntry> index_;
};

}  // namespace trainer
