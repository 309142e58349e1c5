#include "tests/fuzz/fuzz_input.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

namespace trainer::fuzz {
namespace {

std::set<std::string>& files_written() {
  static std::set<std::string> files;
  return files;
}

void remove_files_written() {
  for (const std::string& path : files_written()) std::remove(path.c_str());
}

}  // namespace

std::string write_input_file(std::string_view bytes, const char* suffix) {
  static const std::string directory =
      std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
  const std::string path = directory + "/trainer-fuzz-" + std::to_string(::getpid()) + suffix;
  if (files_written().empty()) std::atexit(remove_files_written);
  files_written().insert(path);
  files_written().insert(path + ".idx");  // fuzz_records writes the index beside it
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

}  // namespace trainer::fuzz
