// A folder for one test's files under the system's temp directory: a fresh name, so runs side
// by side never share checkpoints, and removed at the end, so repeated runs do not fill the disk.
#pragma once

#include <filesystem>
#include <random>
#include <string>

namespace trainer::testing {

class TempDir {
 public:
  TempDir() {
    std::random_device random;
    path_ = std::filesystem::temp_directory_path() /
            ("trainer-test-" + std::to_string(random()) + std::to_string(random()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace trainer::testing
