// Crop-aware JPEG decoding against full decode + the same crop, the evaluation centre crop,
// colour conversions (grayscale, CMYK, PNG) and RandomResizedCrop's parameters.
#include <gtest/gtest.h>
#include <jpeglib.h>

#include <cmath>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <set>
#include <tuple>
#include <vector>

#include "data/formats/jpeg/decode.h"
#include "data/transforms/augment.h"

namespace trainer {
namespace {

// A smooth RGB test picture (gradients and low-frequency waves) with a sharp marker square.
cv::Mat smooth_image(int w, int h) {
  cv::Mat rgb(h, w, CV_8UC3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      auto& p = rgb.at<cv::Vec3b>(y, x);
      p[0] = cv::saturate_cast<uint8_t>(255.0 * x / w);
      p[1] = cv::saturate_cast<uint8_t>(255.0 * y / h);
      p[2] = cv::saturate_cast<uint8_t>(128 + 100 * std::sin(x * 0.05) * std::cos(y * 0.04));
    }
  return rgb;
}

std::string encode(const cv::Mat& rgb, const char* ext = ".jpg", int quality = 95) {
  cv::Mat bgr;
  cv::cvtColor(rgb, bgr, cv::COLOR_RGB2BGR);
  std::vector<uint8_t> out;
  cv::imencode(ext, bgr, out, {cv::IMWRITE_JPEG_QUALITY, quality});
  return std::string(out.begin(), out.end());
}

double mean_abs_diff(const cv::Mat& a, const cv::Mat& b) {
  cv::Mat diff;
  cv::absdiff(a, b, diff);
  const cv::Scalar m = cv::mean(diff);
  return (m[0] + m[1] + m[2]) / 3;
}

// Reference: full decode, crop, area resize (what a decoder without cropping would do).
cv::Mat reference(const std::string& jpeg, const CropRect& c, int size) {
  cv::Mat full, out;
  std::string error;
  EXPECT_TRUE(decode_full(jpeg, &full, &error)) << error;
  cv::resize(full(cv::Rect(c.x, c.y, c.width, c.height)), out, cv::Size(size, size), 0, 0,
             cv::INTER_AREA);
  return out;
}

TEST(CropDecode, MatchesFullDecodeAndCropAtEveryDctScale) {
  const std::string jpeg = encode(smooth_image(500, 375));
  const std::vector<CropRect> crops = {
      {0, 0, 500, 375}, {13, 29, 301, 222},  {250, 100, 180, 200},
      {3, 5, 90, 80},   {400, 300, 100, 75}, {10, 100, 480, 200}};  // > 2x wide after DCT scaling
  std::set<int> scales;
  for (int size : {64, 40, 150}) {
    for (const CropRect& c : crops) {
      cv::Mat out(size, size, CV_8UC3);
      std::string error;
      int scale = 0;
      ASSERT_TRUE(decode_crop_resize(jpeg, c, size, size, out.data, &error, &scale)) << error;
      scales.insert(scale);
      EXPECT_LT(mean_abs_diff(out, reference(jpeg, c, size)), 3.0)
          << c.x << "," << c.y << " " << c.width << "x" << c.height << " to " << size
          << " at scale " << scale << "/8";
    }
  }
  EXPECT_GE(scales.size(), 3u);  // several DCT scales were exercised, 1/8 included
  EXPECT_TRUE(scales.count(1));
}

TEST(CropDecode, ValidationCentreCropIsExactInSizeAndCentred) {
  const std::string jpeg = encode(smooth_image(500, 375), ".png");  // lossless: exact centre
  cv::Mat out(224, 224, CV_8UC3);
  std::string error;
  TransformOptions val;
  val.training = false;
  ASSERT_TRUE(transform_image(jpeg, val, 0, out.data, &error)) << error;
  // Reference: shorter side to 256 (333x256), centre 224.
  cv::Mat full, resized;
  ASSERT_TRUE(decode_full(jpeg, &full, &error));
  cv::resize(full, resized, cv::Size(341, 256), 0, 0, cv::INTER_AREA);
  const cv::Mat centre = resized(cv::Rect((341 - 224) / 2, (256 - 224) / 2, 224, 224));
  EXPECT_LT(mean_abs_diff(out, centre), 2.0);
  const CropRect region = centre_crop_region({500, 375}, 256, 224);
  EXPECT_EQ(region.height, 328);  // 375 * 224 / 256
  EXPECT_EQ(region.width, 328);
  EXPECT_EQ(region.x, (500 - 328) / 2);
  EXPECT_EQ(region.y, (375 - 328) / 2);
}

// Training flips half the samples: the same crop, mirrored left to right, pixel for pixel.
TEST(CropDecode, TrainingFlipMirrorsTheSameCrop) {
  const std::string jpeg = encode(smooth_image(400, 300));
  TransformOptions train;
  train.image_size = 48;
  train.crop = {1.0, 1.0, 4.0 / 3.0,
                4.0 / 3.0};  // the whole image every time: only the flip varies
  cv::Mat first(48, 48, CV_8UC3), out(48, 48, CV_8UC3);
  std::string error;
  ASSERT_TRUE(transform_image(jpeg, train, 0, first.data, &error)) << error;
  int same = 0, mirrored = 0;
  for (uint64_t seed = 1; seed < 40; ++seed) {
    ASSERT_TRUE(transform_image(jpeg, train, seed, out.data, &error)) << error;
    bool equal = true, mirror = true;
    for (int y = 0; y < 48; ++y)
      for (int x = 0; x < 48; ++x) {
        equal &= out.at<cv::Vec3b>(y, x) == first.at<cv::Vec3b>(y, x);
        mirror &= out.at<cv::Vec3b>(y, x) == first.at<cv::Vec3b>(y, 47 - x);
      }
    ASSERT_TRUE(equal || mirror) << "seed " << seed;
    same += equal;
    mirrored += mirror;
  }
  EXPECT_GT(same, 5);  // both happen, about half each
  EXPECT_GT(mirrored, 5);
}

// Records are decoded as JPEG or PNG; the converter also reads the other formats torchvision's
// ImageFolder reads (and writes them as JPEG). OpenCV's other decoders (Radiance HDR writes the
// bytes to a temporary file first) are reached by neither.
TEST(CropDecode, OpenCvDecodesPngForRecordsAndImageFolderFormatsForTheConverter) {
  const cv::Mat rgb = smooth_image(24, 16);
  cv::Mat out(8, 8, CV_8UC3), full;
  std::string error;
  EXPECT_TRUE(decode_crop_resize(encode(rgb, ".png"), {0, 0, 24, 16}, 8, 8, out.data, &error))
      << error;
  for (const char* ext : {".bmp", ".tiff", ".webp", ".ppm"}) {
    const std::string encoded = encode(rgb, ext);
    ASSERT_FALSE(encoded.empty()) << ext;
    EXPECT_FALSE(decode_crop_resize(encoded, {0, 0, 24, 16}, 8, 8, out.data, &error)) << ext;
    EXPECT_NE(error.find("image is neither JPEG nor PNG (it begins "), std::string::npos) << error;
    EXPECT_TRUE(decode_full(encoded, &full, &error, ImageFormats::kImageFolder))
        << ext << ": " << error;
    EXPECT_EQ(full.cols, 24) << ext;
  }
  const std::string hdr = encode(rgb, ".hdr");
  ASSERT_FALSE(hdr.empty());
  EXPECT_FALSE(decode_full(hdr, &full, &error, ImageFormats::kImageFolder));
  EXPECT_NE(error.find("is not JPEG, PNG, BMP, TIFF, WebP or PPM/PGM (it begins 23 3f 52 41"),
            std::string::npos)
      << error;
  EXPECT_FALSE(decode_crop_resize("", {0, 0, 1, 1}, 8, 8, out.data, &error));
  EXPECT_NE(error.find("(it begins (no bytes))"), std::string::npos) << error;
}

TEST(CropDecode, GrayscaleCmykAndPngBecomeRgb) {
  std::string error;
  cv::Mat gray(40, 60, CV_8UC1, cv::Scalar(90));
  std::vector<uint8_t> bytes;
  cv::imencode(".jpg", gray, bytes);
  cv::Mat out(16, 16, CV_8UC3);
  ASSERT_TRUE(decode_crop_resize(std::string(bytes.begin(), bytes.end()), {0, 0, 60, 40}, 16, 16,
                                 out.data, &error))
      << error;
  EXPECT_NEAR(cv::mean(out)[0], 90, 2);
  EXPECT_NEAR(cv::mean(out)[2], 90, 2);

  // CMYK JPEG, Adobe-inverted as Photoshop writes it: C=255-R... encodes pure red.
  jpeg_compress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  unsigned char* mem = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &mem, &size);
  cinfo.image_width = 32;
  cinfo.image_height = 32;
  cinfo.input_components = 4;
  cinfo.in_color_space = JCS_CMYK;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, 95, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  std::vector<uint8_t> row(32 * 4);
  for (int x = 0; x < 32; ++x) {  // inverted CMYK of red: C=255 (no cyan), M=0, Y=0, K=255
    row[x * 4 + 0] = 255, row[x * 4 + 1] = 0, row[x * 4 + 2] = 0, row[x * 4 + 3] = 255;
  }
  for (int y = 0; y < 32; ++y) {
    JSAMPROW r = row.data();
    jpeg_write_scanlines(&cinfo, &r, 1);
  }
  jpeg_finish_compress(&cinfo);
  const std::string cmyk(reinterpret_cast<char*>(mem), size);
  jpeg_destroy_compress(&cinfo);
  std::free(mem);
  ASSERT_TRUE(decode_crop_resize(cmyk, {0, 0, 32, 32}, 16, 16, out.data, &error)) << error;
  const cv::Scalar m = cv::mean(out);
  EXPECT_GT(m[0], 230);  // red
  EXPECT_LT(m[1], 25);
  EXPECT_LT(m[2], 25);

