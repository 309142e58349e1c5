#include "tests/fuzz/fuzz_input.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

namespace trainer::fuzz {
namespace {

std::set<std::string>& scratch_files() {
  static std::set<std::string> files;
  return files;
}

void remove_scratch_files() {
  for (const std::string& path : scratch_files()) std::remove(path.c_str());
}

}  // namespace

std::string scratch_path(const char* suffix) {
  static const std::string directory =
      std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
  const std::string path = directory + "/trainer-fuzz-" + std::to_string(::getpid()) + suffix;
  if (scratch_files().empty()) std::atexit(remove_scratch_files);
  scratch_files().insert(path);
  return path;
}

std::string write_input_file(std::string_view bytes, const char* suffix) {
  const std::string path = scratch_path(suffix);
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

}  // namespace trainer::fuzz
