// What the fuzz targets share: a reader that turns the fuzzer's bytes into the arguments of the
// code under test (sizes, magnitudes, choices) and leaves the rest as the data, and a check that
// stops the run on a broken property (an abort, which libFuzzer and the driver both report).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace trainer::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  // The next byte, or 0 when none is left (a short input still runs, with zero arguments).
  uint8_t byte() { return position_ < size_ ? data_[position_++] : 0; }
  // An integer in [lo, hi] from the next two bytes.
  int integer(int lo, int hi) {
    const int value = byte() << 8 | byte();
    return lo + value % (hi - lo + 1);
  }
  // A number in [lo, hi] from the next two bytes (65,536 steps).
  double number(double lo, double hi) {
    const int value = byte() << 8 | byte();
    return lo + (hi - lo) * value / 65535.0;
  }
  // What is left, as the data the code under test reads.
  std::string_view rest() const {
    return {reinterpret_cast<const char*>(data_) + position_, size_ - position_};
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t position_ = 0;
};

// A property of the code under test that the input broke: print it and abort.
[[noreturn]] inline void property_failed(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz property broken: %s: %s\n", what, detail.c_str());
  std::abort();
}
#define FUZZ_EXPECT(condition, detail)                                      \
  do {                                                                      \
    if (!(condition)) ::trainer::fuzz::property_failed(#condition, detail); \
  } while (0)

// A scratch file's path, one per process and suffix, in memory where the machine has /dev/shm;
// removed when the process exits.
std::string scratch_path(const char* suffix);

// A scratch file of the input's bytes, for readers that take a path.
std::string write_input_file(std::string_view bytes, const char* suffix);

}  // namespace trainer::fuzz
