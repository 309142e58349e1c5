// Test helper for tests/data/test_augment_parity.py: runs one augmentation op, random erasing's
// fill, or prints a policy's magnitude tables, from data/transforms/augment_ops.h and
// data/transforms/augment_policy.h.
//   augment_parity_tool op NAME MAGNITUDE IN.png OUT.png [nearest|bilinear]
//   augment_parity_tool erase TOP LEFT HEIGHT WIDTH IN.png OUT.png
//   augment_parity_tool space POLICY HEIGHT WIDTH
//   augment_parity_tool boxcrop WIDTH HEIGHT COUNT SEED MIN_COVERED MIN_AREA MAX_AREA
//                       [XMIN YMIN XMAX YMAX]...
//   augment_parity_tool centre IN.jpg RESIZE CROP OUT.png
// `space` prints one line per op: NAME SIGNED BIN..., each bin as a C99 hex float (exact).
// `centre` decodes a JPEG as the evaluation does (data/transforms/augment.h: the shorter side to
// RESIZE, the centred CROP x CROP; decoded at a DCT scale, then resized), for tests of the resize.
// `boxcrop` prints COUNT crops of distorted_bounding_box_crop (data/transforms/augment.h), one
// per seed mix_seed(SEED, i), as "X Y WIDTH HEIGHT" lines; the other arguments keep the MLPerf
// reference's (aspect 0.75-1.33, 100 attempts).
// Images are RGB PNGs (OpenCV's BGR is converted at the edges).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <string>
#include <vector>

#include "base/seed.h"
#include "data/transforms/augment.h"
#include "data/transforms/augment_policy.h"

using namespace trainer;

namespace {

cv::Mat read_rgb(const std::string& path) {
  const cv::Mat bgr = cv::imread(path, cv::IMREAD_COLOR);
  if (bgr.empty()) throw std::runtime_error("cannot read " + path);
  cv::Mat rgb;
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  return rgb;  // continuous: cvtColor allocates a fresh matrix
}

void write_rgb(const std::string& path, const cv::Mat& rgb) {
  cv::Mat bgr;
  cv::cvtColor(rgb, bgr, cv::COLOR_RGB2BGR);
  if (!cv::imwrite(path, bgr)) throw std::runtime_error("cannot write " + path);
}

int usage() {
  std::cerr << "usage: augment_parity_tool op NAME MAGNITUDE IN OUT [nearest|bilinear]\n"
               "       augment_parity_tool erase TOP LEFT HEIGHT WIDTH IN OUT\n"
               "       augment_parity_tool space POLICY HEIGHT WIDTH\n"
               "       augment_parity_tool boxcrop W H COUNT SEED MIN_COVERED MIN_AREA MAX_AREA "
               "[XMIN YMIN XMAX YMAX]...\n"
               "       augment_parity_tool centre IN.jpg RESIZE CROP OUT\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "op" && (argc == 6 || argc == 7)) {
    AugmentOp op;
    if (!op_from_name(argv[2], &op)) {
      std::cerr << "unknown op " << argv[2] << "\n";
      return 2;
    }
    cv::Mat image = read_rgb(argv[4]);
    const bool bilinear = argc == 7 && std::string(argv[6]) == "bilinear";
    apply_augment_op(op, std::stod(argv[3]), image.data, image.rows, image.cols,
                     bilinear ? Interpolation::kBilinear : Interpolation::kNearest);
    write_rgb(argv[5], image);
    return 0;
  }
  if (mode == "erase" && argc == 8) {
    cv::Mat image = read_rgb(argv[6]);
    fill_rectangle(image.data, image.rows, image.cols, std::stoi(argv[2]), std::stoi(argv[3]),
                   std::stoi(argv[4]), std::stoi(argv[5]), kErasingColour);
    write_rgb(argv[7], image);
    return 0;
  }
  if (mode == "space" && argc == 5) {
    AutoAugmentPolicy policy;
    if (!policy_from_name(argv[2], &policy)) {
      std::cerr << "unknown policy " << argv[2] << "\n";
      return 2;
    }
    for (const OpMagnitudes& entry :
         augmentation_space(policy, std::stoi(argv[3]), std::stoi(argv[4]))) {
      std::printf("%s %d", op_name(entry.op), entry.is_signed ? 1 : 0);
      for (float bin : entry.bins) std::printf(" %a", double(bin));
      std::printf("\n");
    }
    return 0;
  }
  if (mode == "boxcrop" && argc >= 9 && (argc - 9) % 4 == 0) {
    const ImageSize image{std::stoi(argv[2]), std::stoi(argv[3])};
    const long count = std::stol(argv[4]);
    const uint64_t seed = std::stoull(argv[5]);
    DistortedBoxOptions options;
    options.min_object_covered = std::stof(argv[6]);
    options.min_area = std::stof(argv[7]);
    options.max_area = std::stof(argv[8]);
    std::vector<NormalisedBox> boxes;
    for (int i = 9; i < argc; i += 4)
      boxes.push_back({std::stof(argv[i]), std::stof(argv[i + 1]), std::stof(argv[i + 2]),
                       std::stof(argv[i + 3])});
    for (long i = 0; i < count; ++i) {
      std::mt19937_64 rng(mix_seed(seed, static_cast<uint64_t>(i)));
      const CropRect c =
          distorted_bounding_box_crop(image, {boxes.data(), boxes.size()}, rng, options);
      std::printf("%d %d %d %d\n", c.x, c.y, c.width, c.height);
    }
    return 0;
  }
  if (mode == "centre" && argc == 6) {
    std::ifstream in(argv[2], std::ios::binary);
    const std::string jpeg{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    TransformOptions options;
    options.training = false;
    options.val_resize = std::stoi(argv[3]);
    options.image_size = std::stoi(argv[4]);
    cv::Mat out(options.image_size, options.image_size, CV_8UC3);
    std::string error;
    if (!transform_image(jpeg, options, 0, out.data, &error)) {
      std::cerr << argv[2] << ": " << error << "\n";
      return 1;
    }
    write_rgb(argv[5], out);
    return 0;
  }
  return usage();
}