  const cv::Mat rgb = smooth_image(50, 30);
  const std::string png = encode(rgb, ".png");
  ImageSize s;
  ASSERT_TRUE(encoded_image_size(png, &s, &error));
  EXPECT_EQ(s.width, 50);
  cv::Mat full;
  ASSERT_TRUE(decode_full(png, &full, &error));
  EXPECT_EQ(mean_abs_diff(full, rgb), 0.0);
}

TEST(CropDecode, DamagedImagesAreErrorsNotCrashes) {
  const std::string jpeg = encode(smooth_image(120, 90));
  cv::Mat out(32, 32, CV_8UC3);
  std::string error;
  EXPECT_FALSE(decode_crop_resize(jpeg.substr(0, jpeg.size() / 2), {0, 0, 120, 90}, 32, 32,
                                  out.data, &error));
  EXPECT_NE(error.find("truncated"), std::string::npos) << error;
  EXPECT_FALSE(decode_crop_resize(jpeg.substr(0, 20), {0, 0, 120, 90}, 32, 32, out.data, &error));
  EXPECT_FALSE(decode_crop_resize("not an image", {0, 0, 1, 1}, 32, 32, out.data, &error));
  ImageSize s;
  EXPECT_FALSE(encoded_image_size("\xff\xd8\xff garbage", &s, &error));
  std::string corrupt = jpeg;
  for (size_t i = 200; i < corrupt.size() - 2; i += 7) corrupt[i] = char(0xFF);
  decode_crop_resize(corrupt, {0, 0, 120, 90}, 32, 32, out.data, &error);  // no crash either way
}

// transform_image with train_crop = distorted_bounding_box: that crop of the record's boxes,
// decoded and resized, then the flip, from the seed's first draws.
TEST(DistortedBoundingBoxCrop, TransformImageDecodesTheCropThenFlips) {
  const std::string jpeg = encode(smooth_image(500, 375));
  const std::vector<NormalisedBox> boxes = {{0.1f, 0.2f, 0.4f, 0.5f}};
  TransformOptions options;
  options.image_size = 48;
  options.train_crop = TrainCrop::kDistortedBoundingBox;
  for (uint64_t seed = 0; seed < 8; ++seed) {
    std::mt19937_64 rng(seed);
    const CropRect crop = distorted_bounding_box_crop({500, 375}, {boxes.data(), 1}, rng);
    const bool flip = (rng() >> 63) != 0;
    cv::Mat expected(48, 48, CV_8UC3), out(48, 48, CV_8UC3);
    std::string error;
    ASSERT_TRUE(decode_crop_resize(jpeg, crop, 48, 48, expected.data, &error)) << error;
    if (flip) cv::flip(expected, expected, 1);
    ASSERT_TRUE(transform_image(jpeg, options, seed, out.data, &error, {boxes.data(), 1})) << error;
    EXPECT_EQ(cv::norm(out, expected, cv::NORM_INF), 0) << "seed " << seed;
  }
}

// `encoded` with the width and height its header gives replaced (JPEG: the SOF0 marker's; PNG:
// IHDR's, its CRC left stale): the decoder must refuse them before it allocates the image.
std::string with_header_size(std::string encoded, uint32_t width, uint32_t height) {
  const bool png = encoded[0] == '\x89';
  const size_t at = png ? 16 : encoded.find("\xFF\xC0") + 5;  // SOF0: length, precision, H, W
  auto put = [&](size_t i, uint32_t v, int bytes) {
    for (int k = 0; k < bytes; ++k) encoded[i + k] = char(v >> (8 * (bytes - 1 - k)));
  };
  if (png) {
    put(at, width, 4);
    put(at + 4, height, 4);
  } else {
    put(at, height, 2);
    put(at + 2, width, 2);
  }
  return encoded;
}

TEST(CropDecode, HeadersOverThePixelLimitAreRefusedBeforeDecoding) {
  cv::Mat out(32, 32, CV_8UC3);
  std::string error;
  for (const char* ext : {".jpg", ".png"}) {
    const std::string normal = encode(smooth_image(120, 90), ext);
    EXPECT_TRUE(decode_crop_resize(normal, {0, 0, 120, 90}, 32, 32, out.data, &error)) << error;
    // 16384 x 16385 is one row over kMaxImagePixels (16384 x 16384); 40000 x 40000 a bomb (a
    // JPEG of 65535 x 65535 libjpeg refuses itself: its sides stop at 65500).
    // PNG's sides are 32-bit: 2^32 - 1 squared overflows a 64-bit product (found by
    // fuzz_image_decode).
    std::vector<std::pair<uint32_t, uint32_t>> claims = {{16384u, 16385u}, {40000u, 40000u}};
    if (std::string(ext) == ".png") claims.push_back({0xFFFFFFFFu, 0xFFFFFFFFu});
    for (const auto& [w, h] : claims) {
      const std::string crafted = with_header_size(normal, w, h);
      error.clear();
      EXPECT_FALSE(decode_crop_resize(crafted, {0, 0, 64, 64}, 32, 32, out.data, &error)) << ext;
      const std::string claim = std::to_string(w) + " x " + std::to_string(h);
      EXPECT_NE(error.find(claim), std::string::npos) << error;
      EXPECT_NE(error.find("over the limit of " + std::to_string(kMaxImagePixels)),
                std::string::npos)
          << error;
      cv::Mat full;
      EXPECT_FALSE(decode_full(crafted, &full, &error)) << ext;
      EXPECT_NE(error.find("over the limit"), std::string::npos) << error;
    }
  }
}

}  // namespace
}  // namespace trainer
