#include "data/formats/tar/tar.h"

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "base/user_error.h"

namespace trainer {
namespace {

constexpr int64_t kBlock = 512;
// The largest GNU long name or pax header read: a path is at most 4 KB on Linux, a pax header a
// few of its records; read whole, so bounded before anything of that size is allocated.
constexpr int64_t kMaxMetadataBytes = int64_t(1) << 20;

// A numeric header field: octal text, or (GNU, for values past 8 GB) base-256 big-endian when
// the first byte's high bit is set; -1 when it is neither, or past what an int64 holds.
int64_t header_number(const char* field, int length) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(field);
  int64_t value = 0;
  if (bytes[0] & 0x80) {
    for (int i = 1; i < length; ++i) {
      if (value > (INT64_MAX >> 8)) return -1;
      value = (value << 8) | bytes[i];
    }
    return value;
  }
  for (int i = 0; i < length && field[i] != '\0' && field[i] != ' '; ++i) {
    if (field[i] < '0' || field[i] > '7') return -1;
    value = value * 8 + (field[i] - '0');
  }
  return value;
}

bool checksum_matches(const char* header) {
  const int64_t stored = header_number(header + 148, 8);
  int64_t sum = 0;
  for (int i = 0; i < kBlock; ++i)
    sum += (i >= 148 && i < 156) ? ' ' : static_cast<unsigned char>(header[i]);
  return stored == sum;
}

std::string field_text(const char* field, size_t length) {
  return std::string(field, strnlen(field, length));
}

// The path a pax extended header sets ("<length> path=<value>\n" records), or "".
std::string pax_path(const std::string& records) {
  for (size_t at = 0; at < records.size();) {
    const size_t space = records.find(' ', at);
    if (space == std::string::npos) break;
    const int64_t length = std::atoll(records.c_str() + at);
    if (length <= 0 || at + length > records.size()) break;
    const std::string record = records.substr(space + 1, at + length - space - 2);
    if (record.rfind("path=", 0) == 0) return record.substr(5);
    at += length;
  }
  return "";
}

std::string read_exact(const ReadAt& read, int64_t offset, int64_t size, const std::string& what) {
  std::string out(size, '\0');
  USER_CHECK(read(offset, out.data(), size) == size, what, ": truncated at byte ", offset,
             " (a member runs past the end of the archive): an incomplete download?");
  return out;
}

}  // namespace

std::vector<TarMember> list_tar(const ReadAt& read, int64_t begin, int64_t end,
                                const std::string& what) {
  std::vector<TarMember> members;
  std::string long_name;  // set by a GNU 'L' entry or a pax 'x' header for the entry after it
  char header[kBlock];
  for (int64_t at = begin; at + kBlock <= end;) {
    if (read(at, header, kBlock) < kBlock) break;  // the data ends without end-of-archive blocks
    if (std::all_of(header, header + kBlock, [](char c) { return c == 0; })) break;
    USER_CHECK(checksum_matches(header), what, ": no valid tar header at byte ", at - begin,
               ": not a tar archive, or damaged there. Fix: download the file again");
    const int64_t size = header_number(header + 124, 12);
    USER_CHECK(size >= 0 && size <= end - at - kBlock, what, ": the member at byte ", at - begin,
               " claims ", size, " bytes, past the end of the archive: an incomplete download?");
    const char type = header[156];
    const int64_t data = at + kBlock;
    USER_CHECK((type != 'L' && type != 'x') || size <= kMaxMetadataBytes, what,
               ": the long name or pax header at byte ", at - begin, " claims ", size,
               " bytes, over the limit of ", kMaxMetadataBytes,
               ": the archive is damaged or crafted. Fix: download the file again");
    if (type == 'L') {
      long_name = read_exact(read, data, size, what).c_str();
    } else if (type == 'x') {
      long_name = pax_path(read_exact(read, data, size, what));
    } else {
      if (type == '0' || type == '\0' || type == '7') {  // regular files ('7': contiguous)
        std::string name = field_text(header, 100);
        const std::string prefix = field_text(header + 345, 155);
        if (std::memcmp(header + 257, "ustar", 5) == 0 && !prefix.empty())
          name = prefix + "/" + name;
        members.push_back({long_name.empty() ? name : long_name, data, size});
      }
      long_name.clear();
    }
    at = data + (size + kBlock - 1) / kBlock * kBlock;
  }
  return members;
}

std::vector<TarMember> list_tar(const std::string& bytes, const std::string& what) {
  const ReadAt read = [&bytes](int64_t offset, char* out, int64_t size) -> int64_t {
    const int64_t n = std::clamp<int64_t>(static_cast<int64_t>(bytes.size()) - offset, 0, size);
    std::memcpy(out, bytes.data() + offset, n);
    return n;
  };
  return list_tar(read, 0, static_cast<int64_t>(bytes.size()), what);
}

std::string read_gzip_file(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  USER_CHECK(file != nullptr, "cannot open '", path, "'");
  std::string out;
  char buffer[1 << 16];
  int n = 0;
  while ((n = gzread(file, buffer, sizeof(buffer))) > 0) out.append(buffer, n);
  int status = Z_OK;
  const char* message = gzerror(file, &status);
  const std::string error = status == Z_OK || status == Z_STREAM_END ? "" : message;
  gzclose(file);
  USER_CHECK(n == 0 && error.empty(), "cannot decompress '", path, "': ", error,
             ": an incomplete download?");
  return out;
}

}  // namespace trainer
