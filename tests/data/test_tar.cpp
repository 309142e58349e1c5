// The tar reader's limits on what a header claims (found by tests/fuzz/fuzz_tar): every number
// fits an int64, and a long name or pax header is bounded before it is read whole.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "base/user_error.h"
#include "data/formats/tar/tar.h"

namespace trainer {
namespace {

// A 512-byte header of `type` for `name`, its size field as given, with a valid checksum.
std::string header(const std::string& name, const std::string& size_field, char type) {
  std::string block(512, '\0');
  std::memcpy(&block[0], name.data(), name.size());
  std::memcpy(&block[100], "0000644", 7);
  std::memcpy(&block[124], size_field.data(), size_field.size());
  block[156] = type;
  std::memcpy(&block[257], "ustar  ", 8);  // GNU
  std::memset(&block[148], ' ', 8);
  unsigned sum = 0;
  for (char c : block) sum += static_cast<unsigned char>(c);
  std::snprintf(&block[148], 8, "%06o", sum);
  return block;
}

std::string error_of(const std::string& archive) {
  try {
    list_tar(archive, "test.tar");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(Tar, NumbersPastAnInt64AreRefused) {
  // Base-256 (GNU): 11 bytes of value overflow 63 bits.
  std::string size(12, '\x30');
  size[0] = '\x80';
  const std::string error = error_of(header("a.JPEG", size, '0') + std::string(1024, '\0'));
  EXPECT_NE(error.find("the member at byte 0 claims -1 bytes"), std::string::npos) << error;
}

TEST(Tar, LongNamesOverTheLimitAreRefusedBeforeReading) {
  const int64_t claimed = (int64_t(1) << 20) + 1;  // inside the archive, over the 1 MiB limit
  char octal[12];
  std::snprintf(octal, sizeof(octal), "%011llo", static_cast<unsigned long long>(claimed));
  const std::string archive =
      header("././@LongLink", octal, 'L') + std::string(claimed + 1024, 'n');
  const std::string error = error_of(archive);
  EXPECT_NE(error.find("the long name or pax header at byte 0 claims 1048577 bytes, over the limit "
                       "of 1048576"),
            std::string::npos)
      << error;
  // A long name within the limit names the member after it.
  const std::string name(300, 'n');
  std::snprintf(octal, sizeof(octal), "%011o", 301u);
  std::string named = header("././@LongLink", octal, 'L') + name + std::string(512 - 300, '\0');
  named += header("short", "00000000003", '0') + "abc" + std::string(509 + 1024, '\0');
  const auto members = list_tar(named, "test.tar");
  ASSERT_EQ(members.size(), 1u);
  EXPECT_EQ(members[0].name, name);
  EXPECT_EQ(members[0].size, 3);
}

}  // namespace
}  // namespace trainer
