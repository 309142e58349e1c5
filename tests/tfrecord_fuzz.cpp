// Fuzz target over the TFRecord record reader, the index scanner and the Example parser, and a
// driver that runs it without libFuzzer (the build uses g++): random inputs and mutations of
// valid records for a given number of seconds (argv[1], default 3). Built with clang and
// -fsanitize=fuzzer -DTFRECORD_LIBFUZZER, the same entry point runs under libFuzzer.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>

#include "data/formats/tfrecord/image_example.h"
#include "data/formats/tfrecord/index.h"
#include "data/formats/tfrecord/record.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainer;
  int64_t offset = 0;
  while (offset < static_cast<int64_t>(size)) {  // walk the records as the reader does
    std::string_view payload;
    int64_t record_size = 0;
    if (parse_record(data + offset, static_cast<int64_t>(size) - offset, &payload, &record_size) !=
        RecordStatus::kOk)
      break;
    ImageExample example;
    std::string error;
    parse_image_example(payload, &example, &error);
    parse_image_example(payload, &example, &error, RecordLayout::kTfds);
    detect_record_layout(payload, &error);
    // Reused, as in training: no state may leak between records.
    static ImageFeatureParser parser(feature_keys(RecordLayout::kTensorflow));
    std::string_view encoded;
    int64_t label = 0;
    parser.parse(payload, &encoded, &label, &error);
    offset += record_size;
  }
  ImageExample example;
  std::string error;
  parse_image_example(std::string_view(reinterpret_cast<const char*>(data), size), &example,
                      &error);
  return 0;
}

#ifndef TFRECORD_LIBFUZZER
int main(int argc, char** argv) {
  using namespace trainer;
  const double seconds = argc > 1 ? std::atof(argv[1]) : 3.0;
  std::mt19937_64 rng(1234);
  ImageExample e;
  e.encoded = std::string(300, '\xab');
  e.label = 7;
  e.filename = "seed.JPEG";
  const std::string valid = frame_record(serialize_image_example(e)) + frame_record("x");
  const std::string scan_path = "/tmp/tfrecord_fuzz." + std::to_string(::getpid());
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int64_t runs = 0;
  while (std::chrono::steady_clock::now() < end) {
    std::string input;
    if (rng() % 4 == 0) {  // random bytes
      input.resize(rng() % 512);
      for (char& c : input) c = static_cast<char>(rng());
    } else {  // a valid stream with a few bytes flipped, cut or lengths rewritten
      input = valid;
      for (int k = 1 + rng() % 4; k > 0; --k) input[rng() % input.size()] = char(rng());
      if (rng() % 3 == 0) input.resize(rng() % input.size());
    }
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
    if (runs % 64 == 0) {  // the index scanner reads files: give it some inputs too
      std::ofstream(scan_path, std::ios::binary).write(input.data(), input.size());
      scan_tfrecord_file(scan_path, rng() % 2 == 0);
    }
    ++runs;
  }
  std::remove(scan_path.c_str());
  std::printf("%lld inputs without a crash\n", static_cast<long long>(runs));
  return 0;
}
#endif
