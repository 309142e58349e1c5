// The crop-aware image decoder on any bytes as a record's image (JPEG through libjpeg-turbo's crop
// and DCT scaling, PNG through OpenCV, anything else refused), with any crop (inside, across or
// outside the image) and any output size, and the full decode the verifier uses. The first 10 bytes choose the crop and
// the output; the rest is the image.
#include <opencv2/core.hpp>
#include <vector>

#include "data/formats/jpeg/decode.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainer;
  fuzz::FuzzInput input(data, size);
  const int out_width = input.integer(1, 96), out_height = input.integer(1, 96);
  const bool fractions = input.byte() % 2 == 0;  // a crop in the image, or any rectangle
  const uint8_t x = input.byte(), y = input.byte(), w = input.byte(), h = input.byte();
  const std::string_view image = input.rest();

  ImageSize header;
  std::string error;
  const bool has_size = encoded_image_size(image, &header, &error);
  if (has_size) {
    FUZZ_EXPECT(header.width > 0 && header.height > 0 &&
                    int64_t(header.width) * header.height <= kMaxImagePixels,
                std::to_string(header.width) + "x" + std::to_string(header.height));
  }
  bool chosen = false;
  auto choose = [&](ImageSize size) {
    chosen = true;
    if (has_size)
      FUZZ_EXPECT(size.width == header.width && size.height == header.height, "size changed");
    if (!fractions) return CropRect{x - 128, y - 128, w * 64, h * 64};
    return CropRect{size.width * x / 256, size.height * y / 256, 1 + (size.width - 1) * w / 255,
                    1 + (size.height - 1) * h / 255};
  };
  std::vector<uint8_t> out(size_t(out_width) * out_height * 3);
  int scale = 0;
  if (decode_crop_resize(image, choose, out_width, out_height, out.data(), &error, &scale)) {
    FUZZ_EXPECT(chosen && has_size, "decoded an image whose size was never read");
    FUZZ_EXPECT(scale >= 1 && scale <= 8, std::to_string(scale));
  } else {
    FUZZ_EXPECT(!error.empty(), "a failure without a message");
  }
  cv::Mat rgb;
  if (decode_full(image, &rgb, &error))
    FUZZ_EXPECT(rgb.type() == CV_8UC3 && rgb.cols > 0 && rgb.rows > 0, "full decode's shape");
  return 0;
}
