// Tar archives read in place: the regular files of an archive found by reading only its headers,
// each as an offset and a size in the archive's file, so a converter reads any image straight
// from ImageNet's tars (a tar inside a tar too) in any order, without unpacking them to disk.
// libarchive reads archives as streams and does not give a member's data offset, which random
// access needs; the format itself (POSIX ustar, with GNU long names and pax headers) is simple.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace trainer {

struct TarMember {
  std::string name;    // path inside the archive, as stored (e.g. "n01440764_10026.JPEG")
  int64_t offset = 0;  // where its bytes start, in the same coordinates as `begin` below
  int64_t size = 0;
};

// Reads up to `size` bytes at `offset` into `out`; returns the bytes read (fewer only at the end).
using ReadAt = std::function<int64_t(int64_t offset, char* out, int64_t size)>;

// The regular files of the tar archive occupying [begin, end) of what `read` reads (end may lie
// past the data: the archive ends at its end-of-archive blocks or at the end of the data).
// Directories, links and other entries are skipped. A damaged header (bad checksum, a member
// running past the end) is a UserError naming `what` and the byte offset.
std::vector<TarMember> list_tar(const ReadAt& read, int64_t begin, int64_t end,
                                const std::string& what);

// The same, for an archive held in memory (e.g. a decompressed .tar.gz).
std::vector<TarMember> list_tar(const std::string& bytes, const std::string& what);

// The whole content of a gzip-compressed file (e.g. the ImageNet devkit's .tar.gz); a file that
// is not gzip-compressed is returned as it is.
std::string read_gzip_file(const std::string& path);

}  // namespace trainer
