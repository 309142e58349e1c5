// The tar reader of the ImageNet converter (ustar, GNU long names, pax headers): any bytes are
// listed or refused with a UserError naming the offset, and every member listed lies inside
// the archive's bytes.
#include <string>

#include "base/user_error.h"
#include "data/formats/tar/tar.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainer;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    for (const TarMember& member : list_tar(bytes, "fuzz input"))
      FUZZ_EXPECT(
          member.offset >= 0 && member.size >= 0 && member.offset + member.size <= int64_t(size),
          member.name + " at " + std::to_string(member.offset) + " size " +
              std::to_string(member.size));
  } catch (const UserError&) {
  }
  return 0;
}
