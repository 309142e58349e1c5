#include "data/formats/tfrecord/record.h"

#include <cerrno>
#include <cstring>

#include "base/user_error.h"
#include "data/formats/tfrecord/crc32c.h"

namespace trainer {
namespace {

uint64_t load_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];  // little-endian on every host
  return v;
}

uint32_t load_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

void store_le(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

}  // namespace

const char* to_string(RecordStatus status) {
  switch (status) {
    case RecordStatus::kOk:
      return "ok";
    case RecordStatus::kTruncated:
      return "truncated record";
    case RecordStatus::kBadLengthCrc:
      return "bad length CRC";
    case RecordStatus::kBadDataCrc:
      return "bad payload CRC";
    case RecordStatus::kSizeMismatch:
      return "record size differs from the index";
    case RecordStatus::kTooLarge:
      return "record length over the limit";
  }
  return "unknown";
}

std::string describe(RecordStatus status, const uint8_t* data, int64_t available) {
  if (status != RecordStatus::kTooLarge || available < 8) return to_string(status);
  return detail::concat("record length ", load_u64(data), " bytes is over the limit of ",
                        kMaxRecordBytes, " (a record holds one image)");
}

RecordStatus parse_record(const uint8_t* data, int64_t available, std::string_view* payload,
                          int64_t* record_size) {
  if (available < 12) return RecordStatus::kTruncated;
  const uint64_t length = load_u64(data);
  if (mask_crc(crc32c(data, 8)) != load_u32(data + 8)) return RecordStatus::kBadLengthCrc;
  if (length > static_cast<uint64_t>(kMaxRecordBytes)) return RecordStatus::kTooLarge;
  // Compare without overflow: a corrupt length passing its CRC is near impossible, but a huge
  // one must still not wrap around.
  if (available < kRecordOverhead || length > static_cast<uint64_t>(available - kRecordOverhead))
    return RecordStatus::kTruncated;
  const uint8_t* body = data + 12;
  if (mask_crc(crc32c(body, length)) != load_u32(body + length)) return RecordStatus::kBadDataCrc;
  *payload = std::string_view(reinterpret_cast<const char*>(body), length);
  *record_size = static_cast<int64_t>(length) + kRecordOverhead;
  return RecordStatus::kOk;
}

std::string frame_record(std::string_view payload) {
  std::string out(payload.size() + kRecordOverhead, '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  store_le(p, payload.size(), 8);
  store_le(p + 8, mask_crc(crc32c(p, 8)), 4);
  std::memcpy(p + 12, payload.data(), payload.size());
  store_le(p + 12 + payload.size(), mask_crc(crc32c(payload.data(), payload.size())), 4);
  return out;
}

RecordWriter::RecordWriter(const std::string& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "wb");
  USER_CHECK(file_ != nullptr, "cannot create '", path, "': ", std::strerror(errno));
}

RecordWriter::~RecordWriter() {
  if (file_) std::fclose(file_);
}

void RecordWriter::write(std::string_view payload) {
  const std::string framed = frame_record(payload);
  USER_CHECK(std::fwrite(framed.data(), 1, framed.size(), file_) == framed.size(), "write to '",
             path_, "' failed: ", std::strerror(errno), " (disk full?)");
  index_.push_back({offset_, static_cast<int64_t>(framed.size())});
  offset_ += static_cast<int64_t>(framed.size());
}

void RecordWriter::close() {
  if (!file_) return;
  const bool ok = std::fclose(file_) == 0;
  file_ = nullptr;
  USER_CHECK(ok, "closing '", path_, "' failed: ", std::strerror(errno));
}

}  // namespace trainer
